"""The ingress: HTTP requests and Ray handle calls in, pool calls out."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from ray import serve
from ray.exceptions import RayError, RayTaskError
from ray.serve.exceptions import (
    BackPressureError,
    DeploymentUnavailableError,
    ReplicaUnavailableError,
    RequestCancelledError,
)
from ray.serve.handle import DeploymentHandle

from blitz import timing
from blitz.encoders.base import Encoded
from blitz.encoders.postprocess import OutputDtype
from blitz.errors import Overloaded, Unavailable
from blitz.grpc_api.servicer import TeiServicer
from blitz.http.api import HttpApi
from blitz.http.middleware import warn_if_open
from blitz.ingress import status
from blitz.ingress.outputs import OutputService
from blitz.ingress.service import EmbeddingService
from blitz.ingress.tokenizing import OffsetUnit, TokenService
from blitz.pool.batching import Batcher
from blitz.pool.local_hop import HopLost
from blitz.pool.work import Job
from blitz.schemas import (
    ClassifyResult,
    DecodeResult,
    EmbedJob,
    EmbedResult,
    RerankJob,
    RerankResult,
    SimilarityResult,
    SparseResult,
    TokenEmbeddingsResult,
    TokenizeResult,
)
from blitz.settings.config import BlitzSettings
from deployments.grpc_methods import GrpcMethods
from deployments.local_hops import LocalHops
from deployments.logs import flush_replica_log, route_library_logs_to_serve
from deployments.loopback import (
    http_host,
    keep_grpc_on_http_host,
    keep_replica_grpc_on_node_ip,
)
from deployments.metrics import metrics
from deployments.placement import PlacementWatch
from deployments.pool import in_process
from deployments.replicas import PoolWaker, running_replicas, watch

logger = logging.getLogger("ray.serve")

# pool calls in flight per (pool, model) and pool replica before requests wait to be
# merged: at least two keep a replica busy while the ingress gathers the next (with
# `workers: 2`, both compute at once; three measured 0.89x on int8 single, 0.95x batch32),
# and one per worker so that every worker of a bigger replica has a batch
CALLS_IN_FLIGHT_PER_REPLICA = 2


def calls_in_flight(workers: int, replicas: int) -> int:
    """Pool calls one ingress lane keeps in flight to a pool of ``replicas`` replicas with
    ``workers`` worker threads each."""
    return max(CALLS_IN_FLIGHT_PER_REPLICA, workers) * max(1, replicas)

# Plain pickle both ways on the handle hop: cloudpickle (Serve's default) costs more per
# object, and jobs, results and Blitz's errors are importable classes on both sides
# (docs/ray-notes.md, "Request path cost").
SERIALIZATION = "pickle"
REPLICA_POLL_S = 0.1  # how often a call waiting for a pool replica looks again

try:  # Serve's gRPC transport (throughput-optimized mode) raises these when a replica dies
    from grpc.aio import AioRpcError as _RpcError
except ImportError:  # pragma: no cover - grpc ships with ray[serve]
    _RpcError = RayError

REPLICA_FAILURES = (ReplicaUnavailableError, DeploymentUnavailableError, _RpcError, RayError)


class ServeDispatcher:
    """Runs jobs on pool replicas, passing the model id on every hop.

    Concurrent jobs of every kind for one pool and model go through one ``Batcher``, this
    hop's one queue: they become one pool call (``run_jobs``) that answers each job on its
    own, bounded in texts waiting and in calls in flight, and timed by ``pool_timeout_s``. A replica
    that dies mid-call is retried once (embedding and scoring are idempotent), then
    answered 503 with Retry-After; a full queue is a 503 at once. What a replica raised
    arrives as Ray's ``RayTaskError`` and is passed on: ``as_blitz_error`` answers its cause.
    """

    def __init__(self, settings: BlitzSettings, handles: dict[str, DeploymentHandle]):
        self.settings = settings
        self.handles = handles
        self.pools = frozenset(handles)
        self._lanes: dict[tuple[str, str], Batcher] = {}
        self._waker = PoolWaker(handles, settings.ingress.pool_timeout_s)
        self._hops = LocalHops(settings, handles)
        self.placement = PlacementWatch(
            _app_name(), {pool: handle.deployment_name for pool, handle in handles.items()},
            after_s=settings.ingress.unplaced_after_s)
        self.placement.start()
        for handle in handles.values():
            watch(handle)

    def max_batch(self, pool: str) -> int:
        return self.settings.pool(pool).max_batch_size

    def running_pools(self) -> frozenset[str]:
        """Pools with a running replica, as the handles' routers know them (no call)."""
        return frozenset(pool for pool, handle in self.handles.items()
                         if running_replicas(handle) != 0)

    def wake(self, pool: str) -> None:
        self._waker.wake(pool)

    def unplaced_pools(self) -> dict[str, str]:
        self.placement.start()  # in case the constructor ran without a loop
        return self.placement.problems

    async def _call(self, pool: str, model_id: str, method: str, arg: Any) -> Any:
        hop = self._hops.client(pool)
        if hop is not None:  # the pool's one replica, on this node: no Serve hop
            started = time.perf_counter()
            try:
                results = await hop.call(model_id, arg)
            except HopLost as exc:  # it died or was replaced: Serve's handle, as below
                metrics.pool_failures.inc(tags={"pool": pool, "outcome": "retried"})
                logger.warning("%s pool call over the local hop failed (%s); retrying over "
                               "Serve's handle", pool, exc)
            else:
                timing.mark(results, "ingress-queue", started)
                timing.record(results, call=time.perf_counter() - started)
                return results
        handle = self.handles[pool].options(multiplexed_model_id=model_id,
                                            request_serialization=SERIALIZATION,
                                            response_serialization=SERIALIZATION)
        for attempt in (1, 2):
            try:
                await self._await_replica(pool)
                started = time.perf_counter()
                results = await getattr(handle, method).remote(arg)
                timing.mark(results, "ingress-queue", started)
                timing.record(results, call=time.perf_counter() - started)
                return results
            except BackPressureError as exc:
                metrics.rejected.inc(tags={"hop": f"{pool}-serve-queue"})
                raise Overloaded(f"the {pool} pool is at capacity; retry shortly") from exc
            except RequestCancelledError:
                raise asyncio.CancelledError() from None
            except RayTaskError:  # the replica raised: no retry, the same job would fail
                raise
            except REPLICA_FAILURES as exc:
                if attempt == 1:
                    metrics.pool_failures.inc(tags={"pool": pool, "outcome": "retried"})
                    logger.warning("%s pool call failed (%s); retrying once", pool,
                                   type(exc).__name__)
                    continue
                metrics.pool_failures.inc(tags={"pool": pool, "outcome": "unavailable"})
                raise Unavailable(f"the {pool} pool is restarting; retry shortly") from exc
        raise AssertionError("unreachable")

    async def _await_replica(self, pool: str) -> None:
        """Serve's router waits for a replica without end. A pool that keeps replicas
        (``min_replicas`` > 0) but has none running now (replaced in place on a full
        cluster, or restarting) gets ``ingress.replica_wait_s`` to show one, then its
        callers get 503 + Retry-After instead of waiting out their clients."""
        handle = self.handles[pool]
        if running_replicas(handle) != 0 or self.settings.pool(pool).min_replicas == 0:
            return
        deadline = time.monotonic() + self.settings.ingress.replica_wait_s
        while running_replicas(handle) == 0:
            if time.monotonic() >= deadline:
                metrics.pool_failures.inc(tags={"pool": pool, "outcome": "unavailable"})
                raise Unavailable(f"the {pool} pool has no running replica (it is being "
                                  "replaced or restarting); retry shortly")
            await asyncio.sleep(REPLICA_POLL_S)

    def _lane(self, pool: str, model_id: str) -> Batcher:
        """The one queue for ``model_id``'s jobs of every kind on ``pool``."""
        lane = self._lanes.get((pool, model_id))
        if lane is None:
            settings = self.settings.pool(pool)
            lane = self._lanes[(pool, model_id)] = Batcher(
                lambda jobs: self._call(pool, model_id, "run_jobs", jobs),
                max_batch=settings.max_batch_size,
                max_waiting=self.settings.ingress.max_queued_texts,
                max_in_flight=calls_in_flight(settings.worker_count, settings.max_replicas),
                timeout_s=self.settings.ingress.pool_timeout_s,
                name=f"{pool} pool queue for {model_id!r}",
                on_reject=lambda: metrics.rejected.inc(tags={"hop": "ingress"}),
                on_waiting=metrics.waiting("ingress", pool, model_id))
        return lane

    async def embed(self, pool: str, model_id: str, job: EmbedJob) -> Encoded:
        return await self.submit(pool, model_id, job)

    async def rerank(self, pool: str, model_id: str, job: RerankJob) -> Encoded:
        return await self.submit(pool, model_id, job)

    async def submit(self, pool: str, model_id: str, job: Job) -> Encoded:
        entered = time.perf_counter()
        result = await self._lane(pool, model_id).submit(job)
        timing.since([result], "ingress-queue", entered)
        return result


