"""The model table (blitz.admin): changes checked as a config's entries are, the watch a
replica follows it with, the file mirror, the load reports, the admin HTTP API over ASGI,
and Serve's LRU taught pins (deployments.serve_lru.PinnedLru) on a stand-in of it."""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict

import numpy as np
import pytest

from blitz.admin.listing import listing
from blitz.admin.store import CHANGED, FileMirror, MemoryStore
from blitz.admin.table import MAX_PINNED, ModelAdmin
from blitz.admin.watch import (
    FIRST_TABLE_S,
    FORGOTTEN_S,
    STALE_S,
    LoadReport,
    ModelWatch,
    load_states,
)
from blitz.errors import Conflict, InvalidValue, UnknownModel
from blitz.ingress.service import EmbeddingService
from blitz.pool.dispatcher import ReplicaDispatcher
from blitz.settings.config import BlitzSettings
from tests.api_client import api_client

KEY = "admin-secret"


def settings(**admin) -> BlitzSettings:
    """Two fake models; the admin API may add fakes and folders (``admin`` overrides)."""
    return BlitzSettings.from_args({
        "models": [{"id": "base", "source": "fake:8"}, {"id": "other", "source": "fake:4"}],
        "admin": {"allowed_sources": ["fake:", "/"], **admin}})


def test_a_model_is_added_pinned_evicted_and_removed():
    store = MemoryStore()
    admin = ModelAdmin(settings(), store)
    entry = admin.add({"id": "new", "source": "fake:16"}, pin=True)
    assert entry.pinned and entry.spec == {"id": "new", "source": "fake:16"}
    assert set(admin.entries()) == {"new"} and store.get(CHANGED)
    evicted = admin.evict("new")
    assert (evicted.evictions, evicted.pinned) == (1, False)  # an evict drops the pin
    assert admin.pin("base").pinned  # a config model can be pinned...
    assert admin.evict("base").evictions == 1  # ...and evicted
    with pytest.raises(Conflict, match="in the config"):
        admin.remove("base")  # but not removed
    admin.remove("new")
    assert set(admin.entries()) == {"base"}  # the config model's pin/evict entry stays
    with pytest.raises(UnknownModel):
        admin.remove("new")
    with pytest.raises(UnknownModel):
        admin.pin("never")


def test_an_added_model_is_checked_as_the_configs_are(tmp_path):
    admin = ModelAdmin(settings(), MemoryStore())
    with pytest.raises(Conflict, match="from the config"):
        admin.add({"id": "base", "source": "fake:8"})
    admin.add({"id": "new", "source": "fake:8"})
    with pytest.raises(Conflict, match="from the admin API"):
        admin.add({"id": "new", "source": "fake:4"})
    with pytest.raises(InvalidValue, match="kind"):
        admin.add({"id": "x", "source": "fake:8", "kind": "telepathy"})
    with pytest.raises(InvalidValue, match="extra|Extra"):
        admin.add({"id": "x", "source": "fake:8", "colour": "red"})
    with pytest.raises(InvalidValue, match="torch"):  # a spec validator's check
        admin.add({"id": "x", "source": str(tmp_path), "kind": "sparse",
                   "cpu_backend": "onnx"})
    with pytest.raises(InvalidValue, match="model entry"):
        admin.add(["not", "an", "object"])  # type: ignore[arg-type]
    with pytest.raises(InvalidValue):  # a local source that is not there
        admin.add({"id": "x", "source": str(tmp_path / "missing")})
    code = tmp_path / "code"
    code.mkdir()
    (code / "config.json").write_text(json.dumps({"auto_map": {"AutoModel": "m.Model"}}))
    with pytest.raises(InvalidValue, match="trust_remote_code"):  # the trust check, at once
        admin.add({"id": "x", "source": str(code)})
    assert set(admin.entries()) == {"new"}  # nothing refused was written


def test_pins_leave_a_replica_one_slot():
    admin = ModelAdmin(settings(), MemoryStore())
    for i in range(MAX_PINNED):
        admin.add({"id": f"m{i}", "source": "fake:8"}, pin=True)
    with pytest.raises(Conflict, match="unpin one first"):
        admin.pin("base")
    with pytest.raises(Conflict):
        admin.add({"id": "late", "source": "fake:8"}, pin=True)
    admin.pin("m0", False)
    assert admin.pin("base").pinned


