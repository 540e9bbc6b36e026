"""The model table's Ray side: its store (Ray's GCS key-value store, one namespace per
Serve application) and the loops that make each replica follow it.

Why the GCS: every replica on every node reads the same table without a shared file, it
outlives replica restarts and `serve deploy` rollouts, and where the GCS is fault tolerant
(KubeRay's external Redis) a head restart too. A restart of Ray itself empties it:
``admin.models_file`` keeps a copy that the ingress puts back (``blitz.admin.store``).

A pool replica follows the table with Serve's multiplexed LRU (``PinnedLru``): a pinned
model is loaded at once and never the LRU's victim; an evicted, removed or re-specified
one is unloaded at once (calls holding it finish first: ``blitz.pool.holder``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

from ray import serve
from ray.experimental.internal_kv import (
    _internal_kv_del,
    _internal_kv_get,
    _internal_kv_list,
    _internal_kv_put,
)

from blitz.admin.listing import entry_row, listing
from blitz.admin.store import FileMirror
from blitz.admin.table import ModelAdmin
from blitz.admin.watch import Changes, LoadReport, ModelWatch, PinRetries
from blitz.errors import ModelTooLarge
from blitz.settings.config import BlitzSettings
from blitz.settings.registry import Registry

logger = logging.getLogger("ray.serve")
NAMESPACE = "blitz-models"
# Serve pushes a pool replica's model ids to its controller every 0.1 s (its multiplexed
# LRU's task, PUSH_MULTIPLEXED_MODEL_IDS_INTERVAL_S), idle or not: PinnedLru keeps that
# pace only while a load runs or a change waits to be pushed, and pushes a load's ids at
# its start itself; otherwise once every MODEL_IDS_IDLE_S (the gauges it sets with them).
MODEL_IDS_BUSY_S = 0.1
MODEL_IDS_IDLE_S = 1.0


class GcsStore:
    """``blitz.admin.store.Store`` over Ray's GCS key-value store (blocking calls)."""

    def __init__(self, app: str):
        # no ':' in a namespace: the GCS would hand keys back with the part after it
        self.namespace = f"{NAMESPACE}-{quote(app, safe='')}"

    def get(self, key: str) -> bytes | None:
        return _internal_kv_get(key, namespace=self.namespace)

    def put(self, key: str, value: bytes) -> None:
        _internal_kv_put(key, value, overwrite=True, namespace=self.namespace)

    def delete(self, key: str) -> None:
        _internal_kv_del(key, namespace=self.namespace)

    def keys(self, prefix: str) -> list[str]:
        return sorted(k.decode() for k in _internal_kv_list(prefix, namespace=self.namespace))

    def add(self, key: str, value: bytes) -> bool:
        """Put only if absent, in the GCS (atomic: of two writers one wins)."""
        return not _internal_kv_put(key, value, overwrite=False, namespace=self.namespace)


def app_name() -> str:
    try:
        return serve.get_replica_context().app_name
    except Exception:  # outside a replica (tests): the default app's name
        return "blitz"


def replica_name() -> str:
    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:
        return "local"


def model_admin(settings: BlitzSettings) -> ModelAdmin:
    """The ingress's admin: the app's table, mirrored to ``admin.models_file`` when set
    (whose table goes back into the store first when the store's is older: a restart of
    Ray emptied it)."""
    store = GcsStore(app_name())
    path = settings.admin.models_file
    mirror = FileMirror(path) if path else None
    if mirror is not None:
        mirror.restore(store)
    return ModelAdmin(settings, store, mirror)


async def follow(watch: ModelWatch, every_s: float, admin_on: bool,
                 changed: Callable[[Changes], Awaitable[None]],
                 tick: Callable[[], Awaitable[None]] | None = None) -> None:
    """Forever: read the table when its token changed and hand the changes to ``changed``;
    then ``tick``; then wait ``watch.poll_every`` (``every_s``, or longer while the admin
    API is off and no table exists). A failure is logged and the loop goes on (the GCS may
    be restarting)."""
    failed = False
    while True:
        try:
            changes = watch.apply(await asyncio.to_thread(watch.read))
            if changes is not None:
                await changed(changes)
            if tick is not None:
                await tick()
            failed = False
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - logged once per run of failures
            if not failed:
                logger.warning("model table: %s: %s (retrying every %.1f s)",
                               type(exc).__name__, exc, every_s)
            failed = True
        await asyncio.sleep(watch.poll_every(every_s, admin_on))


