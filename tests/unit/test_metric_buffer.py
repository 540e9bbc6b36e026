"""blitz.metric_buffer: counter sums and gauge values gathered on a loop, recorded once an
interval; recorded at once where no loop runs; nothing stuck when a loop closes."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from blitz.metric_buffer import MetricBuffer


class Recorder:
    """A counter and a gauge at once: each value it is handed, with its tags."""

    def __init__(self, fail_on: float | None = None):
        self.calls: list[tuple[str, float, dict]] = []
        self.fail_on = fail_on

    def inc(self, value=1.0, tags=None):
        self._take("inc", value, tags)

    def set(self, value, tags=None):
        self._take("set", value, tags)

    def _take(self, how, value, tags):
        if value == self.fail_on:
            raise ValueError(f"refused {value}")
        self.calls.append((how, value, tags))


A = {"route": "/embed", "model": "m"}
B = {"route": "/rerank", "model": "m"}


def test_with_no_running_loop_each_value_is_recorded_at_once():
    buffer, metric = MetricBuffer(60), Recorder()
    buffer.inc(metric, 2, A)
    buffer.set(metric, 7, B)
    assert metric.calls == [("inc", 2, A), ("set", 7, B)]
    assert buffer.pending == 0


async def test_on_a_loop_counters_are_summed_and_gauges_keep_their_last_value():
    buffer, counter, gauge = MetricBuffer(0.05), Recorder(), Recorder()
    for _ in range(3):
        buffer.inc(counter, 1, A)
    buffer.inc(counter, 5, B)
    for value in (7, 0, 4):
        buffer.set(gauge, value, A)
    assert counter.calls == gauge.calls == [] and buffer.pending == 3
    await asyncio.sleep(0.2)
    assert sorted(counter.calls, key=str) == sorted([("inc", 3, A), ("inc", 5, B)], key=str)
    assert gauge.calls == [("set", 4, A)]
    assert buffer.pending == 0


async def test_one_flush_per_interval_whatever_the_number_of_values():
    buffer, counter = MetricBuffer(0.05), Recorder()
    loop = asyncio.get_running_loop()
    scheduled = []
    original = loop.call_later

    def counting(delay, callback, *args, **kwargs):
        if callback == buffer.flush:  # asyncio.sleep uses call_later too
            scheduled.append(delay)
        return original(delay, callback, *args, **kwargs)

    loop.call_later = counting  # type: ignore[method-assign]
    try:
        for _ in range(1000):
            buffer.inc(counter, 1, A)
        await asyncio.sleep(0.2)
        buffer.inc(counter, 1, A)  # after a flush: the next interval's one flush
        await asyncio.sleep(0.2)
    finally:
        loop.call_later = original  # type: ignore[method-assign]
    assert scheduled == [0.05, 0.05]
    assert counter.calls == [("inc", 1000, A), ("inc", 1, A)]


async def test_the_tags_recorded_are_a_copy_the_caller_cannot_change_later():
    buffer, counter = MetricBuffer(0.05), Recorder()
    tags = dict(A)
    buffer.inc(counter, 1, tags)
    tags["route"] = "changed"
    buffer.flush()
    assert counter.calls == [("inc", 1, A)]


async def test_a_metric_that_refuses_a_value_costs_the_others_nothing(caplog):
    buffer, bad, good = MetricBuffer(60), Recorder(fail_on=2), Recorder()
    buffer.inc(bad, 2, A)
    buffer.inc(good, 1, A)
    buffer.set(good, 9, B)
    with caplog.at_level(logging.ERROR, logger="blitz.metrics"):
        buffer.flush()
    assert good.calls == [("inc", 1, A), ("set", 9, B)]
    assert "could not record a metric value" in caplog.text
    assert buffer.pending == 0


def test_values_left_by_a_loop_that_closed_are_recorded_by_the_next_loop():
    buffer, counter = MetricBuffer(0.05), Recorder()

    async def add_and_leave():
        buffer.inc(counter, 2, A)  # its flush is scheduled on this loop, which closes first

    async def add_and_wait():
        buffer.inc(counter, 3, A)
        await asyncio.sleep(0.2)

    asyncio.run(add_and_leave())
    assert counter.calls == [] and buffer.pending == 1
    asyncio.run(add_and_wait())  # not stuck behind the dead loop's flush
    assert counter.calls == [("inc", 5, A)]


async def test_threads_without_a_loop_record_at_once_beside_a_gathering_loop():
    buffer, counter = MetricBuffer(0.05), Recorder()
    buffer.inc(counter, 1, A)

    def from_a_worker_thread():
        for _ in range(100):
            buffer.inc(counter, 1, B)

    workers = [threading.Thread(target=from_a_worker_thread) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert counter.calls == [("inc", 1, B)] * 400
    await asyncio.sleep(0.2)
    assert counter.calls[-1] == ("inc", 1, A) and len(counter.calls) == 401


def test_the_interval_must_be_positive():
    with pytest.raises(ValueError, match="positive"):
        MetricBuffer(0)


async def test_a_pickled_buffer_arrives_empty_and_works():
    import pickle

    buffer, counter = MetricBuffer(0.05), Recorder()
    buffer.inc(counter, 1, A)
    copy = pickle.loads(pickle.dumps(buffer))
    assert copy.interval_s == 0.05 and copy.pending == 0 and buffer.pending == 1
    copy.inc(counter, 2, B)
    await asyncio.sleep(0.2)
    assert sorted(counter.calls, key=str) == sorted([("inc", 1, A), ("inc", 2, B)], key=str)
