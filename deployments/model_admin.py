"""The model table's Ray side: its store (Ray's GCS key-value store, one namespace per
Serve application) and the loops that make each replica follow it.

Why the GCS: every replica on every node reads the same table without a shared file, it
outlives replica restarts and `serve deploy` rollouts, and where the GCS is fault tolerant
(KubeRay's external Redis) a head restart too. A restart of Ray itself empties it:
``admin.models_file`` keeps a copy that the ingress puts back (``blitz.admin.store``).

A pool replica follows the table through its model set (``blitz.pool.model_set``): a pinned
model is loaded at once and never its cache's victim (Serve's LRU taught pins:
``deployments/serve_lru.py``); an evicted, removed or re-specified one is unloaded at once
(calls holding it finish first: ``blitz.pool.holder``).
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
from blitz.pool.replica import PoolReplica
from blitz.settings.config import BlitzSettings
from blitz.settings.registry import Registry

logger = logging.getLogger("ray.serve")
NAMESPACE = "blitz-models"


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


class PoolFollower:
    """A pool replica following the table (``blitz.pool.model_set.ModelTable``): its
    registry, pins, evicts and load report. Built before the replica (which reads its
    pins and asks it to read the table now); ``start`` with the replica begins the loop."""

    def __init__(self, settings: BlitzSettings, registry: Registry, pool: str):
        store = GcsStore(app_name())
        self.watch = ModelWatch(store, registry)
        self.report = LoadReport(store, pool, replica_name())
        self.every_s = settings.admin.poll_s
        self.admin_on = bool(settings.admin.resolved_keys())
        self.retries = PinRetries(settings.pool(pool).load_failure_ttl_s)
        self.replica: PoolReplica | None = None  # followed from ``start`` on
        self._pinning: dict[str, asyncio.Task] = {}
        self.task: asyncio.Task | None = None

    @property
    def pinned(self) -> set[str]:
        return self.watch.pinned

    def start(self, replica: PoolReplica) -> None:
        self.replica = replica
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(
                follow(self.watch, self.every_s, self.admin_on, self._changed, self._tick))

    async def refresh(self) -> None:
        """Read the table now (a job named a model this replica does not know yet)."""
        changes = self.watch.apply(await asyncio.to_thread(self.watch.read))
        if changes is not None:
            await self._changed(changes)

    async def _changed(self, changes: Changes) -> None:
        replica = self.replica
        for model_id in sorted(changes.evict):
            if replica is None:
                continue
            replica.forget(model_id)
            if await replica.models.evict(model_id):
                logger.info("model table: evicted %r", model_id)

    async def _tick(self) -> None:
        if self.replica is None:
            return
        states = self.replica.model_states()
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
            if self.replica is not None:
                await self.replica.holder(model_id)
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
