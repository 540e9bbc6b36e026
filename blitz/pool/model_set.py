"""The models one pool replica holds, without Ray: one owner of their loads, load states,
memory budget, pins, evictions and least-recently-used order.

A model is asked for with ``holder(model_id)``: a load that failed recently, a local
source that is missing or would run code its spec does not trust, or a model too large
even alone fails there, before anything is evicted for it. Otherwise the ``Cache`` in
front answers: a resident model's holder, or a load (``load``), one at a time:

- **Room first** (``blitz.pool.memory_budget``): the model's bytes from its facts
  (``shape_of``: a local model's files), then the cache's least recently used unpinned
  models evicted until it fits.
- **Loaded once** (``blitz.loading.load.load_model``, on the load queue's thread): its
  source resolved (fetched) once, its shape read from the folder it was opened from, its
  exact weights measured; then room again for those (or the model goes: the one step that
  goes back to the budget, so that no model is ever held over it).
- **Configured once** (``Encoder.configure``): its token budget and the pool's limits.
- **Its state kept**: loaded (with its backend), queued, loading, or failed (remembered
  for ``load_failure_ttl_s``, ``blitz.loading.failures``), until evicted.

The cache is one of three: ``OwnLru`` (this module: an LRU of at most ``max_models``,
pins never its victims; ``in_process`` and unit tests), ``Uncached`` (each caller its own
load, one at a time) or Serve's multiplexed LRU adapted in one place
(``deployments/serve_lru.py``). Pins come from the model table the replica follows
(``ModelTable``: the admin API's, ``deployments/model_admin.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from blitz.encoders.base import Encoder
from blitz.errors import ModelLoadFailed, ModelTooLarge
from blitz.loading.facts import ModelShape, model_shape, read_shape
from blitz.loading.failures import LoadFailures, as_load_failure
from blitz.loading.fetch import preflight_source
from blitz.loading.load import load_model
from blitz.pool.holder import ModelHolder
from blitz.pool.load_queue import LoadQueue, one_at_a_time
from blitz.pool.memory_budget import Footprint, evictions, gib, make_room, needed_bytes, size_model
from blitz.runtime import collector, malloc
from blitz.settings.config import BlitzSettings
from blitz.settings.registry import ModelSpec, Registry

logger = logging.getLogger("blitz.pool")
EVICTIONS_KEPT = 32  # the last evicted ids kept for stats(); the count is kept in full


def _nothing(*_: Any) -> None:
    return None


@dataclass
class PoolEvents:
    """What a pool replica reports, one callback each; every default does nothing."""

    loaded: Callable[[str, float], None] = _nothing  # model id, seconds the load took
    load_failed: Callable[[str], None] = _nothing  # model id
    evicted: Callable[[str], None] = _nothing  # model id
    rejected: Callable[[], None] = _nothing  # a job refused: the model's queue is full
    waiting: Callable[[str], Callable[[int], None] | None] = _nothing  # model id ->
    # the Batcher's ``on_waiting`` for that model's queue (texts waiting)
    waited: Callable[[int, float], None] = _nothing  # a batch's priority level, the seconds
    # its oldest job waited in the model's queue (as the batch formed)
    batch: Callable[[int], None] = _nothing  # a model call of this many texts, about to run
    padding: Callable[[float], None] = _nothing  # real tokens / computed tokens of a call
    noted: Callable[[], None] = _nothing  # a rare event was logged (a load, an eviction)


class ModelTable(Protocol):
    """The model table a replica follows (the admin API's): its pins, and a read now."""

    @property
    def pinned(self) -> set[str]: ...

    async def refresh(self) -> None: ...


class Cache(Protocol):
    """What holds the resident models' holders, in front of ``ModelSet.load``."""

    @property
    def get(self) -> Callable[[str], Awaitable[ModelHolder]]: ...  # a model's holder
    def evictable(self) -> list[str]: ...  # resident, unpinned, least recently used first
    async def evict_lru(self) -> None: ...  # the least recently used unpinned one goes
    async def evict(self, model_id: str) -> bool: ...  # that one goes now, if resident


def unpinned(order: list[str], pinned: set[str]) -> list[str]:
    """The ids of ``order`` (least recently used first) that may be evicted."""
    return [m for m in order if m not in pinned]


def pins_last(models: OrderedDict[str, Any], pinned: set[str]) -> None:
    """``models`` (least recently used first) with the pinned ones moved out of an
    eviction's way; with every one pinned, ``ModelTooLarge`` (507) rather than a pinned
    model evicted (the table would load it again: they would thrash). The message names
    no model: the log has them."""
    for model_id in [m for m in models if m in pinned]:
        models.move_to_end(model_id)
    if models and next(iter(models)) in pinned:
        logger.warning("model table: every resident model is pinned (%s): a load that "
                       "needs a slot is refused", ", ".join(models))
        raise ModelTooLarge("every model slot of this pool replica holds a pinned model; "
                            "unpin one (the admin API) to serve other models here",
                            param="model")


async def unload(holder: ModelHolder) -> None:
    """An evicted model's holder let go off the event loop (as Serve's LRU does)."""
    await asyncio.get_running_loop().run_in_executor(None, holder.__del__)


class OwnLru:
    """An LRU of at most ``limit`` models in front of ``load``, without Ray: an
    OrderedDict, one lock across a load, a second look after taking it; pins never its
    victims."""

    def __init__(self, load: Callable[[str], Awaitable[ModelHolder]], limit: int,
                 pinned: Callable[[], set[str]]):
        self.load, self.limit, self.pinned = load, limit, pinned
        self.models: OrderedDict[str, ModelHolder] = OrderedDict()
        self._lock = asyncio.Lock()

    async def get(self, model_id: str) -> ModelHolder:
        holder = self.models.get(model_id)
        if holder is None:
            async with self._lock:
                holder = self.models.get(model_id)
                if holder is None:
                    if len(self.models) >= self.limit:
                        await self.evict_lru()
                    holder = self.models[model_id] = await self.load(model_id)
        self.models.move_to_end(model_id)
        return holder

    def evictable(self) -> list[str]:
        return unpinned(list(self.models), self.pinned())

    async def evict_lru(self) -> None:
        pins_last(self.models, self.pinned())
        _, holder = self.models.popitem(last=False)
        await unload(holder)

    async def evict(self, model_id: str) -> bool:
        async with self._lock:  # never mid-load
            holder = self.models.pop(model_id, None)
            if holder is None:
                return False
            await unload(holder)
            return True


class Uncached:
    """No cache: each caller its own load, one at a time (never two holders of one
    encoder); nothing resident to evict."""

    def __init__(self, load: Callable[[str], Awaitable[ModelHolder]]):
        self.get = one_at_a_time(load)

    def evictable(self) -> list[str]:
        return []

    async def evict_lru(self) -> None:
        return None

    async def evict(self, model_id: str) -> bool:
        return False


class Opened(NamedTuple):
    """What a load hands on: the encoder, its shape (read from the folder it was opened
    from) and its exact weights."""

    encoder: Encoder
    shape: ModelShape | None
    weights: int | None


class ModelSet:
    def __init__(self, settings: BlitzSettings, pool: str, registry: Registry, device: str,
                 budget: int | None, events: PoolEvents, *,
                 shape_of: Callable[[ModelSpec], ModelShape | None] = model_shape,
                 cache: Cache | None = None, max_models: int = 0,
                 table: ModelTable | None = None):
        """``cache``: the one in front (Serve's); else ``OwnLru`` of ``max_models``, or
        with 0 ``Uncached``. ``table``: the model table followed (pins, reads)."""
        self.settings = settings
        self.pool_settings = settings.pool(pool)
        self.registry = registry
        self.device = device
        self.budget = budget
        self.events = events
        self.shape_of = shape_of
        self.table = table
        self.cache_dir: Path = settings.resolved_cache_dir()
        self.cache: Cache = cache or (OwnLru(self.load, max_models, self.pinned) if max_models
                                      else Uncached(self.load))
        self.loads: LoadQueue[Opened] = LoadQueue(
            deadline_s=self.pool_settings.load_timeout_s, name=f"blitz-{pool}-load",
            on_failure=lambda model_id, exc: self._load_failed(self.registry.get(model_id), exc))
        self.failures = LoadFailures(self.pool_settings.load_failure_ttl_s)
        self.footprints: list[Footprint] = []  # every model in memory, evicted ones that a
        # call still holds included (one each: the holder's ``on_release`` drops it)
        self.loaded: list[str] = []  # resident models, least recently loaded first
        self.backends: dict[str, str] = {}  # resident model -> the backend serving it
        self.auto_choices: dict[str, dict[str, Any]] = {}  # cpu_backend auto: the choice
        self.evicted: deque[str] = deque(maxlen=EVICTIONS_KEPT)
        self.evictions = 0

    def pinned(self) -> set[str]:
        return self.table.pinned if self.table is not None else set()

    async def holder(self, model_id: str) -> ModelHolder:
        """The model's holder. A load that failed recently, a local source that is missing
        or would run code its spec does not trust, or a model too large even alone fails
        here, before the cache in front evicts a healthy model for it."""
        if model_id not in self.loaded:
            self.failures.check(model_id)
            spec = self.registry.get(model_id)  # an unknown id is a 404, not a failed load
            try:
                preflight_source(spec)
            except Exception as exc:
                raise self._load_failed(spec, exc) from exc
            # too large even alone: refused before the cache in front evicts anything
            evictions(list(self.footprints), [], self.size(spec, self.shape_of(spec)),
                      self.budget, self.pool_settings.worker_count)
        return await self.cache.get(model_id)

    async def evict(self, model_id: str) -> bool:
        """Evict ``model_id`` now if resident (the table said so)."""
        return await self.cache.evict(model_id)

    async def load(self, model_id: str) -> ModelHolder:
        """Load a registered model (one load at a time), in one pass: room for its estimated
        bytes, the load (its source resolved once; its shape read from the folder it was
        opened from), room for its exact weights (or it goes), configured, held. A caller
        that gives up leaves the load running for the next caller of the id; a failure
        comes through ``_load_failed`` (the queue's ``on_failure``), so it is remembered and
        counted once per load. The cache in front serializes the calls: callers sharing one
        load would each wrap its encoder in a holder."""
        spec = self.registry.get(model_id)  # only registered ids ever load
        started = time.perf_counter()
        pool, timeout, workers = self.pool_settings, self.pool_settings.load_timeout_s, \
            self.pool_settings.worker_count
        known = self.shape_of(spec)  # a local model's, from its files; else None until fetched
        estimate = size_model(spec, pool, self.device, self.budget, known)
        await make_room(self.footprints, estimate, self.budget, workers, self.cache.evictable(),
                        self.cache.evict_lru, pool.call_timeout_s)

        def open_model() -> Opened:
            # the deadline travels with the load: a child build or measurement dies with it
            encoder, folder = load_model(spec, self.device, self.cache_dir, timeout_s=timeout)
            encoder.warmup()
            collector.settle()  # what start-up and this load leave, never scanned again
            malloc.trim()  # what the load only passed through (file reads, graph
            # optimisation) back to the system: glibc would keep it (blitz.pool.holder)
            shape = known or (read_shape(folder) if folder is not None else None)
            return Opened(encoder, shape, encoder.weight_bytes())

        encoder, shape, weights = await self.loads.in_turn(model_id, open_model)
        footprint = size_model(spec, pool, self.device, self.budget, shape, weights=weights,
                               max_seq_length=encoder.max_seq_length)
        try:  # the exact weights: room again, or the model goes
            await make_room(self.footprints, footprint, self.budget, workers,
                            self.cache.evictable(), self.cache.evict_lru, pool.call_timeout_s)
        except BaseException:
            ModelHolder(encoder).__del__()
            raise
        encoder.configure(max_batch_tokens=footprint.max_batch_tokens,
                          sparse_token_budget=pool.sparse_token_budget, images=self.settings.images)
        self.footprints.append(footprint)
        seconds = time.perf_counter() - started
        self.events.loaded(model_id, seconds)
        logger.info("loaded model %r on %s (%s) in %.2fs: %s of weights, max_batch_tokens %d",
                    model_id, self.device, encoder.backend, seconds, gib(footprint.weights),
                    footprint.max_batch_tokens)
        self.loaded.append(model_id)
        self.backends[model_id] = encoder.backend
        if encoder.auto_choice is not None:
            self.auto_choices[model_id] = encoder.auto_choice
        self.events.noted()
        return ModelHolder(encoder, on_release=self._released)

    def size(self, spec: ModelSpec, shape: ModelShape | None, **known: Any) -> Footprint:
        """``spec``'s bytes and max_batch_tokens here (``blitz.pool.memory_budget``)."""
        return size_model(spec, self.pool_settings, self.device, self.budget, shape, **known)

    def _load_failed(self, spec: ModelSpec, exc: BaseException) -> ModelLoadFailed:
        """The one way a failed load ends: one ``ModelLoadFailed``, remembered for
        ``load_failure_ttl_s`` and counted."""
        error = as_load_failure(spec.id, exc, spec.source)
        self.failures.remember(spec.id, error)
        self.events.load_failed(spec.id)
        return error

    def _released(self, model_id: str) -> None:
        if model_id in self.loaded:
            self.loaded.remove(model_id)
        held = next((f for f in self.footprints if f.model_id == model_id), None)
        if held is not None:
            self.footprints.remove(held)
        self.backends.pop(model_id, None)
        self.auto_choices.pop(model_id, None)
        self.evicted.append(model_id)
        self.evictions += 1
        self.events.evicted(model_id)
        logger.info("evicted model %r", model_id)
        self.events.noted()

    def states(self) -> dict[str, dict[str, Any]]:
        """Each model held, loading, waiting to load or failed to load, with its state
        (for the admin API's listing; a failure says only its public message)."""
        states: dict[str, dict[str, Any]] = {
            m: {"state": "failed", "error": e.public_message()}
            for m, e in self.failures.recent().items()}
        states |= {m: {"state": "queued"} for m in self.loads.queued}
        if self.loads.loading is not None:
            states[self.loads.loading] = {"state": "loading",
                                          "seconds": round(self.loads.running_s(), 1)}
        states |= {m: {"state": "loaded", "backend": self.backends.get(m)}
                   for m in self.loaded}
        return states

    def memory_stats(self) -> dict[str, Any]:
        workers = self.pool_settings.worker_count
        return {"budget_bytes": self.budget,
                "needed_bytes": needed_bytes(list(self.footprints), workers),
                "models": [{"id": f.model_id, "weight_bytes": f.weights,
                            "call_bytes": f.activations, "max_batch_tokens": f.max_batch_tokens}
                           for f in self.footprints]}