class PinnedLru:
    """Serve's multiplexed LRU of one pool replica (``SERVE_LRU``: an OrderedDict
    ``models`` least recent first, ``unload_model_lru``, ``_model_cache_lock``; Ray
    2.60), taught pins (never the LRU's victim) and evicts by id."""

    def __init__(self, lru: Any, pinned: Callable[[], set[str]]):
        self.lru = lru
        self.pinned = pinned
        self._unload_lru = lru.unload_model_lru
        lru.unload_model_lru = self.unload_lru  # Serve calls it through the instance
        self._push = getattr(lru, "_push_model_ids_info", None)  # Serve's push, its task's
        self._push_every_s = 0.0  # none set yet: the first push makes the task call ours
        self.push_model_ids()  # the load that made this one has begun: say so now

    def push_model_ids(self) -> None:
        """Serve's push of this replica's model ids (loaded and loading), now; then its
        task's pace set: every MODEL_IDS_BUSY_S while a load runs or a push waits, every
        MODEL_IDS_IDLE_S otherwise (a Ray without the task: nothing changed)."""
        pusher = getattr(self.lru, "metrics_pusher", None)
        name = getattr(self.lru, "_PUSH_MULTIPLEXED_MODEL_IDS_TASK_NAME", None)
        if self._push is None or pusher is None or name is None:
            return
        self._push()
        busy = bool(getattr(self.lru, "_model_load_tasks", ())) or (
            self.lru._push_multiplexed_replica_info)
        every = MODEL_IDS_BUSY_S if busy else MODEL_IDS_IDLE_S
        if every != self._push_every_s:
            self._push_every_s = every
            pusher.register_or_update_task(name, self.push_model_ids, every)

    def unpinned(self) -> list[str]:
        """The resident ids that may be evicted, least recently used first."""
        pinned = self.pinned()
        return [m for m in self.lru.models if m not in pinned]

    async def unload_lru(self) -> None:
        """Serve's eviction, with the pinned models moved out of its way first; with
        every resident model pinned, the load that asked for room is refused (507) rather
        than a pinned model evicted (the follower would load it again: they would
        thrash). The message names no model: the log has them."""
        pinned = self.pinned()
        for model_id in [m for m in self.lru.models if m in pinned]:
            self.lru.models.move_to_end(model_id)
        if self.lru.models and next(iter(self.lru.models)) in pinned:
            logger.warning("model table: every resident model is pinned (%s): a load that "
                           "needs a slot is refused", ", ".join(self.lru.models))
            raise ModelTooLarge("every model slot of this pool replica holds a pinned model; "
                                "unpin one (the admin API) to serve other models here",
                                param="model")
        await self._unload_lru()

    async def evict(self, model_id: str) -> bool:
        """Unload ``model_id`` now if resident (under the LRU's lock: never mid-load)."""
        async with self.lru._model_cache_lock:
            if model_id not in self.lru.models:
                return False
            self.lru.models.move_to_end(model_id, last=False)
            await self._unload_lru()
            self.lru._push_multiplexed_replica_info = True
            self.push_model_ids()  # routing learns it at once
            return True


