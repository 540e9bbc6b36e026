"""ModelPool's guards, on a pool object built without Serve (no replica, no Ray): it
creates nothing for a model id the registry does not know, and its health check fails
while its workers are all stuck."""

from __future__ import annotations

import threading

import pytest

from blitz.errors import TimedOut, UnknownModel
from blitz.pool.load_queue import LoadQueue
from blitz.pool.worker_slots import WorkerSlots
from blitz.schemas import EmbedJob, RerankJob
from blitz.settings.config import PoolSettings
from blitz.settings.registry import ModelSpec, Registry
from deployments import pool as pool_module
from tests.waiting import wait_until_async


@pytest.fixture
def pool(monkeypatch):
    """A ModelPool's state as ``__init__`` leaves it, minus models and Serve."""
    replica = object.__new__(pool_module.ModelPool.func_or_class)
    replica.pool = "cpu"
    replica.pool_settings = PoolSettings(call_timeout_s=0.2)
    replica.registry = Registry([ModelSpec(id="known", source="fake:8")])
    replica._batchers = {}
    replica.loaded = []
    replica.workers = WorkerSlots(1, stuck_after_s=0.2, name="test-pool")
    replica.loads = LoadQueue(deadline_s=10, name="test-pool-load")
    monkeypatch.setattr(pool_module.serve, "get_multiplexed_model_id", lambda: "no-such-model")
    return replica


async def test_an_unknown_model_id_is_a_404_and_creates_nothing(pool):
    with pytest.raises(UnknownModel):
        await pool.run_jobs([EmbedJob(texts=["x"]), EmbedJob(token_ids=[[1, 2]]),
                             RerankJob(query="q", documents=["d"])])
    assert pool._batchers == {} and pool.loaded == []


async def test_health_fails_while_every_worker_is_stuck(pool):
    release = threading.Event()
    await pool.check_health()
    with pytest.raises(TimedOut):
        await pool.workers.run(lambda: release.wait(10), 0.2)
    try:
        await wait_until_async(pool.workers.problem, "the worker to be reported stuck", 10,
                               interval_s=0.01)
        with pytest.raises(RuntimeError, match="worker threads are stuck"):
            await pool.check_health()
    finally:
        release.set()
    await wait_until_async(lambda: not pool.workers.busy, "the worker to come back", 10,
                           interval_s=0.01)
    await pool.check_health()
