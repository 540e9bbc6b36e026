"""The in-process ceiling (loadtest.inprocess): the encoder timed without a server."""

from __future__ import annotations

import threading
import time

from loadtest import inprocess
from loadtest.corpus import sentences


def test_inprocess_measures_the_blitz_encoder():
    rows = inprocess.run_inprocess(model_id="fake", source="fake:8", backend="torch",
                                   sizes=[1, 4], seconds=0.01, compare_raw=False)
    assert [(r.engine, r.texts_per_call) for r in rows] == [("blitz", 1), ("blitz", 4)]
    assert all(r.calls >= 3 for r in rows)
    assert "| blitz | torch | 4 |" in inprocess.markdown(rows)


def test_measure_times_each_call():
    pause = 0.005  # every call takes at least this long

    row = inprocess.measure(lambda texts: time.sleep(pause), sentences(10), 4, 0.1,
                            engine="e", backend="b")
    assert 5 <= row.ms_per_call_p50 < 250 and 5 <= row.ms_per_call_mean < 250
    assert row.seconds >= 0.1 and row.calls * pause <= row.seconds
    assert row.embeddings_per_s <= 4 / pause  # 4 texts per call


def test_measure_calls_with_corpus_batches():
    calls: list[list[str]] = []
    row = inprocess.measure(calls.append, sentences(10), 4, 0.0, engine="e", backend="b",
                            warmup_calls=1, min_calls=3)
    assert row.calls == 3 and [len(c) for c in calls] == [4, 4, 4, 4]
    assert calls[0] == sentences(4) and calls[2][:2] == sentences(10)[8:]


def test_measure_with_several_callers_calls_from_that_many_threads_at_once():

    seen: set[str] = set()  # thread names: a finished thread's ident can be reused
    row = inprocess.measure(lambda texts: seen.add(threading.current_thread().name),
                            sentences(10), 2,
                            0.0, engine="e", backend="b", warmup_calls=0, min_calls=3,
                            callers=3)
    assert row.callers == 3 and row.calls == 9 and row.embeddings == 18
    assert len(seen) == 3 and threading.current_thread().name not in seen
