"""One pool replica's logic, without Serve: jobs in, one result or error per job out, each
model's jobs batched in one queue and run on worker threads under a lease on the model.

``PoolReplica`` holds up to ``MAX_MODELS_PER_REPLICA`` models (the deployment puts Serve's
multiplexed LRU in front of ``load``, as ``cached_load``), fewer where their bytes do not
fit its memory budget (``blitz.pool.memory_budget``: before a load, and again once the
model's exact weights are known, the LRU's least recently used models are evicted until
the new one fits; one that cannot fit alone is refused, 507), batches concurrent jobs of every
kind (texts, token ids, reranks) per model with one ``Batcher``, runs model work on
``workers`` threads (``WorkerSlots``: that many model calls at once) and each load on a
thread of its own (``LoadQueue``: one at a time, shared by its callers, within
``load_timeout_s``), never on the event loop, so a long load does not stall the models
already resident. Work holds a lease on its model, so an eviction never frees a model
mid-batch. ``problem()`` names a load or all workers stuck past their deadlines; the
deployment's health check raises it, and Serve replaces the replica. What the replica
does is reported through ``PoolEvents`` callbacks (the deployment wires Ray's metrics);
while traces are on, each traced job's spans here are made too (``blitz.runtime.tracing``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from blitz import timing
from blitz.encoders.base import Encoded, Encoder
from blitz.encoders.sparse import cap_token_budget
from blitz.errors import ModelLoadFailed, Overloaded, Unavailable
from blitz.hop_messages import ImageEmbedJob, priority_of, units_of
from blitz.loading.failures import LoadFailures, as_load_failure
from blitz.loading.fetch import preflight_source
from blitz.loading.load import load_encoder, resolve_device
from blitz.pool.batching import Batcher
from blitz.pool.holder import ModelFreed, ModelHolder
from blitz.pool.image_prep import with_prepared
from blitz.pool.load_queue import LoadQueue, one_at_a_time
from blitz.pool.memory_budget import (
    Footprint,
    ModelShape,
    evictions,
    gib,
    make_room,
    model_shape,
    needed_bytes,
    pool_budget,
    size_model,
)
from blitz.pool.mixed_batch import Job, run_jobs
from blitz.pool.worker_slots import WorkerSlots
from blitz.runtime import collector, malloc, model_threads, tracing
from blitz.settings.config import BlitzSettings
from blitz.settings.registry import ModelSpec

logger = logging.getLogger("blitz.pool")
EVICTIONS_KEPT = 32  # the last evicted ids kept for stats(); the count is kept in full
LEASE_TRIES = 3  # a model evicted between lookup and use is loaded again this often


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


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PoolReplica:
    def __init__(self, settings: BlitzSettings, pool: str, events: PoolEvents | None = None,
                 *, device: str | None = None, cuda: Any = None,
                 shape_of: Callable[[ModelSpec], ModelShape | None] = model_shape):
        """``device`` (default: the pool's, if present here), ``cuda`` (the ``torch.cuda``
        module the memory budget reads) and ``shape_of`` (a model's shape before it
        loads) are for tests' stand-ins."""
        self.settings = settings
        self.registry = settings.registry()
        self.pool = pool
        self.pool_settings = settings.pool(pool)
        self.events = events or PoolEvents()
        self.device = device or resolve_device("cuda" if pool == "gpu" else "cpu")
        sizing = settings.sizing
        self.memory_budget = pool_budget(self.pool_settings, self.device,
                                         sizing.cpu_replicas if sizing else 1, cuda)
        self.shape_of = shape_of
        self.footprints: list[Footprint] = []  # every model in memory, evicted ones that a
        # call still holds included (one each: the holder's ``on_release`` drops it)
        self.cache_dir = settings.resolved_cache_dir()
        self.workers = WorkerSlots(self.pool_settings.worker_count,
                                   stuck_after_s=self.pool_settings.call_timeout_s,
                                   name=f"blitz-{pool}")
        self.loads: LoadQueue[Encoder] = LoadQueue(
            deadline_s=self.pool_settings.load_timeout_s, name=f"blitz-{pool}-load",
            on_failure=lambda model_id, exc: self._load_failed(self.registry.get(model_id), exc))
        # torch itself is imported only if a model needs it (blitz.runtime.model_threads)
        model_threads.configure(self.pool_settings.torch_threads)
        self.failures = LoadFailures(self.pool_settings.load_failure_ttl_s)
        # the loader: Serve's multiplexed LRU in a replica (its lock serializes loads), else
        # no cache: each caller its own load, one at a time (never two holders of one encoder)
        self.cached_load: Callable[[str], Awaitable[ModelHolder]] = one_at_a_time(self.load)
        # reads the model table now (blitz.admin), when a job names an id not served here
        self.refresh: Callable[[], Awaitable[None]] | None = None
        self.batchers: dict[str, Batcher] = {}  # one queue per model
        self.batches_run: dict[str, int] = {}  # per model: batches, and the texts in them
        self.texts_run: dict[str, int] = {}
        self.loaded: list[str] = []  # resident models, least recently loaded first
        self.backends: dict[str, str] = {}  # resident model -> the backend serving it
        self.auto_choices: dict[str, dict[str, Any]] = {}  # cpu_backend auto: the choice
        self.evicted: deque[str] = deque(maxlen=EVICTIONS_KEPT)
        self.evictions = 0

    # ---- models ----------------------------------------------------------------------

    async def load(self, model_id: str, cached: Callable[[], list[str]] = list,
                   evict: Callable[[], Awaitable[None]] | None = None) -> ModelHolder:
        """Load a registered model (one load at a time), first making room for its bytes:
        ``evict`` evicts the least recently used of the ``cached()`` ids in front (Serve's
        LRU). A caller that gives up leaves the load running for the next caller of the
        id; a failure comes through ``_load_failed`` (the queue's ``on_failure``), so it
        is remembered and counted once per load. Calls are serialized in front (the cache's
        lock): callers sharing one load would each wrap its encoder in a holder."""
        spec = self.registry.get(model_id)  # only registered ids ever load
        started = time.perf_counter()
        timeout = self.pool_settings.load_timeout_s
        await self._make_room(self.size(spec, self.shape_of(spec)), cached, evict)
        shapes: list[ModelShape | None] = []

        def load() -> Encoder:
            # the deadline travels with the load: a child build or measurement dies with it
            encoder = load_encoder(spec, self.device, self.cache_dir, timeout_s=timeout)
            shapes.append(self.shape_of(spec) or model_shape(spec, self.cache_dir, True))
            encoder.warmup()
            collector.settle()  # what start-up and this load leave, never scanned again
            malloc.trim()  # what the load only passed through (file reads, graph
            # optimisation) back to the system: glibc would keep it (blitz.pool.holder)
            return encoder

        encoder = await self.loads.load(model_id, load)
        footprint = self.size(spec, shapes[0] if shapes else self.shape_of(spec),
                              weights=encoder.weight_bytes(),
                              max_seq_length=encoder.max_seq_length)
        try:  # the exact weights: room again, or the model goes
            await self._make_room(footprint, cached, evict)
        except BaseException:
            ModelHolder(encoder).__del__()
            raise
        if hasattr(encoder, "limits"):  # a dual encoder: the pool's image limits
            encoder.limits = self.settings.images
        if hasattr(encoder, "token_budget"):
            encoder.token_budget = footprint.max_batch_tokens
        cap_token_budget(encoder, self.pool_settings.sparse_token_budget)
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
        return size_model(spec, self.pool_settings, self.device, self.memory_budget, shape,
                          **known)

    async def _make_room(self, new: Footprint, cached: Callable[[], list[str]],
                         evict: Callable[[], Awaitable[None]] | None) -> None:
        await make_room(self.footprints, new, self.memory_budget,
                        self.pool_settings.worker_count, cached() if evict else [], evict,
                        self.pool_settings.call_timeout_s)

    async def preload(self) -> None:
        """Load the pool's ``preload`` models through ``cached_load``, so the cache in front
        (Serve's LRU) holds them and reports their ids, and routing sends their requests
        here."""
        for model_id in self.pool_settings.preload:
            await self.holder(model_id)
        if self.pool_settings.preload:
            logger.info("%s pool replica preloaded %s", self.pool, self.pool_settings.preload)

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
                      self.memory_budget, self.pool_settings.worker_count)
        return await self.cached_load(model_id)

    def forget(self, model_id: str) -> None:
        """The model table changed ``model_id`` (blitz.admin): its remembered failure goes;
        once it is not served any more (removed), its queue and counts too."""
        self.failures.forget(model_id)
        if model_id not in self.registry:
            self.batchers.pop(model_id, None)
            self.batches_run.pop(model_id, None)
            self.texts_run.pop(model_id, None)

    def problem(self) -> str | None:
        """Why this replica cannot work, or None: a model load stuck past
        ``load_timeout_s`` (no other model can load), or every worker stuck in a call past
        ``call_timeout_s`` (no work can run)."""
        return self.loads.problem() or self.workers.problem()

    # ---- work ------------------------------------------------------------------------

    async def run_jobs(self, model_id: str, jobs: list[Job]) -> list[Encoded | BaseException]:
        """Several requests' jobs for one model (the ingress merges concurrent ones), of any
        kind: they enter the model's one queue together, so they can share a batch, and
        each gets its own result or error, so one bad job fails alone."""
        if model_id not in self.registry and self.refresh is not None:
            await self.refresh()  # added a moment ago: the ingress may know it first
        self.registry.get(model_id)  # an unknown id: UnknownModel (404), and no queue made
        self.workers.refuse_if_stuck(f"model {model_id!r}")  # queued, it could never run
        queued = functools.partial(self._queued, model_id)
        if any(isinstance(job, ImageEmbedJob) for job in jobs):  # decoded before the queue
            return await with_prepared(jobs, self.settings.images, functools.partial(
                self._leased, model_id), functools.partial(self.run_jobs, model_id))
        if tracing.TRACER is not None:  # traces on: a span per traced job, around the rest
            return await tracing.in_pool(queued, jobs, self.pool, model_id)
        return await queued(jobs)

    async def _leased(self, model_id: str, fn: Callable[[Encoder], Any]) -> Any:
        """``fn(encoder)`` in a thread of its own (not a worker's), under a lease."""
        for _ in range(LEASE_TRIES):
            holder = await self.holder(model_id)
            with contextlib.suppress(ModelFreed):
                return await asyncio.to_thread(holder.call, fn)
        raise Unavailable(f"model {model_id!r} was evicted {LEASE_TRIES} times in a row")

    async def _queued(self, model_id: str, jobs: list[Job]) -> list[Encoded | BaseException]:
        """``run_jobs``' jobs through the model's queue, timed (``pool``, ``pool-queue``)."""
        entered = time.perf_counter()
        try:
            results = await self._batcher(model_id).submit_many(jobs)
        except Overloaded as exc:
            return [exc] * len(jobs)
        timing.since(results, "pool-queue", entered)
        timing.record(results, pool=time.perf_counter() - entered)
        return results

    def _batcher(self, model_id: str) -> Batcher:
        batcher = self.batchers.get(model_id)
        if batcher is None:
            batcher = self.batchers[model_id] = Batcher(
                lambda jobs: self._run_batch(model_id, jobs),
                max_batch=self.pool_settings.max_batch_size,
                max_waiting=self.pool_settings.max_queued_texts,
                max_in_flight=self.pool_settings.worker_count,
                name=f"{self.pool} pool, model {model_id!r}", priority=priority_of,
                size=units_of,
                aging_s=self.pool_settings.priority_aging_s, on_reject=self.events.rejected,
                on_waiting=self.events.waiting(model_id), on_waited=self.events.waited)
        return batcher

    async def _run_batch(self, model_id: str, jobs: list[Job]) -> list:
        """One batch of the model's queue: counted, run, timed; padding observed."""
        started = time.perf_counter()
        texts = sum(len(j) for j in jobs)
        self.events.batch(texts)
        self.batches_run[model_id] = self.batches_run.get(model_id, 0) + 1
        self.texts_run[model_id] = self.texts_run.get(model_id, 0) + texts
        results, waited, ran, ran_at = await self._call_model(
            model_id, lambda encoder: run_jobs(encoder, jobs))
        timing.mark(results, "pool-queue", started)
        timing.record(results, worker_wait=waited, model=ran)
        if tracing.TRACER is not None:  # traces on: this batch's spans, in each job's trace
            tracing.batch(jobs, results, started, ran_at, ran, {
                "blitz.pool": self.pool, "blitz.model": model_id,
                "blitz.batch.jobs": len(jobs), "blitz.batch.texts": texts})
        real = sum(int(r.token_counts.sum()) for r in results if isinstance(r, Encoded))
        padded = sum(r.padded_tokens for r in results if isinstance(r, Encoded))
        if padded:  # billed tokens can pass computed ones: an embedding model's rerank
            # bills its query once per document but computes it once
            self.events.padding(min(1.0, real / padded))
        return results

    async def _call_model(self, model_id: str, fn: Callable[[Encoder], Any]
                          ) -> tuple[Any, float, float, float]:
        """``fn(encoder)`` on a worker thread, holding a lease on the model throughout;
        with the seconds it waited for the thread (the hand-off included) and ran there,
        and when it began there (``time.perf_counter()``).
        A model evicted between lookup and lease is loaded again, ``LEASE_TRIES`` times."""
        what = f"model {model_id!r}"
        for _ in range(LEASE_TRIES):
            self.workers.refuse_if_stuck(what)  # before loading a model for nothing
            holder = await self.holder(model_id)
            ran: list[float] = []

            def work(holder: ModelHolder = holder, ran: list[float] = ran) -> Any:
                ran.append(time.perf_counter())
                try:
                    with holder.lease() as encoder:  # raises ModelFreed if evicted meanwhile
                        return fn(encoder)
                finally:
                    ran.append(time.perf_counter())

            asked = time.perf_counter()
            try:
                result = await self.workers.run(work, self.pool_settings.call_timeout_s, what)
            except ModelFreed:
                continue
            return result, ran[0] - asked, ran[1] - ran[0], ran[0]
        raise Unavailable(f"model {model_id!r} was evicted {LEASE_TRIES} times in a row "
                          "while waiting; the pool holds too many models for its load")

    def stats(self) -> dict[str, Any]:
        """What this replica holds and does: for tests and operators."""
        return {"pool": self.pool, "device": self.device,
                "workers": self.pool_settings.worker_count, "loaded": list(self.loaded),
                "backends": dict(self.backends), "auto_choices": dict(self.auto_choices),
                "evicted": list(self.evicted), "evictions": self.evictions,
                "pid": os.getpid(), "rss_bytes": rss_bytes(), "malloc": malloc.info(),
                "batches_run": dict(self.batches_run), "texts_run": dict(self.texts_run),
                "waiting_texts": {m: b.waiting for m, b in self.batchers.items()},
                "running_batches": {m: b.in_flight for m, b in self.batchers.items()},
                "busy_workers": self.workers.busy, "stuck_workers": self.workers.stuck,
                "waiting_for_workers": self.workers.waiting,
                "loading": self.loads.loading, "queued_loads": self.loads.queued,
                "load_overdue_s": round(self.loads.overdue_s(), 3),
                "memory": self.memory_stats()}

    def model_states(self) -> dict[str, dict[str, Any]]:
        """Each model this replica holds, loads, waits to load or failed to load, with its
        state (for the admin API's listing; a failure says only its public message)."""
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
        return {"budget_bytes": self.memory_budget,
                "needed_bytes": needed_bytes(list(self.footprints), workers),
                "models": [{"id": f.model_id, "weight_bytes": f.weights,
                            "call_bytes": f.activations, "max_batch_tokens": f.max_batch_tokens}
                           for f in self.footprints]}
