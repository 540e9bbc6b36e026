"""Serve's multiplexed LRU as a pool replica's model cache: the one place that touches its
private state (Ray 2.60 serve/multiplex.py, ``_ModelMultiplexWrapper``: an OrderedDict
``models`` least recent first, ``unload_model_lru``, ``_model_cache_lock``, the push of
the replica's model ids). tests/integration/test_memory_budget.py checks it is still there.

``ServeModels`` is the ``blitz.pool.model_set.Cache`` a pool replica's ``ModelSet`` is
built with: its ``get`` is the deployment's ``@serve.multiplexed`` loader (which reports
the ids routing uses); the rest goes through ``PinnedLru``, Serve's LRU taught pins (never
its victim) and eviction by id, from the first load on (Serve makes its LRU then).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from blitz.pool.holder import ModelHolder
from blitz.pool.model_set import pins_last, unpinned

SERVE_LRU = "__serve_multiplex_wrapper"  # where @serve.multiplexed keeps a replica's LRU
# Serve pushes a pool replica's model ids to its controller every 0.1 s (its multiplexed
# LRU's task, PUSH_MULTIPLEXED_MODEL_IDS_INTERVAL_S), idle or not: PinnedLru keeps that
# pace only while a load runs or a change waits to be pushed, and pushes a load's ids at
# its start itself; otherwise once every MODEL_IDS_IDLE_S (the gauges it sets with them).
MODEL_IDS_BUSY_S = 0.1
MODEL_IDS_IDLE_S = 1.0


class PinnedLru:
    """Serve's multiplexed LRU of one pool replica, taught pins and evicts by id."""

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
        return unpinned(list(self.lru.models), self.pinned())

    async def unload_lru(self) -> None:
        """Serve's eviction, with the pinned models moved out of its way first
        (``blitz.pool.model_set.pins_last``: all pinned, the load is refused, 507)."""
        pins_last(self.lru.models, self.pinned())
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


class ServeModels:
    """``blitz.pool.model_set.Cache`` over Serve's LRU of ``owner`` (the deployment's
    object): ``get`` is its multiplexed loader, which calls ``taught`` as each load
    begins, then the model set's ``load``."""

    def __init__(self, owner: Any, get: Callable[[str], Awaitable[ModelHolder]],
                 pinned: Callable[[], set[str]]):
        self.owner, self.get, self.pinned = owner, get, pinned
        self.pins: PinnedLru | None = None  # Serve makes its LRU at the first load

    def taught(self) -> None:
        """A load begins: the first makes Serve's LRU learn pins; a later one pushes its
        id now (Serve would at its next tick, whatever the tick's pace)."""
        if self.pins is None:
            self.pins = PinnedLru(getattr(self.owner, SERVE_LRU), self.pinned)
        else:
            self.pins.push_model_ids()

    def evictable(self) -> list[str]:
        return self.pins.unpinned() if self.pins is not None else []

    async def evict_lru(self) -> None:
        if self.pins is not None:
            await self.pins.unload_lru()

    async def evict(self, model_id: str) -> bool:
        return self.pins is not None and await self.pins.evict(model_id)