def test_a_replica_follows_the_table():
    store = MemoryStore()
    admin = ModelAdmin(settings(), store)
    registry = settings().registry()
    watch = ModelWatch(store, registry)
    first = watch.poll()
    assert first is not None and first.evict == set() and "new" not in registry
    assert watch.poll() is None  # the token did not change: nothing read
    admin.add({"id": "new", "source": "fake:16"}, pin=True)
    changes = watch.poll()
    assert changes is not None and registry.get("new").source == "fake:16"
    assert changes.pinned == {"new"} and changes.evict == set()
    admin.evict("base")
    changes = watch.poll()
    assert changes is not None and changes.evict == {"base"} and changes.pinned == {"new"}
    admin.remove("new")
    admin.add({"id": "new", "source": "fake:32"})  # the same id, another model
    changes = watch.poll()
    assert changes is not None and changes.respecified == {"new"} and changes.evict == {"new"}
    admin.remove("new")
    changes = watch.poll()
    assert changes is not None and changes.evict == {"new"} and "new" not in registry
    assert "base" in registry  # the config's stay whatever the table says


def test_with_the_admin_api_off_a_replica_looks_for_a_first_table_seldom():
    store = MemoryStore()
    watch = ModelWatch(store, settings().registry())
    watch.poll()  # no table yet
    assert watch.poll_every(1.0, admin_on=False) == FIRST_TABLE_S > 1.0
    assert watch.poll_every(1.0, admin_on=True) == 1.0  # an admin key: every poll_s
    assert watch.poll_every(90.0, admin_on=False) == 90.0  # never shorter than poll_s
    ModelAdmin(settings(), store).add({"id": "new", "source": "fake:16"})  # a handle's call
    assert watch.poll() is not None
    assert watch.poll_every(1.0, admin_on=False) == 1.0  # a table exists: every poll_s
    assert FIRST_TABLE_S < STALE_S  # a pool's load report, written each look, stays shown


def test_a_replica_that_starts_after_an_evict_evicts_nothing():
    store = MemoryStore()
    admin = ModelAdmin(settings(), store)
    admin.evict("base")
    changes = ModelWatch(store, settings().registry()).poll()
    assert changes is not None and changes.evict == set()


def test_the_file_mirror_keeps_the_table_across_an_empty_store(tmp_path):
    path = tmp_path / "models.json"
    admin = ModelAdmin(settings(), MemoryStore(), FileMirror(path))
    admin.add({"id": "new", "source": "fake:16"}, pin=True)
    assert json.loads(path.read_text())["models"]["new"]["pinned"] is True
    fresh = MemoryStore()  # Ray restarted: its GCS is empty
    assert FileMirror(path).restore(fresh) == 1
    assert ModelAdmin(settings(), fresh).entries()["new"].spec == {"id": "new",
                                                                   "source": "fake:16"}
    assert FileMirror(path).restore(fresh) == 0  # a store with entries is left alone
    assert not list(tmp_path.glob(".models.json.*"))  # no temporary file left


def test_the_file_mirror_never_overwrites_a_file_it_did_not_write(tmp_path):
    path = tmp_path / "notes.json"
    path.write_text('{"mine": true}')
    admin = ModelAdmin(settings(), MemoryStore(), FileMirror(path))
    with pytest.raises(ValueError, match="not a model table"):
        admin.add({"id": "new", "source": "fake:16"})
    assert path.read_text() == '{"mine": true}'


def test_load_reports_show_live_replicas_and_forget_dead_ones():
    store = MemoryStore()
    clock = [1000.0]
    report = LoadReport(store, "cpu", "r1", clock=lambda: clock[0])
    assert report.write({"base": {"state": "loaded"}})
    assert not report.write({"base": {"state": "loaded"}})  # unchanged: not written again
    assert [r["replica"] for r in load_states(store, now=1000.0)] == ["r1"]
    assert load_states(store, now=1000.0 + STALE_S + 1) == []  # stale: not shown
    assert store.keys("replicas/")
    load_states(store, now=1000.0 + FORGOTTEN_S + 1)
    assert store.keys("replicas/") == []  # long dead: deleted
    report.write({"base": {"state": "loading"}})
    report.close()
    assert store.keys("replicas/") == []


