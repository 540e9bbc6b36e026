"""One pool replica's work, without Serve: jobs in, one result or error per job out, each
model's jobs batched in one queue and run on worker threads under a lease on the model.

``PoolReplica`` holds its models in a ``ModelSet`` (``blitz.pool.model_set``: loads, load
states, the memory budget, pins, evictions and the cache in front: Serve's multiplexed LRU
in a pool replica, given at construction, else its own LRU of ``max_models``, else none),
batches concurrent jobs of every kind (``blitz.pool.mixed_batch``) per model with one
``Batcher``, runs model work on ``workers`` threads (``WorkerSlots``: that many model calls
at once) and each load on a thread of its own (``LoadQueue``: one at a time, shared by its
callers, within ``load_timeout_s``), never on the event loop, so a long load does not stall
the models already resident. Work holds a lease on its model, so an eviction never frees a
model mid-batch. ``problem()`` names a load or all workers stuck past their deadlines; the
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
from collections.abc import Callable
from typing import Any

from blitz import timing
from blitz.encoders.base import Encoded, Encoder
from blitz.errors import Overloaded, Unavailable
from blitz.hop_messages import priority_of, units_of
from blitz.loading.facts import ModelShape, model_shape
from blitz.loading.load import resolve_device
from blitz.pool.batching import Batcher
from blitz.pool.holder import ModelFreed, ModelHolder
from blitz.pool.image_prep import has_images, with_prepared
from blitz.pool.memory_budget import pool_budget
from blitz.pool.mixed_batch import Job, run_jobs
from blitz.pool.model_set import Cache, ModelSet, ModelTable, PoolEvents
from blitz.pool.worker_slots import WorkerSlots
from blitz.runtime import malloc, model_threads, tracing
from blitz.settings.config import BlitzSettings
from blitz.settings.registry import ModelSpec, Registry

logger = logging.getLogger("blitz.pool")
LEASE_TRIES = 3  # a model evicted between lookup and use is loaded again this often


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PoolReplica:
    def __init__(self, settings: BlitzSettings, pool: str, events: PoolEvents | None = None,
                 *, cache: Cache | None = None, max_models: int = 0,
                 table: ModelTable | None = None, registry: Registry | None = None,
                 device: str | None = None, cuda: Any = None,
                 shape_of: Callable[[ModelSpec], ModelShape | None] = model_shape):
        """``cache``, ``max_models`` and ``table``: the model set's (``ModelSet``);
        ``registry``: the one the table updates (default: the settings'). ``device``
        (default: the pool's, if present here), ``cuda`` (the ``torch.cuda`` module the
        memory budget reads) and ``shape_of`` (a model's shape before it loads) are for
        tests' stand-ins."""
        self.settings = settings
        self.registry = registry if registry is not None else settings.registry()
        self.pool = pool
        self.pool_settings = settings.pool(pool)
        self.events = events or PoolEvents()
        self.device = device or resolve_device("cuda" if pool == "gpu" else "cpu")
        sizing = settings.sizing
        budget = pool_budget(self.pool_settings, self.device,
                             sizing.cpu_replicas if sizing else 1, cuda)
        self.models = ModelSet(settings, pool, self.registry, self.device, budget,
                               self.events, shape_of=shape_of, cache=cache,
                               max_models=max_models, table=table)
        self.workers = WorkerSlots(self.pool_settings.worker_count,
                                   stuck_after_s=self.pool_settings.call_timeout_s,
                                   name=f"blitz-{pool}")
        # torch itself is imported only if a model needs it (blitz.runtime.model_threads)
        model_threads.configure(self.pool_settings.torch_threads)
        self.batchers: dict[str, Batcher] = {}  # one queue per model
        self.batches_run: dict[str, int] = {}  # per model: batches, and the texts in them
        self.texts_run: dict[str, int] = {}

    # ---- models ----------------------------------------------------------------------

    @property
    def loaded(self) -> list[str]:
        return self.models.loaded

    @property
    def evicted(self) -> list[str]:
        return list(self.models.evicted)

    @property
    def evictions(self) -> int:
        return self.models.evictions

    async def holder(self, model_id: str) -> ModelHolder:
        return await self.models.holder(model_id)

    async def preload(self) -> None:
        """Load the pool's ``preload`` models through the cache in front, so it holds them
        (Serve's LRU reports their ids, and routing sends their requests here)."""
        for model_id in self.pool_settings.preload:
            await self.holder(model_id)
        if self.pool_settings.preload:
            logger.info("%s pool replica preloaded %s", self.pool, self.pool_settings.preload)

    def forget(self, model_id: str) -> None:
        """The model table changed ``model_id`` (blitz.admin): its remembered failure goes;
        once it is not served any more (removed), its queue and counts too."""
        self.models.failures.forget(model_id)
        if model_id not in self.registry:
            self.batchers.pop(model_id, None)
            self.batches_run.pop(model_id, None)
            self.texts_run.pop(model_id, None)

    def problem(self) -> str | None:
        """Why this replica cannot work, or None: a model load stuck past
        ``load_timeout_s`` (no other model can load), or every worker stuck in a call past
        ``call_timeout_s`` (no work can run)."""
        return self.models.loads.problem() or self.workers.problem()

    # ---- work ------------------------------------------------------------------------

    async def run_jobs(self, model_id: str, jobs: list[Job]) -> list[Encoded | BaseException]:
        """Several requests' jobs for one model (the ingress merges concurrent ones), of any
        kind: they enter the model's one queue together, so they can share a batch, and
        each gets its own result or error, so one bad job fails alone."""
        table = self.models.table
        if model_id not in self.registry and table is not None:
            await table.refresh()  # added a moment ago: the ingress may know it first
        self.registry.get(model_id)  # an unknown id: UnknownModel (404), and no queue made
        self.workers.refuse_if_stuck(f"model {model_id!r}")  # queued, it could never run
        queued = functools.partial(self._queued, model_id)
        if any(has_images(job) for job in jobs):  # decoded before the queue
            return await with_prepared(jobs, self.settings.images, functools.partial(
                self._leased, model_id), functools.partial(self.run_jobs, model_id))
        if tracing.TRACER is not None:  # traces on: a span per traced job, around the rest
            return await tracing.in_pool(queued, jobs, self.pool, model_id)
        return await queued(jobs)

    async def _leased(self, model_id: str, fn: Callable[[Encoder], Any]) -> Any:
        """``fn(encoder)`` in a thread of its own (not a worker's), under a lease."""
        for _ in range(LEASE_TRIES):
            holder = await self.models.holder(model_id)
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
            holder = await self.models.holder(model_id)
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
        models = self.models
        return {"pool": self.pool, "device": self.device,
                "workers": self.pool_settings.worker_count, "loaded": list(models.loaded),
                "backends": dict(models.backends), "auto_choices": dict(models.auto_choices),
                "evicted": list(models.evicted), "evictions": models.evictions,
                "pid": os.getpid(), "rss_bytes": rss_bytes(), "malloc": malloc.info(),
                "batches_run": dict(self.batches_run), "texts_run": dict(self.texts_run),
                "waiting_texts": {m: b.waiting for m, b in self.batchers.items()},
                "running_batches": {m: b.in_flight for m, b in self.batchers.items()},
                "busy_workers": self.workers.busy, "stuck_workers": self.workers.stuck,
                "waiting_for_workers": self.workers.waiting,
                "loading": models.loads.loading, "queued_loads": models.loads.queued,
                "load_overdue_s": round(models.loads.overdue_s(), 3),
                "memory": models.memory_stats()}

    def model_states(self) -> dict[str, dict[str, Any]]:
        """Each model this replica holds, loads, waits to load or failed to load, with its
        state (for the admin API's listing; a failure says only its public message)."""
        return self.models.states()
