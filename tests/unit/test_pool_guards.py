"""A pool replica's logic without Serve (``blitz.pool.replica``, built through its own
constructor on a fake model): it creates nothing for a model id the registry does not
know, it runs and counts the jobs of one it does, reporting them through its events, and
it names its problem while its workers are all stuck."""

from __future__ import annotations

import asyncio
import gc
import threading

import numpy as np
import pytest

from blitz.encoders.base import Encoded
from blitz.errors import TimedOut, UnknownModel
from blitz.hop_messages import EmbedJob, RerankJob
from blitz.pool.replica import PoolEvents, PoolReplica
from blitz.settings.config import BlitzSettings
from blitz.settings.registry import ModelSpec
from tests.waiting import wait_until_async


@pytest.fixture
def heard() -> dict[str, list]:
    return {"loaded": [], "batch": [], "evicted": []}


def replica(heard: dict[str, list], call_timeout_s: float) -> PoolReplica:
    settings = BlitzSettings(models=[ModelSpec(id="known", source="fake:8")],
                             cpu_pool={"workers": 1, "call_timeout_s": call_timeout_s})
    events = PoolEvents(loaded=lambda model, _s: heard["loaded"].append(model),
                        batch=heard["batch"].append, evicted=heard["evicted"].append)
    return PoolReplica(settings, "cpu", events)


@pytest.fixture
def pool(heard) -> PoolReplica:
    # a deadline a busy CI machine cannot miss: these tests are about what runs, not when
    return replica(heard, call_timeout_s=60)


@pytest.fixture
def impatient_pool(heard) -> PoolReplica:
    # a worker counts as stuck after 0.2 s, so the test can hold one that long
    return replica(heard, call_timeout_s=0.2)


async def test_an_unknown_model_id_is_a_404_and_creates_nothing(pool):
    with pytest.raises(UnknownModel):
        await pool.run_jobs("no-such-model", [EmbedJob(texts=["x"]), EmbedJob(token_ids=[[1, 2]]),
                                              RerankJob(query="q", documents=["d"])])
    assert pool.batchers == {} and pool.loaded == []


async def test_jobs_for_a_known_model_run_and_are_counted_and_reported(pool, heard):
    first = await pool.run_jobs("known", [EmbedJob(texts=["a", "b"])])
    second = await pool.run_jobs("known", [EmbedJob(texts=["a"]), RerankJob(query="q",
                                                                            documents=["d"])])
    assert all(isinstance(r, Encoded) for r in first + second)
    assert np.allclose(first[0].values[0], second[0].values[0])  # one vector per text
    # no cache in front outside Serve: each batch loads (and then frees) its own copy
    assert heard["loaded"] and set(heard["loaded"]) == {"known"}
    assert sum(heard["batch"]) == 2 + 1 + 1  # a rerank job counts its documents
    stats = pool.stats()
    assert stats["texts_run"] == {"known": 4} and stats["batches_run"]["known"] >= 1
    assert stats["waiting_texts"] == {"known": 0} and stats["stuck_workers"] == 0


async def test_callers_loading_at_once_without_a_cache_never_share_an_encoder(pool):
    """Outside Serve (no LRU, no lock in front), two callers of one load would each wrap
    its encoder: the first holder dropped would free the model under the second's batch."""
    first, second = await asyncio.gather(pool.holder("known"), pool.holder("known"))
    assert first is not second
    with first.lease() as a, second.lease() as b:
        assert a is not b
    del first
    gc.collect()
    with second.lease() as encoder:  # still whole
        assert encoder.embed(["x"], normalize=True).values.shape == (1, 8)


async def test_a_problem_is_named_while_every_worker_is_stuck(impatient_pool):
    pool = impatient_pool
    release = threading.Event()
    assert pool.problem() is None
    with pytest.raises(TimedOut):
        await pool.workers.run(lambda: release.wait(10), 0.2)
    try:
        await wait_until_async(pool.workers.problem, "the worker to be reported stuck", 10,
                               interval_s=0.01)
        assert "worker threads are stuck" in (pool.problem() or "")
    finally:
        release.set()
    await wait_until_async(lambda: not pool.workers.busy, "the worker to come back", 10,
                           interval_s=0.01)
    assert pool.problem() is None