def test_the_listing_joins_entries_and_replicas():
    store = MemoryStore()
    admin = ModelAdmin(settings(), store)
    admin.add({"id": "new", "source": "fake:16"}, pin=True)
    LoadReport(store, "cpu", "r1").write({"new": {"state": "loading", "seconds": 1.5}})
    rows = {row["id"]: row for row in listing(admin)}
    assert list(rows) == ["base", "other", "new"]
    assert rows["new"]["from"] == "admin" and rows["new"]["pinned"]
    assert rows["new"]["replicas"] == [{"pool": "cpu", "replica": "r1", "state": "loading",
                                        "seconds": 1.5}]
    assert rows["base"]["replicas"][0]["state"] == "not loaded"


async def admin_client(config: BlitzSettings, store: MemoryStore):
    dispatcher = ReplicaDispatcher(config)
    service = EmbeddingService(config, dispatcher)
    service.registry = dispatcher.registry  # one registry: the local pool serves what it does
    admin = ModelAdmin(config, store)
    watch = ModelWatch(store, service.registry)
    admin.on_change = watch.poll  # as the ingress's follower does
    return api_client(service, admin=admin)


async def test_the_admin_http_api_needs_its_own_key():
    async with await admin_client(settings(), MemoryStore()) as client:
        off = await client.get("/admin/models")
    assert off.status_code == 403 and "admin.api_keys" in off.json()["error"]["message"]
    async with await admin_client(settings(api_keys=[KEY]), MemoryStore()) as client:
        none = await client.get("/admin/models")
        wrong = await client.get("/admin/models", headers={"authorization": "Bearer nope"})
        right = await client.get("/admin/models", headers={"authorization": f"Bearer {KEY}"})
    assert none.status_code == 401 and wrong.status_code == 401
    assert right.status_code == 200 and [m["id"] for m in right.json()["models"]] == [
        "base", "other"]


async def test_a_model_added_over_http_is_served_then_removed():
    store = MemoryStore()
    headers = {"authorization": f"Bearer {KEY}"}
    async with await admin_client(settings(api_keys=[KEY]), store) as client:
        before = await client.post("/embed", json={"model": "new", "texts": ["a"]})
        added = await client.post("/admin/models", headers=headers,
                                  json={"model": {"id": "new", "source": "fake:16"}})
        embedded = await client.post("/embed", json={"model": "new", "texts": ["a"]},
                                     headers={"accept": "application/json"})
        listed = await client.get("/models")
        again = await client.post("/admin/models", headers=headers,
                                  json={"model": {"id": "new", "source": "fake:16"}})
        bad = await client.post("/admin/models", headers=headers, json={"pin": True})
        pinned = await client.post("/admin/models/new/pin", headers=headers)
        unknown_action = await client.post("/admin/models/new/explode", headers=headers)
        removed = await client.delete("/admin/models/new", headers=headers)
        after = await client.post("/embed", json={"model": "new", "texts": ["a"]})
        config = await client.delete("/admin/models/base", headers=headers)
    assert before.status_code == 404
    assert added.status_code == 201, added.text
    assert added.json() == {"id": "new", "from": "admin", "pinned": False, "evictions": 0,
                            "model": {"id": "new", "source": "fake:16"}}
    assert embedded.status_code == 200, embedded.text
    assert np.asarray(embedded.json()["embeddings"]).shape == (1, 16)
    assert "new" in [m["id"] for m in listed.json()["data"]]
    assert again.status_code == 409 and again.json()["error"]["code"] == "conflict"
    assert bad.status_code == 422 and bad.json()["error"]["param"] == "model"
    assert pinned.status_code == 200 and pinned.json()["pinned"] is True
    assert unknown_action.status_code == 422
    assert removed.status_code == 200 and after.status_code == 404
    assert config.status_code == 409


