"""The ingress's queue table (blitz.ingress.queues), no Ray: one queue per (pool, model),
bounded by the settings, merging what waits into one pool call, its refusals and depths
told to the observers, each result stamped with its wait and its call."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from blitz.encoders.base import Encoded
from blitz.errors import Overloaded
from blitz.hop_messages import EmbedJob
from blitz.ingress.queues import PoolQueues, QueueObservers, calls_in_flight, stamped
from blitz.settings.config import BlitzSettings

SETTINGS = {"models": [{"id": "m", "source": "fake:4"}, {"id": "n", "source": "fake:4"}]}


class Pool:
    """A pool call that records (pool, model, texts per job) and waits for ``gate``."""

    def __init__(self):
        self.calls: list[tuple[str, str, list[int]]] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self, pool, model_id, jobs):
        self.calls.append((pool, model_id, [len(job) for job in jobs]))
        started = time.perf_counter()
        return stamped(await self._run(jobs), started)  # as deployments' pool calls are

    async def _run(self, jobs):
        await self.gate.wait()
        return [Encoded(np.ones((len(job), 4), np.float32), np.ones(len(job), np.int64))
                for job in jobs]


def queues(pool, observers=None, **args) -> PoolQueues:
    return PoolQueues(BlitzSettings.from_args({**SETTINGS, **args}), pool, observers)


@pytest.mark.parametrize(("workers", "replicas", "calls"),
                         [(1, 1, 2), (4, 1, 4), (2, 3, 6), (1, 0, 2)])
def test_calls_in_flight_keep_each_replica_and_worker_busy(workers, replicas, calls):
    assert calls_in_flight(workers, replicas) == calls


def test_a_queue_is_bounded_by_the_pool_and_ingress_settings():
    q = queues(Pool(), cpu_pool={"max_batch_size": 8, "deployment": {
                   "autoscaling_config": {"min_replicas": 1, "max_replicas": 3}}},
               ingress={"max_queued_texts": 50, "pool_timeout_s": 7})
    batcher = q.batcher("cpu", "m")
    assert (batcher.max_batch, batcher.max_waiting, batcher.timeout_s) == (8, 50, 7)
    assert batcher.max_in_flight == calls_in_flight(1, 3)
    assert q.batcher("cpu", "m") is batcher  # made once
    assert q.batcher("cpu", "n") is not batcher and q.batcher("gpu", "m") is not batcher


async def test_jobs_that_wait_for_one_pool_and_model_become_one_call():
    pool = Pool()
    q = queues(pool)
    pool.gate.clear()
    bound = q.batcher("cpu", "m").max_in_flight
    held = [asyncio.ensure_future(q.submit("cpu", "m", EmbedJob(texts=["x"])))
            for _ in range(bound)]
    waiting = [asyncio.ensure_future(q.submit("cpu", "m", EmbedJob(texts=["a"] * k)))
               for k in (1, 2, 3)]
    other = asyncio.ensure_future(q.submit("cpu", "n", EmbedJob(texts=["b"])))
    for _ in range(10):
        await asyncio.sleep(0)
    pool.gate.set()
    results = await asyncio.gather(*held, *waiting, other)
    assert [len(r.values) for r in results] == [1] * bound + [1, 2, 3, 1]
    assert pool.calls == ([("cpu", "m", [1])] * bound + [("cpu", "n", [1])]
                          + [("cpu", "m", [1, 2, 3])])
    assert all(r.timings["ingress-queue"] >= 0.0 and r.timings["call"] >= 0.0
               for r in results)


async def test_a_full_queue_refuses_at_once_and_tells_the_observers():
    pool = Pool()
    seen: dict[str, list] = {"rejected": [], "waiting": [], "waited": []}
    observers = QueueObservers(
        rejected=lambda: seen["rejected"].append(1),
        waiting=lambda p, m: lambda units: seen["waiting"].append((p, m, units)),
        waited=lambda p: lambda level, s: seen["waited"].append((p, level)))
    q = queues(pool, observers, ingress={"max_queued_texts": 4})
    pool.gate.clear()
    held = [asyncio.ensure_future(q.submit("cpu", "m", EmbedJob(texts=["x"])))
            for _ in range(q.batcher("cpu", "m").max_in_flight)]
    queued = asyncio.ensure_future(q.submit("cpu", "m", EmbedJob(texts=["a", "b", "c"])))
    for _ in range(10):
        await asyncio.sleep(0)
    with pytest.raises(Overloaded):
        await q.submit("cpu", "m", EmbedJob(texts=["d", "e"]))
    assert seen["rejected"] == [1]
    assert ("cpu", "m", 3) in seen["waiting"]
    pool.gate.set()
    await asyncio.gather(*held, queued)
    assert seen["waited"] and {p for p, _ in seen["waited"]} == {"cpu"}


async def test_a_forgotten_model_loses_its_queues_only():
    q = queues(Pool())
    for key in (("cpu", "m"), ("gpu", "m"), ("cpu", "n")):
        q.batcher(*key)
    q.forget("m")
    assert q.keys() == [("cpu", "n")] and ("cpu", "m") not in q


def test_stamped_marks_when_the_call_began_and_its_round_trip():
    result = Encoded(np.ones((1, 4), np.float32), np.ones(1, np.int64))
    started = time.perf_counter()
    assert stamped([result], started) == [result]
    assert result.timings["call"] >= 0.0
