"""The ingress's pool calls (deployments.ingress.ServeDispatcher) on fake handles, no Ray:
merged calls are never multiplied into per-request retries, a dead replica is retried
once and then answered 503, and what a replica raised reaches the client unchanged
(``as_blitz_error`` reads it from Ray's wrapper). A cold pool is woken by one call at a
time, and a handle whose replicas cannot be read counts as running."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from ray.exceptions import ActorDiedError, RayTaskError

from blitz.encoders.base import Encoded
from blitz.errors import (
    InputTooLong,
    InternalError,
    ModelLoadFailed,
    Overloaded,
    Unavailable,
    as_blitz_error,
)
from blitz.hop_messages import EmbedJob, RerankJob
from blitz.settings.config import BlitzSettings
from deployments.ingress import ServeDispatcher
from deployments.replicas import PoolWaker, running_replicas


class FakeHandle:
    """Stands in for a DeploymentHandle: ``options(...).run_jobs.remote(jobs)``."""

    deployment_name = "CPUPool"
    is_initialized = True

    def __init__(self, outcomes):
        self.outcomes = list(outcomes)  # per call: an exception to raise, or None to answer
        self.calls: list[int] = []  # jobs per call
        self.kinds: list[list[str]] = []  # the job kinds of each call
        self.gate: asyncio.Event | None = None

    def options(self, **_):
        return self

    @property
    def run_jobs(self):
        return self

    async def remote(self, jobs):
        self.calls.append(len(jobs))
        self.kinds.append([type(job).__name__ for job in jobs])
        if self.gate is not None:
            await self.gate.wait()
        outcome = self.outcomes.pop(0) if self.outcomes else None
        if outcome is not None:
            raise outcome
        return [InputTooLong.at(0, 999, 128) if getattr(job, "texts", None) == ["too long"] else
                Encoded(np.ones((len(job), 4), np.float32), np.ones(len(job), np.int64))
                for job in jobs]



def dispatcher(handle) -> ServeDispatcher:
    return ServeDispatcher(BlitzSettings.from_args({"models": [{"id": "m", "source": "fake:4"}]}),
                           {"cpu": handle})


async def _merged(handle, texts, rerank=()):
    """Fill every pool call the batcher allows in flight with one job each and hold them, then
    submit one job per text (and a rerank job per query in ``rerank``): those wait, and
    merge into one call. Returns the in-flight bound and every job's result."""
    handle.gate = asyncio.Event()
    d = dispatcher(handle)
    bound = d.queues.batcher("cpu", "m").max_in_flight
    first = asyncio.gather(*(d.submit("cpu", "m", EmbedJob(texts=[str(k)]))
                             for k in range(bound)))
    for _ in range(10):  # the held calls reach the handle
        await asyncio.sleep(0)
    rest = [asyncio.ensure_future(d.submit("cpu", "m", EmbedJob(texts=[t]))) for t in texts]
    rest += [asyncio.ensure_future(d.submit("cpu", "m", RerankJob(q, ["d1", "d2"])))
             for q in rerank]
    for _ in range(10):
        await asyncio.sleep(0)
    assert handle.calls == [1] * bound  # the bound holds: the rest wait at the ingress
    handle.gate.set()
    return bound, [*await first, *await asyncio.gather(*rest, return_exceptions=True)]


async def test_concurrent_jobs_merge_and_a_bad_one_fails_alone():
    handle = FakeHandle([])
    bound, results = await _merged(handle, ["a", "too long", "b"])
    assert handle.calls == [1] * bound + [3]  # the three that waited went as one call
    assert isinstance(results[bound + 1], InputTooLong)
    assert all(isinstance(r, Encoded) for i, r in enumerate(results) if i != bound + 1)


async def test_rerank_jobs_share_the_embedding_jobs_queue_and_calls():
    handle = FakeHandle([])
    bound, results = await _merged(handle, ["a", "b"], rerank=["q"])
    assert handle.calls == [1] * bound + [3]
    assert handle.kinds[-1] == ["EmbedJob", "EmbedJob", "RerankJob"]
    assert [len(r.values) for r in results[bound:]] == [1, 1, 2]


async def test_a_rerank_job_is_bounded_by_the_same_queue_as_embedding_jobs():
    handle = FakeHandle([])
    handle.gate = asyncio.Event()
    d = ServeDispatcher(BlitzSettings.from_args({"models": [{"id": "m", "source": "fake:4"}],
                                                 "ingress": {"max_queued_texts": 4}}),
                        {"cpu": handle})
    held = [asyncio.ensure_future(d.submit("cpu", "m", EmbedJob(texts=["x"])))
            for _ in range(d.queues.batcher("cpu", "m").max_in_flight)]
    queued = asyncio.ensure_future(d.submit("cpu", "m", EmbedJob(texts=["a", "b", "c"])))
    for _ in range(10):
        await asyncio.sleep(0)
    with pytest.raises(Overloaded):  # 3 texts wait; 2 documents more would pass the 4
        await d.submit("cpu", "m", RerankJob("q", ["d1", "d2"]))
    handle.gate.set()
    await asyncio.gather(*held, queued)
    assert len((await d.submit("cpu", "m", RerankJob("q", ["d1", "d2"]))).values) == 2


