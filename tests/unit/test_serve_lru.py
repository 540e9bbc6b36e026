"""Serve's multiplexed LRU as a pool replica's model cache (``deployments/serve_lru.py``),
without starting Ray: Serve's own ``_ModelMultiplexWrapper`` (``ray/serve/multiplex.py``,
made by ``@serve.multiplexed`` on the first call) in front of a real ``ModelSet`` on fake
models, wired as ``deployments/pool.py`` wires it (``ServeModels`` given at construction,
``taught`` as each load begins).

Two of Serve's calls need a running Serve and are stood in for: the replica context the
wrapper reads its app, deployment and replica id from (``_get_internal_replica_context``),
and the controller client it pushes the replica's model ids to
(``_get_global_client().record_request_routing_info``), recorded here so the pushes can be
checked. Everything else is Serve's code as installed, its push task included (a
``MetricsPusher`` task on the test's own event loop, cancelled as that loop closes). Serve's
wrapper pushes only when its ``_push_multiplexed_replica_info`` flag is set (a load
began, or an eviction), so the ids recorded are those routing would be told.

A load is held mid-way by the test's loader waiting on an ``asyncio.Event`` (no sleeps):
eviction by id waits on Serve's ``_model_cache_lock`` until it ends."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from ray import serve
from ray.serve import multiplex

from blitz.errors import ModelTooLarge
from blitz.pool.holder import ModelHolder
from blitz.pool.replica import PoolReplica
from blitz.settings.config import BlitzSettings
from blitz.settings.registry import ModelSpec
from deployments.serve_lru import SERVE_LRU, ServeModels
from tests.waiting import wait_until_async

MAX_MODELS = 2


class Controller:
    """Where Serve pushes a replica's model ids (routing learns them from it)."""

    def __init__(self) -> None:
        self.pushed: list[set[str]] = []

    def record_request_routing_info(self, info: Any) -> None:
        self.pushed.append(set(info.multiplexed_model_ids))


@pytest.fixture
def controller(monkeypatch) -> Controller:
    controller = Controller()
    context = SimpleNamespace(app_name="blitz", deployment="ModelPool", replica_id="r1")
    monkeypatch.setattr(multiplex, "_get_internal_replica_context", lambda: context)
    monkeypatch.setattr(multiplex, "_get_global_client", lambda: controller)
    return controller


class Pool:
    """A pool replica's Serve side as deployments/pool.py builds it: Serve's LRU (its
    multiplexed loader) as the model set's cache, pins from the model table."""

    def __init__(self, ids: list[str]):
        self.pinned: set[str] = set()
        self.loads: list[str] = []
        self.gate: asyncio.Event | None = None  # set: each load waits for it mid-way
        self.lru = ServeModels(self, self.get_model, lambda: self.pinned)
        settings = BlitzSettings(models=[ModelSpec(id=i, source="fake:8") for i in ids],
                                 cpu_pool={"workers": 1})
        self.replica = PoolReplica(settings, "cpu", cache=self.lru)

    @serve.multiplexed(max_num_models_per_replica=MAX_MODELS)
    async def get_model(self, model_id: str) -> ModelHolder:
        self.lru.taught()
        self.loads.append(model_id)
        if self.gate is not None:
            await self.gate.wait()
        return await self.replica.models.load(model_id)

    def serve_lru(self) -> Any:
        """Serve's ``_ModelMultiplexWrapper`` (made at the first load)."""
        return getattr(self, SERVE_LRU)

    def resident(self) -> list[str]:
        """Serve's LRU, least recently used first."""
        return list(self.serve_lru().models)

    async def holder(self, model_id: str) -> ModelHolder:
        return await self.replica.models.holder(model_id)


async def test_serves_lru_loads_once_and_answers_a_resident_model_from_memory(controller):
    pool = Pool(["a", "b"])
    assert pool.lru.evictable() == [] and await pool.lru.evict("a") is False  # no LRU yet
    first = await pool.holder("a")
    assert await pool.holder("a") is first and pool.loads == ["a"]
    assert pool.resident() == ["a"] and pool.replica.models.loaded == ["a"]
    # Serve's LRU was taught pins at the first load, which also pushed the ids at once
    assert pool.lru.pins is not None and controller.pushed and "a" in controller.pushed[-1]


async def test_the_least_recently_used_unpinned_model_is_the_victim(controller):
    pool = Pool(["a", "b", "c"])
    await pool.holder("a")
    await pool.holder("b")
    await pool.holder("a")  # b is now the least recently used
    assert pool.lru.evictable() == ["b", "a"]
    pool.pinned = {"b"}
    assert pool.lru.evictable() == ["a"]
    await pool.holder("c")  # past MAX_MODELS: Serve evicts, but never the pinned b
    assert pool.resident() == ["b", "c"] and pool.replica.evicted == ["a"]
    assert pool.replica.models.loaded == ["b", "c"]
    assert pool.lru.evictable() == ["c"]
    assert controller.pushed[-1] == {"b", "c"}  # routing told: a gone, c loading


async def test_every_slot_pinned_refuses_the_load_and_evicts_nothing(controller):
    pool = Pool(["a", "b", "c"])
    await pool.holder("a")
    await pool.holder("b")
    pool.pinned = {"a", "b"}
    with pytest.raises(ModelTooLarge) as refused:
        await pool.holder("c")
    assert refused.value.status == 507
    assert pool.resident() == ["a", "b"] and pool.replica.evicted == []


async def test_eviction_by_id_goes_through_serves_lru_and_tells_routing(controller):
    pool = Pool(["a", "b"])
    await pool.holder("a")
    await pool.holder("b")
    assert await pool.lru.evict("c") is False  # not resident: nothing happens
    pushes = len(controller.pushed)
    assert await pool.lru.evict("b") is True
    assert pool.resident() == ["a"] and pool.replica.evicted == ["b"]
    assert len(controller.pushed) > pushes and controller.pushed[-1] == {"a"}
    assert await pool.lru.evict("b") is False
    await pool.holder("b")  # loads again, through Serve's LRU
    assert pool.loads == ["a", "b", "b"] and pool.resident() == ["a", "b"]


async def test_a_load_is_pushed_as_it_begins_and_never_evicted_from_under(controller):
    pool = Pool(["a", "b"])
    await pool.holder("a")
    pool.gate = asyncio.Event()
    loading = asyncio.create_task(pool.holder("b"))
    await wait_until_async(lambda: pool.loads == ["a", "b"], "the load of b to begin")
    # routing learns b as its load begins, before it is resident
    assert controller.pushed[-1] == {"a", "b"} and pool.resident() == ["a"]
    evicting = asyncio.create_task(pool.lru.evict("a"))
    lock = pool.serve_lru()._model_cache_lock  # the load holds it
    await wait_until_async(lambda: lock._waiters or evicting.done(),
                           "the eviction to wait on Serve's lock")
    assert not evicting.done() and pool.resident() == ["a"] and pool.replica.evicted == []
    pool.gate.set()
    holder = await loading
    assert await evicting is True  # after the load, not during it
    assert pool.resident() == ["b"] and pool.replica.evicted == ["a"]
    assert await pool.holder("b") is holder and controller.pushed[-1] == {"b"}