class InProcessCpuDispatcher(ServeDispatcher):
    """``ServeDispatcher`` with the CPU pool inside this replica (``ingress.cpu_pool:
    in_process``): CPU pool calls go to the pool object here, with the same per-(pool,
    model) queue in front of them; GPU pool calls still take the handle hop."""

    def __init__(self, settings: BlitzSettings, cpu_pool: Any,
                 handles: dict[str, DeploymentHandle]):
        super().__init__(settings, handles)
        self.cpu_pool = cpu_pool
        self.pools = self.pools | {"cpu"}

    def running_pools(self) -> frozenset[str]:
        return super().running_pools() | {"cpu"}  # it runs wherever this code runs

    async def _call(self, pool: str, model_id: str, method: str, arg: Any) -> Any:
        if pool != "cpu":
            return await super()._call(pool, model_id, method, arg)
        started = time.perf_counter()
        results = await getattr(self.cpu_pool, f"{method}_for")(model_id, arg)
        timing.mark(results, "ingress-queue", started)
        timing.record(results, call=time.perf_counter() - started)
        return results


def _app_name() -> str:
    try:
        return serve.get_replica_context().app_name
    except Exception:  # outside a replica (tests): the default app's name
        return "blitz"


class _IngressMethods(GrpcMethods):
    """What both ingress deployments answer: HTTP (the ASGI app), gRPC (TEI's services,
    ``deployments/grpc_methods.py``) and the handle API."""

    settings: BlitzSettings
    dispatcher: ServeDispatcher
    service: EmbeddingService
    tokens: TokenService
    outputs: OutputService
    api: HttpApi

    def _serve(self, dispatcher: ServeDispatcher) -> None:
        self.dispatcher = dispatcher
        self.service = EmbeddingService(self.settings, dispatcher,
                                        observer=metrics.observe_request,
                                        route_observer=metrics.observe_route)
        self.tokens = TokenService(self.service)
        self.outputs = OutputService(self.service, self.tokens)
        self.api = HttpApi(self.service, self.tokens, self.outputs)
        self.grpc = TeiServicer(self.service, self.tokens, self.outputs)
        host = http_host()
        keep_grpc_on_http_host(host)  # before Serve starts this replica's gRPC server
        warn_if_open(host, self.settings.auth)
        flush_replica_log()

    def __serve_build_asgi_app__(self) -> HttpApi:
        return self.api

    async def embed(self, texts: str | list[str], model: str | None = None, *,
                    normalize: bool | None = None, truncate: bool = True,
                    dimensions: int | None = None, dtype: OutputDtype = "float32",
                    prompt_name: str | None = None) -> EmbedResult:
        """Handle API: ``await handle.embed.remote(texts, model="minilm")``; the options
        are ``POST /embed``'s."""
        return await self.service.embed(texts, model=model, normalize=normalize,
                                        truncate=truncate, dimensions=dimensions, dtype=dtype,
                                        prompt_name=prompt_name)

    async def rerank(self, query: str, documents: list[str], model: str | None = None, *,
                     top_n: int | None = None, return_documents: bool = False,
                     truncate: bool = True) -> RerankResult:
        """Handle API: ``await handle.rerank.remote(query, documents, model=...)``; the
        options are ``POST /rerank``'s."""
        return await self.service.rerank(query, documents, model=model, top_n=top_n,
                                         return_documents=return_documents,
                                         truncate=truncate)


    async def embed_all(self, texts: str | list[str], model: str | None = None, *,
                        truncate: bool = True,
                        prompt_name: str | None = None) -> TokenEmbeddingsResult:
        """Handle API: ``await handle.embed_all.remote(texts, model=...)``; the options are
        ``POST /embed_all``'s."""
        return await self.outputs.embed_all(texts, model=model, truncate=truncate,
                                            prompt_name=prompt_name)

    async def embed_sparse(self, texts: str | list[str], model: str | None = None, *,
                           truncate: bool = True,
                           prompt_name: str | None = None) -> SparseResult:
        """Handle API: ``await handle.embed_sparse.remote(texts, model=...)``; the options
        are ``POST /embed_sparse``'s."""
        return await self.outputs.embed_sparse(texts, model=model, truncate=truncate,
                                               prompt_name=prompt_name)

    async def similarity(self, source: str, sentences: list[str], model: str | None = None,
                         *, truncate: bool = True,
                         prompt_name: str | None = None) -> SimilarityResult:
        """Handle API: ``await handle.similarity.remote(source, sentences, model=...)``;
        ``POST /similarity``."""
        return await self.outputs.similarity(source, sentences, model=model,
                                             truncate=truncate, prompt_name=prompt_name)

    async def classify(self, inputs: str | list[str] | list[list[str]],
                       model: str | None = None, *, raw_scores: bool = False,
                       top_k: int | None = None, truncate: bool = True) -> ClassifyResult:
        """Handle API: ``await handle.classify.remote(texts, model=...)``: each text's (or
        ``[text, text]`` pair's) label scores; ``POST /predict`` and ``/classify``."""
        return await self.outputs.classify(inputs, model=model, raw_scores=raw_scores,
                                           top_k=top_k, truncate=truncate)

    async def tokenize(self, texts: str | list[str], model: str | None = None, *,
                       add_special_tokens: bool = True, prompt_name: str | None = None,
                       return_offsets: bool = True,
                       offsets: OffsetUnit = "chars") -> TokenizeResult:
        """Handle API: ``await handle.tokenize.remote(texts, model=...)``; the options are
        ``POST /tokenize``'s."""
        return await self.tokens.tokenize(texts, model=model,
                                          add_special_tokens=add_special_tokens,
                                          prompt_name=prompt_name,
                                          return_offsets=return_offsets, offsets=offsets)

    async def decode(self, ids: list[int] | list[list[int]], model: str | None = None, *,
                     skip_special_tokens: bool = True) -> DecodeResult:
        """Handle API: ``await handle.decode.remote(ids, model=...)``; ``POST /decode``."""
        return await self.tokens.decode(ids, model=model,
                                        skip_special_tokens=skip_special_tokens)

    async def info(self, model: str | None = None) -> dict[str, Any]:
        """Handle API: ``await handle.info.remote()``; ``GET /info``."""
        return status.info(self.service, model)


