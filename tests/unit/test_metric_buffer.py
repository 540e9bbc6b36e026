"""blitz.runtime.metric_buffer: counter sums, last gauge values and every histogram value, gathered
from any thread and recorded by one background thread; bounded; a refusing metric costs
the others nothing; a pickled buffer starts empty."""

from __future__ import annotations

import logging
import pickle
import threading
import time

import pytest

from blitz.runtime.metric_buffer import MetricBuffer


class Recorder:
    """A counter, a gauge and a histogram at once: each value handed to it, with the
    tags and the thread that handed it."""

    def __init__(self, fail_on: float | None = None):
        self.calls: list[tuple[str, float, dict]] = []
        self.threads: set[str] = set()
        self.fail_on = fail_on

    def inc(self, value=1.0, tags=None):
        self._take("inc", value, tags)

    def set(self, value, tags=None):
        self._take("set", value, tags)

    def observe(self, value, tags=None):
        self._take("observe", value, tags)

    def _take(self, how, value, tags):
        if value == self.fail_on:
            raise ValueError(f"refused {value}")
        self.threads.add(threading.current_thread().name)
        self.calls.append((how, value, tags))


A = {"route": "/embed", "model": "m"}
B = {"route": "/rerank", "model": "m"}


def wait_until(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "not recorded in time"
        time.sleep(0.01)


def test_nothing_is_recorded_by_the_caller_and_all_of_it_by_the_thread_once():
    buffer, counter, gauge, histogram = MetricBuffer(0.05), Recorder(), Recorder(), Recorder()
    for _ in range(3):
        buffer.inc(counter, 1, A)
    buffer.inc(counter, 5, B)
    for value in (7, 0, 4):
        buffer.set(gauge, value, A)
    for value in (0.1, 0.2, 0.3):
        buffer.observe(histogram, value, A)
    assert counter.calls == gauge.calls == histogram.calls == []  # the callers only gather
    wait_until(lambda: buffer.pending == 0 and len(histogram.calls) == 3)
    assert sorted(counter.calls, key=str) == sorted([("inc", 3, A), ("inc", 5, B)], key=str)
    assert gauge.calls == [("set", 4, A)]  # the last value set wins
    assert histogram.calls == [("observe", v, A) for v in (0.1, 0.2, 0.3)]  # every value
    assert counter.threads == gauge.threads == histogram.threads == {"blitz-metrics"}
    time.sleep(0.2)
    assert len(counter.calls) == 2  # recorded once, not again at every flush


def test_flush_records_at_once_on_the_calling_thread():
    buffer, counter = MetricBuffer(3600), Recorder()
    buffer.inc(counter, 2, A)
    buffer.flush()
    assert counter.calls == [("inc", 2, A)] and counter.threads == {"MainThread"}


def test_values_from_many_threads_are_all_counted():
    buffer, counter, histogram = MetricBuffer(3600), Recorder(), Recorder()

    def worker() -> None:
        for _ in range(500):
            buffer.inc(counter, 1, A)
            buffer.observe(histogram, 1.0, B)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    buffer.flush()
    assert counter.calls == [("inc", 4000, A)] and len(histogram.calls) == 4000


def test_the_tags_recorded_are_a_copy_the_caller_cannot_change_later():
    buffer, counter = MetricBuffer(3600), Recorder()
    tags = dict(A)
    buffer.inc(counter, 1, tags)
    tags["route"] = "changed"
    buffer.flush()
    assert counter.calls == [("inc", 1, A)]


def test_waiting_histogram_values_are_bounded_and_the_excess_counted():
    buffer, histogram = MetricBuffer(3600, max_values=3), Recorder()
    for value in range(5):
        buffer.observe(histogram, value, A)
    buffer.observe(histogram, 9, B)  # another label set has its own bound
    buffer.flush()
    assert [v for _, v, tags in histogram.calls if tags == A] == [0, 1, 2]
    assert [v for _, v, tags in histogram.calls if tags == B] == [9]
    assert buffer.dropped == 2


def test_a_metric_that_refuses_a_value_costs_the_others_nothing(caplog):
    buffer, bad, good = MetricBuffer(3600), Recorder(fail_on=2), Recorder()
    buffer.inc(bad, 2, A)
    buffer.inc(good, 1, A)
    buffer.set(good, 9, B)
    buffer.observe(good, 0.5, A)
    with caplog.at_level(logging.ERROR, logger="blitz.metrics"):
        buffer.flush()
    assert good.calls == [("inc", 1, A), ("set", 9, B), ("observe", 0.5, A)]
    assert "could not record a metric value" in caplog.text
    assert buffer.pending == 0


def test_a_pickled_buffer_arrives_empty_and_starts_its_own_thread():
    buffer, counter = MetricBuffer(0.05, max_values=7), Recorder()
    buffer.inc(counter, 1, A)
    copy = pickle.loads(pickle.dumps(buffer))
    assert (copy.interval_s, copy.max_values, copy.pending) == (0.05, 7, 0)
    copy.inc(counter, 2, B)
    wait_until(lambda: len(counter.calls) == 2)
    assert sorted(counter.calls, key=str) == sorted([("inc", 1, A), ("inc", 2, B)], key=str)


@pytest.mark.parametrize("interval_s, max_values", [(0, 10), (-1, 10), (1, 0)])
def test_the_settings_must_make_sense(interval_s, max_values):
    with pytest.raises(ValueError, match="interval_s must be positive"):
        MetricBuffer(interval_s, max_values)


def test_the_flusher_sleeps_until_a_value_comes_and_after_each_flush():
    buffer, counter = MetricBuffer(0.01), Recorder()
    assert not buffer.gathering  # nothing recorded yet: no thread, nothing to wake it
    buffer.inc(counter, 1, A)
    assert buffer.gathering  # the first value wakes the flusher
    wait_until(lambda: counter.calls == [("inc", 1, A)])
    assert not buffer.gathering  # flushed: it waits for the next value, not the clock
    buffer.inc(counter, 2, A)
    assert buffer.gathering
    wait_until(lambda: len(counter.calls) == 2)
    assert counter.calls[1] == ("inc", 2, A) and not buffer.gathering