@pytest.mark.parametrize("error", [Overloaded("full"), ModelLoadFailed("gone", model="m")])
async def test_a_failed_merged_call_is_not_retried_per_request(error):
    bound = dispatcher(FakeHandle([])).queues.batcher("cpu", "m").max_in_flight
    handle = FakeHandle([None] * bound + [RayTaskError("run_jobs", "tb", error)])
    _, results = await _merged(handle, ["a", "b", "c"])
    assert handle.calls == [1] * bound + [3]  # no second round of three single calls
    assert all(isinstance(r, RayTaskError) for r in results[bound:])
    assert all(as_blitz_error(r) is error for r in results[bound:])


async def test_a_dead_replica_is_retried_once_then_answered_503():
    handle = FakeHandle([ActorDiedError()])
    result = await dispatcher(handle).submit("cpu", "m", EmbedJob(texts=["x"]))
    assert isinstance(result, Encoded) and handle.calls == [1, 1]

    handle = FakeHandle([ActorDiedError(), ActorDiedError()])
    with pytest.raises(Unavailable) as info:
        await dispatcher(handle).submit("cpu", "m", EmbedJob(texts=["x"]))
    assert info.value.status == 503 and info.value.retry_after_s and handle.calls == [1, 1]


async def test_an_unexpected_replica_error_is_a_500_without_its_text():
    handle = FakeHandle([RayTaskError("run_jobs", "tb", TypeError("'NoneType' is not "
                                                                     "callable"))])
    with pytest.raises(RayTaskError) as info:
        await dispatcher(handle).submit("cpu", "m", EmbedJob(texts=["x"]))
    error = as_blitz_error(info.value)
    assert isinstance(error, InternalError) and error.status == 500
    assert "NoneType" not in error.to_payload("rid")["error"]["message"]
    assert handle.calls == [1]  # what the replica raised is not retried


class StatsHandle:
    """Stands in for a cold pool's handle: ``stats.remote()`` waits for ``gate``, or fails."""

    deployment_name = "GPUPool"
    is_initialized = True  # and nothing of Ray's router inside

    def __init__(self, fail: bool = False):
        self.fail = fail
        self.calls = 0
        self.gate = asyncio.Event()

    @property
    def stats(self):
        return self

    async def remote(self):
        self.calls += 1
        if self.fail:
            raise ActorDiedError()
        await self.gate.wait()
        return {}


async def _settle():
    for _ in range(3):
        await asyncio.sleep(0)


async def test_a_cold_pool_is_woken_by_one_call_at_a_time():
    handle = StatsHandle()
    waker = PoolWaker({"gpu": handle}, timeout_s=60)
    for _ in range(3):
        waker.wake("gpu")
    await _settle()
    assert handle.calls == 1  # the queued call is Serve's demand; more add nothing
    handle.gate.set()  # a replica is up and answered
    await _settle()
    assert waker.waking == {}
    waker.wake("gpu")  # scaled to zero again later: woken again
    await _settle()
    assert handle.calls == 2


@pytest.mark.parametrize("fail", [True, False])
async def test_a_wake_that_fails_or_times_out_lets_the_next_request_wake_again(fail):
    handle = StatsHandle(fail=fail)  # fails at once, or never answers
    waker = PoolWaker({"gpu": handle}, timeout_s=0.01)
    waker.wake("gpu")
    await asyncio.wait_for(asyncio.shield(waker.waking["gpu"]), 5)
    assert waker.waking == {}
    waker.wake("gpu")
    await _settle()
    assert handle.calls == 2
    await asyncio.wait_for(asyncio.shield(waker.waking["gpu"]), 5)


def test_a_handle_whose_replicas_cannot_be_read_counts_as_running():
    # a Ray whose router is laid out otherwise: route as the table says, never to "cold"
    d = ServeDispatcher(BlitzSettings.from_args({"models": [{"id": "m", "source": "fake:4"}]}),
                        {"cpu": FakeHandle([]), "gpu": StatsHandle()})
    assert running_replicas(StatsHandle()) is None
    assert d.running_pools() == {"cpu", "gpu"}


class LocalPool:
    """Stands in for a CPU pool object inside the ingress (``ingress.cpu_pool: in_process``)."""

    def __init__(self):
        self.calls: list[tuple[str, int]] = []

    async def run_jobs_for(self, model_id, jobs):
        self.calls.append((model_id, len(jobs)))
        return [Encoded(np.full((len(job), 4), 2.0, np.float32), np.ones(len(job), np.int64))
                for job in jobs]


async def test_an_in_process_cpu_pool_is_called_here_and_the_gpu_pool_over_its_handle():
    from deployments.ingress import InProcessCpuDispatcher

    settings = BlitzSettings.from_args({"models": [{"id": "m", "source": "fake:4"}]})
    local, gpu = LocalPool(), FakeHandle([])
    d = InProcessCpuDispatcher(settings, local, {"gpu": gpu})
    assert d.pools == {"cpu", "gpu"}
    assert "cpu" in d.running_pools()  # it runs wherever the ingress runs

    cpu_result = await d.submit("cpu", "m", EmbedJob(texts=["a", "b"]))
    gpu_result = await d.submit("gpu", "m", EmbedJob(texts=["c"]))
    assert local.calls == [("m", 1)] and gpu.calls == [1]  # each pool got its own job
    assert cpu_result.values.shape == (2, 4) and float(cpu_result.values[0, 0]) == 2.0
    assert gpu_result.values.shape == (1, 4) and float(gpu_result.values[0, 0]) == 1.0
    assert "ingress-queue" in cpu_result.timings  # the hop is timed like a handle call
