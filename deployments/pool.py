"""The model pool: one class, bound as the CPU pool and (when GPUs exist) the GPU pool.

Each replica holds up to three models (``@serve.multiplexed``, LRU) and batches
concurrent jobs of every kind (texts, token ids, reranks) per model with one
``blitz.pool.batching.Batcher``, the replica's one queue per model; it serves only the
registry's ids. Model work runs on ``workers`` worker threads (``blitz.pool.worker_slots``:
that many model calls at once, each with ``torch_threads`` intra-op threads) and each
model load on a thread of its own (``blitz.pool.load_queue``: one load at a time, shared by
its callers, within ``load_timeout_s``), never on the replica's event loop, so a long
load (an ONNX export, say) does not stall the models already resident. Work holds a
lease on its model, so an eviction never frees a model mid-batch. A load or all workers
stuck past their deadlines fail ``check_health``, and Serve replaces the replica.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import Coroutine
from typing import Any

import ray
from ray import serve

from blitz import timing
from blitz.encoders.base import Encoded, Encoder
from blitz.encoders.sparse import cap_token_budget
from blitz.errors import ModelLoadFailed, Overloaded, Unavailable
from blitz.loading.failures import LoadFailures, as_load_failure
from blitz.loading.fetch import preflight_source
from blitz.loading.load import load_encoder, resolve_device
from blitz.pool.batching import Batcher
from blitz.pool.holder import ModelFreed, ModelHolder
from blitz.pool.load_queue import LoadQueue
from blitz.pool.local_hop import LocalHopServer
from blitz.pool.work import Job, run_jobs
from blitz.pool.worker_slots import WorkerSlots
from blitz.runtime import gpu_memory, lean_imports, malloc, model_threads
from blitz.settings.config import MAX_MODELS_PER_REPLICA, BlitzSettings
from blitz.settings.registry import ModelSpec
from deployments.logs import flush_replica_log, route_library_logs_to_serve
from deployments.loopback import keep_replica_grpc_on_node_ip
from deployments.metrics import metrics

logger = logging.getLogger("ray.serve")
EVICTIONS_KEPT = 32  # the last evicted ids kept for stats(); the count is kept in full
LEASE_TRIES = 3  # a model evicted between lookup and use is loaded again this often


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@serve.deployment
class ModelPool:
    async def __init__(self, settings: dict[str, Any], pool: str):  # type: ignore[misc]
        """Serve awaits this (it accepts an async constructor) before it routes anything
        here, so the models in the pool's ``preload`` are resident before the first
        request, and the replica does not start at all if one of them cannot load."""
        constructed = time.perf_counter()
        lean_imports.defer_sklearn_metrics()  # before sentence-transformers is imported
        malloc.fix_mmap_threshold()  # before any model: weights in mappings of their own
        self.settings = BlitzSettings.from_args(settings)
        self.registry = self.settings.registry()
        self.pool = pool
        self.pool_settings = self.settings.pool(pool)
        self.device = resolve_device("cuda" if pool == "gpu" else "cpu")
        self.cache_dir = self.settings.resolved_cache_dir()
        self.workers = WorkerSlots(self.pool_settings.worker_count,
                                   stuck_after_s=self.pool_settings.call_timeout_s,
                                   name=f"blitz-{pool}")
        self.loads: LoadQueue[Encoder] = LoadQueue(
            deadline_s=self.pool_settings.load_timeout_s, name=f"blitz-{pool}-load",
            on_failure=lambda model_id, exc: self._load_failed(self.registry.get(model_id), exc))
        # torch itself is imported only if a model needs it (blitz.runtime.model_threads)
        model_threads.configure(self.pool_settings.torch_threads)
        route_library_logs_to_serve()
        keep_replica_grpc_on_node_ip()
        self.failures = LoadFailures(self.pool_settings.load_failure_ttl_s)
        self._batchers: dict[str, Batcher] = {}
        self.batches_run: dict[str, int] = {}  # per model: batches, and the texts in them
        self.texts_run: dict[str, int] = {}
        self.loaded: list[str] = []  # resident models, least recently loaded first
        self.backends: dict[str, str] = {}  # resident model -> the backend serving it
        self.auto_choices: dict[str, dict[str, Any]] = {}  # cpu_backend auto: the choice
        self.evicted: deque[str] = deque(maxlen=EVICTIONS_KEPT)
        self.evictions = 0
        self._hop: LocalHopServer | None = None  # made when an ingress first asks for it
        self._memory_reports = (  # for as long as the replica lives
            asyncio.get_running_loop().create_task(gpu_memory.report_forever(
                metrics.gpu_memory_publisher(pool))) if self.device.startswith("cuda") else None)
        await self._preload()
        self.constructor_s = round(time.perf_counter() - constructed, 3)
        logger.info("%s pool replica constructed in %.2f s (preload included)", pool,
                    self.constructor_s)
        flush_replica_log()

    # ---- models ----------------------------------------------------------------------

    @serve.multiplexed(max_num_models_per_replica=MAX_MODELS_PER_REPLICA)
    async def get_model(self, model_id: str) -> ModelHolder:
        """Serve's loader (it runs one at a time). A caller that gives up leaves the load
        running for the next caller of the id; a failure comes through ``_load_failed``
        (the queue's ``on_failure``), so it is remembered and counted once per load."""
        spec = self.registry.get(model_id)  # only registered ids ever load
        started = time.perf_counter()
        timeout = self.pool_settings.load_timeout_s

        def load() -> Encoder:
            # the deadline travels with the load: a child build or measurement dies with it
            encoder = load_encoder(spec, self.device, self.cache_dir, timeout_s=timeout)
            cap_token_budget(encoder, self.pool_settings.sparse_token_budget)
            encoder.warmup()
            malloc.trim()  # what the load only passed through (file reads, graph
            # optimisation) back to the system: glibc would keep it (blitz.pool.holder)
            return encoder

        encoder = await self.loads.load(model_id, load)
        seconds = time.perf_counter() - started
        metrics.model_load_seconds.observe(seconds, tags={"model": model_id, "pool": self.pool})
        metrics.model_loads.inc(tags={"model": model_id, "pool": self.pool, "result": "loaded"})
        logger.info("loaded model %r on %s (%s) in %.2fs", model_id, self.device,
                    encoder.backend, seconds)
        self.loaded.append(model_id)
        self.backends[model_id] = encoder.backend
        if encoder.auto_choice is not None:
            self.auto_choices[model_id] = encoder.auto_choice
        flush_replica_log()
        return ModelHolder(encoder, on_release=self._released)

    async def _preload(self) -> None:
        """Load the pool's ``preload`` models through ``get_model``, Serve's multiplexed
        loader, called with the id (there is no request context yet). Serve's LRU then
        holds them and the replica reports their ids to the controller, so routing sends
        their requests here."""
        for model_id in self.pool_settings.preload:
            await self._holder(model_id)
        if self.pool_settings.preload:
            logger.info("%s pool replica preloaded %s", self.pool, self.pool_settings.preload)

    def _load_failed(self, spec: ModelSpec, exc: BaseException) -> ModelLoadFailed:
        """The one way a failed load ends: one ``ModelLoadFailed``, remembered for
        ``load_failure_ttl_s`` and counted."""
        error = as_load_failure(spec.id, exc, spec.source)
        self.failures.remember(spec.id, error)
        metrics.model_loads.inc(tags={"model": spec.id, "pool": self.pool, "result": "failed"})
        return error

    def _released(self, model_id: str) -> None:
        if model_id in self.loaded:
            self.loaded.remove(model_id)
        self.backends.pop(model_id, None)
        self.auto_choices.pop(model_id, None)
        self.evicted.append(model_id)
        self.evictions += 1
        metrics.model_evictions.inc(tags={"model": model_id, "pool": self.pool})
        logger.info("evicted model %r", model_id)
        flush_replica_log()

    async def _holder(self, model_id: str) -> ModelHolder:
        """The model's holder. A load that failed recently, or a local source that is
        missing, fails here, before Serve's multiplexer evicts a healthy model for it."""
        if model_id not in self.loaded:
            self.failures.check(model_id)
            spec = self.registry.get(model_id)  # an unknown id is a 404, not a failed load
            try:
                preflight_source(spec)
            except Exception as exc:
                raise self._load_failed(spec, exc) from exc
        return await self.get_model(model_id)

    async def check_health(self) -> None:
        """Serve calls this every ``health_check_period_s`` (2 s) on the replica's loop;
        raising makes Serve replace the replica (after three in a row): a model load
        stuck past ``load_timeout_s`` (no other model can load), or every worker stuck in
        a call past ``call_timeout_s`` (no work can run)."""
        problem = self.loads.problem() or self.workers.problem()
        if problem is not None:
            logger.error("unhealthy %s pool replica: %s", self.pool, problem)
            raise RuntimeError(problem)

    async def _run(self, model_id: str, fn) -> tuple[Any, float, float]:
        """``fn(encoder)`` on a worker thread, holding a lease on the model throughout;
        with the seconds it waited for the thread (the hand-off included) and ran there."""
        what = f"model {model_id!r}"
        for _ in range(LEASE_TRIES):
            self.workers.refuse_if_stuck(what)  # before loading a model for nothing
            holder = await self._holder(model_id)
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
            return result, ran[0] - asked, ran[1] - ran[0]
        raise Unavailable(f"model {model_id!r} was evicted {LEASE_TRIES} times in a row "
                          "while waiting; the pool holds too many models for its load")

    # ---- work ------------------------------------------------------------------------

    async def run_jobs(self, jobs: list[Job]) -> list[Encoded | BaseException]:
        """Several requests' jobs in one call (the ingress merges concurrent ones), of any
        kind: they enter the model's one queue together, so they can share a batch, and
        each gets its own result or error, so one bad job fails alone."""
        return await self.run_jobs_for(self._model_id(), jobs)

    async def run_jobs_for(self, model_id: str, jobs: list[Job]) -> list[Encoded | BaseException]:
        """``run_jobs`` for ``model_id`` named by the caller: a pool inside the ingress's
        replica (``in_process``) has no Serve request to carry the id."""
        self.registry.get(model_id)  # an unknown id: UnknownModel (404)
        self.workers.refuse_if_stuck(f"model {model_id!r}")  # queued, it could never run
        entered = time.perf_counter()
        try:
            results = await self._batcher(model_id).submit_many(jobs)
        except Overloaded as exc:
            return [exc] * len(jobs)
        timing.since(results, "pool-queue", entered)
        timing.record(results, pool=time.perf_counter() - entered)
        return results

    async def local_hop_address(self) -> dict[str, Any]:
        """Where an ingress on this node calls ``run_jobs_for`` without Serve's hop
        (``blitz.pool.local_hop``; the ingress asks when ``ingress.pool_hop`` is ``auto`` and
        this pool runs one fixed replica)."""
        if self._hop is None:
            hop = LocalHopServer(self.run_jobs_for)
            await hop.start()
            self._hop = hop
        return {"path": self._hop.path, "pid": os.getpid(),
                "node_id": ray.get_runtime_context().get_node_id()}

    def __del__(self) -> Coroutine[Any, Any, None] | None:
        """Serve calls this when the replica stops (and Python again): the local hop's
        socket and folder go. Calls the local hop is answering are not Serve requests, so
        Serve's drain does not wait for them: with some in flight, this returns a
        coroutine that Serve awaits (``_call_func_or_gen`` awaits a coroutine a sync
        method returns), which answers them (within ``call_timeout_s``) before closing."""
        hop = getattr(self, "_hop", None)
        if hop is None:
            return None
        self._hop = None
        if hop.in_flight:
            try:
                asyncio.get_running_loop()
            except RuntimeError:  # Python's own call, off any loop: nothing can be awaited
                pass
            else:
                return self._drain_hop(hop)
        hop.close()
        return None

    async def _drain_hop(self, hop: LocalHopServer) -> None:
        logger.info("stopping: answering %d call(s) the local hop holds first", hop.in_flight)
        if not await hop.drain(self.pool_settings.call_timeout_s):
            logger.warning("stopping: local hop calls still unanswered after %.0f s",
                           self.pool_settings.call_timeout_s)

    def _model_id(self) -> str:
        """The request's model id (``run_jobs_for`` checks it: a handle caller can send
        any id, and none may create a batcher or a metric label here)."""
        return serve.get_multiplexed_model_id()

    def _batcher(self, model_id: str) -> Batcher:
        batcher = self._batchers.get(model_id)
        if batcher is None:
            batcher = self._batchers[model_id] = Batcher(
                lambda jobs: self._run_batch(model_id, jobs),
                max_batch=self.pool_settings.max_batch_size,
                max_waiting=self.pool_settings.max_queued_texts,
                max_in_flight=self.pool_settings.worker_count,
                name=f"{self.pool} pool, model {model_id!r}",
                on_reject=lambda: metrics.rejected.inc(tags={"hop": self.pool}),
                on_waiting=metrics.waiting("pool", self.pool, model_id))
        return batcher

    async def _run_batch(self, model_id: str, jobs: list[Job]) -> list:
        started = time.perf_counter()
        texts = sum(len(j) for j in jobs)
        metrics.observe_batch(self.pool, texts)
        self.batches_run[model_id] = self.batches_run.get(model_id, 0) + 1
        self.texts_run[model_id] = self.texts_run.get(model_id, 0) + texts
        results, waited, ran = await self._run(model_id, lambda encoder: run_jobs(encoder, jobs))
        timing.mark(results, "pool-queue", started)
        timing.record(results, worker_wait=waited, model=ran)
        real = sum(int(r.token_counts.sum()) for r in results if isinstance(r, Encoded))
        padded = sum(r.padded_tokens for r in results if isinstance(r, Encoded))
        if padded:  # billed tokens can pass computed ones: an embedding model's rerank
            # bills its query once per document but computes it once
            metrics.observe_padding(self.pool, min(1.0, real / padded))
        return results

    async def stats(self) -> dict[str, Any]:
        """What this replica holds: for tests and operators."""
        return {"pool": self.pool, "device": self.device, "workers": self.pool_settings.worker_count,
                "loaded": list(self.loaded),
                "backends": dict(self.backends), "auto_choices": dict(self.auto_choices),
                "evicted": list(self.evicted), "evictions": self.evictions,
                "pid": os.getpid(), "constructor_s": self.constructor_s,
                "node_id": ray.get_runtime_context().get_node_id(),
                "rss_bytes": _rss_bytes(), "malloc": malloc.info(),
                "batches_run": dict(self.batches_run), "texts_run": dict(self.texts_run),
                "local_hop_calls": self._hop.calls if self._hop is not None else None,
                "waiting_texts": {m: b.waiting for m, b in self._batchers.items()},
                "running_batches": {m: b.in_flight for m, b in self._batchers.items()},
                "busy_workers": self.workers.busy, "stuck_workers": self.workers.stuck,
                "waiting_for_workers": self.workers.waiting,
                "loading": self.loads.loading, "queued_loads": self.loads.queued,
                "load_overdue_s": round(self.loads.overdue_s(), 3)}


async def in_process(settings: dict[str, Any], pool: str = "cpu") -> Any:
    """Pool ``pool``'s replica object, built inside the calling replica (the ingress, with
    ``ingress.cpu_pool: in_process``): the same models, queues, worker threads, health
    check and metrics as a replica of its own, called without a Serve hop. Serve builds a
    replica the same way: the object first, then its async constructor awaited."""
    cls = ModelPool.func_or_class  # type: ignore[attr-defined]
    replica = cls.__new__(cls)
    await replica.__init__(settings, pool)
    return replica