class StandInLru:
    """Serve's _ModelMultiplexWrapper as far as PinnedLru uses it (Ray 2.60)."""

    _PUSH_MULTIPLEXED_MODEL_IDS_TASK_NAME = "push_model_ids"

    def __init__(self, ids):
        self.models = OrderedDict((i, object()) for i in ids)
        self._model_cache_lock = asyncio.Lock()
        self._push_multiplexed_replica_info = False
        self._model_load_tasks: set[str] = set()
        self.unloaded: list[str] = []
        self.pushed: list[list[str]] = []  # the ids each push told the controller
        self.metrics_pusher = StandInPusher(self._push_model_ids_info)

    def _push_model_ids_info(self):
        if self._push_multiplexed_replica_info:
            self.pushed.append([*self.models, *self._model_load_tasks])
            self._push_multiplexed_replica_info = False

    async def unload_model_lru(self):
        model_id, _ = self.models.popitem(last=False)
        self.unloaded.append(model_id)


class StandInPusher:
    """Serve's MetricsPusher: each task's function and its period."""

    def __init__(self, push):
        self.tasks = {StandInLru._PUSH_MULTIPLEXED_MODEL_IDS_TASK_NAME: (push, 0.1)}

    def register_or_update_task(self, name, function, interval_s):
        self.tasks[name] = (function, interval_s)

    def tick(self):
        self.tasks[StandInLru._PUSH_MULTIPLEXED_MODEL_IDS_TASK_NAME][0]()

    @property
    def every_s(self):
        return self.tasks[StandInLru._PUSH_MULTIPLEXED_MODEL_IDS_TASK_NAME][1]


def test_model_ids_are_pushed_at_once_and_every_second_while_nothing_changes():
    from deployments.serve_lru import MODEL_IDS_BUSY_S, MODEL_IDS_IDLE_S, PinnedLru

    lru = StandInLru([])
    lru._push_multiplexed_replica_info = True  # what Serve does as a load begins
    lru._model_load_tasks.add("a")
    pins = PinnedLru(lru, set)  # made by the first load, and pushes its id at once
    assert lru.pushed == [["a"]] and lru.metrics_pusher.every_s == MODEL_IDS_BUSY_S
    lru._model_load_tasks.clear()
    lru.models["a"] = object()  # loaded
    lru.metrics_pusher.tick()  # Serve's task, through the pins
    assert lru.metrics_pusher.every_s == MODEL_IDS_IDLE_S == 10 * MODEL_IDS_BUSY_S  # idle
    lru._push_multiplexed_replica_info = True  # a second load begins
    lru._model_load_tasks.add("b")
    pins.push_model_ids()  # what the pool's loader does first
    assert lru.pushed[-1] == ["a", "b"] and lru.metrics_pusher.every_s == MODEL_IDS_BUSY_S


async def test_serves_lru_passes_over_pinned_models_and_evicts_by_id():
    from deployments.serve_lru import PinnedLru

    lru = StandInLru(["a", "b", "c"])
    pins = PinnedLru(lru, lambda: {"a"})
    assert pins.unpinned() == ["b", "c"]
    await lru.unload_model_lru()  # what Serve calls: now through the pins
    assert lru.unloaded == ["b"] and list(lru.models) == ["c", "a"]
    assert await pins.evict("a") and lru.unloaded == ["b", "a"]
    assert lru.pushed[-1] == ["c"]  # routing learns it at once
    assert not await pins.evict("gone")


async def test_a_pool_replica_reads_the_table_when_a_job_names_a_model_it_does_not_know():
    from blitz.hop_messages import EmbedJob
    from blitz.pool.replica import PoolReplica

    store = MemoryStore()
    config = settings()
    registry = config.registry()
    watch = ModelWatch(store, registry)
    reads = []

    class Table:  # the model table the replica follows (blitz.pool.model_set.ModelTable)
        pinned: set[str] = set()

        async def refresh(self):
            reads.append(watch.poll())

    replica = PoolReplica(config, "cpu", table=Table(), registry=registry)
    ModelAdmin(settings(), store).add({"id": "new", "source": "fake:16"})
    result = (await replica.run_jobs("new", [EmbedJob(texts=["a"])]))[0]
    assert result.values.shape == (1, 16) and len(reads) == 1
    await replica.run_jobs("new", [EmbedJob(texts=["b"])])
    assert len(reads) == 1  # known now: no second read
    with pytest.raises(UnknownModel):
        await replica.run_jobs("never", [EmbedJob(texts=["a"])])