@serve.deployment
@serve.ingress()  # HTTP: the ASGI app from __serve_build_asgi_app__, no adapter in between
class Ingress(_IngressMethods):
    """The ingress with the pools in replicas of their own (``ingress.cpu_pool: replicas``)."""

    def __init__(self, settings: dict[str, Any], cpu_pool: DeploymentHandle,
                 gpu_pool: DeploymentHandle | None = None):
        route_library_logs_to_serve()
        keep_replica_grpc_on_node_ip()
        self.settings = BlitzSettings.from_args(settings)
        handles = {"cpu": cpu_pool} | ({"gpu": gpu_pool} if gpu_pool is not None else {})
        self._serve(ServeDispatcher(self.settings, handles))

    async def check_health(self) -> None:  # Serve calls it every few seconds
        self.dispatcher.placement.start()  # the constructor may have run without a loop


@serve.deployment
@serve.ingress()
class IngressWithCpuPool(_IngressMethods):
    """The ingress with the CPU pool inside it (``ingress.cpu_pool: in_process``): built
    like a CPU pool replica (its ``preload`` models resident before the first request),
    and unhealthy when that pool is."""

    async def __init__(self, settings: dict[str, Any],  # type: ignore[misc]
                       gpu_pool: DeploymentHandle | None = None):
        route_library_logs_to_serve()
        keep_replica_grpc_on_node_ip()
        self.settings = BlitzSettings.from_args(settings)
        self.cpu_pool = await in_process(settings, "cpu")
        handles = {"gpu": gpu_pool} if gpu_pool is not None else {}
        self._serve(InProcessCpuDispatcher(self.settings, self.cpu_pool, handles))

    async def check_health(self) -> None:
        self.dispatcher.placement.start()
        await self.cpu_pool.check_health()