class PoolFollower:
    """A pool replica following the table: its registry, pins, evicts and load report."""

    def __init__(self, settings: BlitzSettings, registry: Registry, pool: str,
                 load: Callable[[str], Awaitable[Any]], states: Callable[[], dict],
                 forget: Callable[[str], None], lru: Callable[[], PinnedLru | None]):
        store = GcsStore(app_name())
        self.watch = ModelWatch(store, registry)
        self.report = LoadReport(store, pool, replica_name())
        self.every_s = settings.admin.poll_s
        self.admin_on = bool(settings.admin.resolved_keys())
        self.retries = PinRetries(settings.pool(pool).load_failure_ttl_s)
        self._lru = lru  # Serve's LRU, taught pins: None until the replica's first load
        self._load, self._states, self._forget = load, states, forget
        self._pinning: dict[str, asyncio.Task] = {}
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(
                follow(self.watch, self.every_s, self.admin_on, self._changed, self._tick))

    async def refresh(self) -> None:
        """Read the table now (a job named a model this replica does not know yet)."""
        changes = self.watch.apply(await asyncio.to_thread(self.watch.read))
        if changes is not None:
            await self._changed(changes)

    async def _changed(self, changes: Changes) -> None:
        lru = self._lru()
        for model_id in sorted(changes.evict):
            self._forget(model_id)
            if lru is not None and await lru.evict(model_id):
                logger.info("model table: evicted %r", model_id)

    async def _tick(self) -> None:
        states = self._states()
        self.retries.keep_only(self.watch.pinned)
        for model_id in sorted(self.watch.pinned):  # a pinned model not held: load it
            state = states.get(model_id, {}).get("state")
            running = self._pinning.get(model_id)
            if state is None and (running is None or running.done()) and (
                    self.retries.due(model_id)):  # one that keeps failing: less often
                self._pinning[model_id] = asyncio.ensure_future(self._pin(model_id))
        for model_id in [m for m, task in self._pinning.items()
                         if task.done() and m not in self.watch.pinned]:
            del self._pinning[model_id]
        await asyncio.to_thread(self.report.write, states)

    async def _pin(self, model_id: str) -> None:
        try:
            await self._load(model_id)
            self.retries.loaded(model_id)
            logger.info("model table: pinned %r loaded", model_id)
        except Exception as exc:  # noqa: BLE001 - shown in the load report as failed
            wait = self.retries.failed(model_id)
            logger.warning("model table: pinned %r failed to load: %s (tried again in %.0f "
                           "s at the soonest)", model_id, exc, wait)

    def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
        for task in self._pinning.values():
            task.cancel()
        try:
            self.report.close()
        except Exception:  # noqa: BLE001 - Ray may be going down
            pass


class IngressFollower:
    """An ingress following the table: its registry (the added models served, the others
    refused), what it knows of a changed model forgotten, and at once after a change it
    made itself (the admin call's reply comes after its own ingress serves the change)."""

    def __init__(self, admin: ModelAdmin, registry: Registry, forget: Callable[[str], None],
                 every_s: float):
        self.watch = ModelWatch(admin.store, registry, admin.mirror)
        self.every_s = every_s
        self.admin_on = bool(admin.settings.admin.resolved_keys())
        self._forget = forget
        self.task: asyncio.Task | None = None
        admin.on_change = self.poll_now  # called in the admin call's thread

    def start(self) -> None:
        """Begin following (from a coroutine of the replica's loop; again: nothing)."""
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(
                follow(self.watch, self.every_s, self.admin_on, self._changed))

    def poll_now(self) -> None:
        """Read and apply the table now (blocking: from a thread, as the admin calls run)."""
        read = self.watch.read()
        changes = self.watch.apply(read)
        for model_id in sorted(changes.respecified if changes else ()):
            self._forget(model_id)

    async def _changed(self, changes: Changes) -> None:
        for model_id in sorted(changes.respecified):
            self._forget(model_id)


class AdminMethods:
    """The admin API on the ingress's handle (in-cluster callers: no key):
    ``await handle.admin_models.remote()`` and the rest, each in the HTTP API's words."""

    admin: ModelAdmin

    async def admin_models(self) -> list[dict[str, Any]]:
        """Every model with its pin and each pool replica's load state (GET /admin/models)."""
        return await asyncio.to_thread(listing, self.admin)

    async def add_model(self, model: dict[str, Any], pin: bool = False) -> dict[str, Any]:
        """Add a model entry (as in the config's ``models``); POST /admin/models."""
        return entry_row(await asyncio.to_thread(self.admin.add, model, pin))

    async def remove_model(self, model_id: str) -> dict[str, Any]:
        await asyncio.to_thread(self.admin.remove, model_id)
        return {"id": model_id, "removed": True}

    async def pin_model(self, model_id: str, pinned: bool = True) -> dict[str, Any]:
        return entry_row(await asyncio.to_thread(self.admin.pin, model_id, pinned))

    async def evict_model(self, model_id: str) -> dict[str, Any]:
        return entry_row(await asyncio.to_thread(self.admin.evict, model_id))
