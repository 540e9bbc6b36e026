"""The ingress: HTTP requests and Ray handle calls in, pool calls out."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
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

from blitz.encoders.base import Encoded
from blitz.errors import Overloaded, Unavailable
from blitz.grpc_api.servicer import TeiServicer
from blitz.http import internal
from blitz.http.api import HttpApi
from blitz.http.middleware import warn_if_open
from blitz.ingress.images import ImageService
from blitz.ingress.other_outputs import OutputService
from blitz.ingress.parts import PartsService
from blitz.ingress.queues import PoolQueues, QueueObservers, stamped
from blitz.ingress.service import EmbeddingService
from blitz.ingress.services import Services
from blitz.ingress.tokenizing import TokenService
from blitz.pool.dispatcher import ReplicaDispatcher
from blitz.pool.local_hop import HopLost
from blitz.pool.mixed_batch import Job
from blitz.runtime import collector, tracing
from blitz.settings.config import BlitzSettings
from deployments.bind_addresses import (
    http_host,
    keep_grpc_on_http_host,
    keep_replica_grpc_on_node_ip,
)
from deployments.draining import DrainWatch
from deployments.grpc_methods import GrpcMethods
from deployments.handle_methods import HandleMethods
from deployments.local_hops import LocalHops
from deployments.logs import flush_replica_log, route_library_logs_to_serve
from deployments.metrics import metrics
from deployments.model_admin import (
    AdminMethods,
    IngressFollower,
    app_name,
    model_admin,
    replica_name,
)
from deployments.placement import PlacementWatch
from deployments.pool import in_process
from deployments.replicas import PoolWaker, running_replicas, watch

logger = logging.getLogger("ray.serve")

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


QUEUE_OBSERVERS = QueueObservers(
    rejected=lambda: metrics.rejected.inc(tags={"hop": "ingress"}),
    waiting=lambda pool, model_id: metrics.waiting("ingress", pool, model_id),
    waited=lambda pool: metrics.waited("ingress", pool))


class ServeDispatcher:
    """Runs jobs on pool replicas, passing the model id on every hop.

    Jobs wait in the ingress's queue table (``blitz.ingress.queues.PoolQueues``: one queue
    per pool and model, a full one a 503 at once); each pool call goes over the local hop
    or Serve's handle. A replica that dies mid-call is retried once (embedding and scoring
    are idempotent), then answered 503 with Retry-After. What a replica raised arrives as
    Ray's ``RayTaskError`` and is passed on: ``as_blitz_error`` answers its cause.
    """

    def __init__(self, settings: BlitzSettings, handles: dict[str, DeploymentHandle]):
        self.settings = settings
        self._max_batch = settings.max_batch_sizes()
        self.handles = handles
        self.pools = frozenset(handles)
        self.queues = PoolQueues(settings, self._run_jobs, QUEUE_OBSERVERS)
        # ``job`` through the one queue for its pool and model (no call in between)
        self.submit: Callable[[str, str, Job], Coroutine[Any, Any, Encoded]] = self.queues.submit
        self._waker = PoolWaker(handles, settings.ingress.pool_timeout_s)
        self._hops = LocalHops(settings, handles)
        self.placement = PlacementWatch(
            app_name(), {pool: handle.deployment_name for pool, handle in handles.items()},
            after_s=settings.ingress.unplaced_after_s)
        self.placement.start()
        for handle in handles.values():
            watch(handle)

    def max_batch(self, pool: str) -> int:
        return self._max_batch[pool]

    def running_pools(self) -> frozenset[str]:
        """Pools with a running replica, as the handles' routers know them (no call)."""
        return frozenset(pool for pool, handle in self.handles.items()
                         if running_replicas(handle) != 0)

    def wake(self, pool: str) -> None:
        self._waker.wake(pool)

    def unplaced_pools(self) -> dict[str, str]:
        self.placement.start()  # in case the constructor ran without a loop
        return self.placement.problems

    async def _run_jobs(self, pool: str, model_id: str, jobs: list[Job]) -> Any:
        """One pool call of the queue's (``PoolQueues``): ``jobs`` on a replica of ``pool``."""
        hop = self._hops.client(pool)
        if hop is not None:  # the pool's one replica, on this node: no Serve hop
            try:
                started = time.perf_counter()
                return stamped(await hop.call(model_id, jobs), started)
            except HopLost as exc:  # it died or was replaced: Serve's handle, as below
                metrics.pool_failures.inc(tags={"pool": pool, "outcome": "retried"})
                logger.warning("%s pool call over the local hop failed (%s); retrying over "
                               "Serve's handle", pool, exc)
        handle = self.handles[pool].options(multiplexed_model_id=model_id,
                                            request_serialization=SERIALIZATION,
                                            response_serialization=SERIALIZATION)
        for attempt in (1, 2):
            try:
                await self._await_replica(pool)
                started = time.perf_counter()
                return stamped(await handle.run_jobs.remote(jobs), started)
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

    def forget(self, model_id: str) -> None:
        """Drop ``model_id``'s queues (a model the admin API removed; any thread)."""
        self.queues.forget(model_id)


class InProcessCpuDispatcher(ServeDispatcher):
    """``ServeDispatcher`` with the CPU pool inside this replica (``ingress.cpu_pool:
    in_process``): CPU pool calls go to the pool object here, with the same per-(pool,
    model) queue in front of them; GPU pool calls still take the handle hop."""

    def __init__(self, settings: BlitzSettings, cpu_pool: ReplicaDispatcher,
                 handles: dict[str, DeploymentHandle]):
        super().__init__(settings, handles)
        self.cpu_pool = cpu_pool
        self.pools = self.pools | {"cpu"}

    def running_pools(self) -> frozenset[str]:
        return super().running_pools() | {"cpu"}  # it runs wherever this code runs

    async def _run_jobs(self, pool: str, model_id: str, jobs: list[Job]) -> Any:
        if pool != "cpu":
            return await super()._run_jobs(pool, model_id, jobs)
        started = time.perf_counter()
        return stamped(await self.cpu_pool.run_jobs_for(model_id, jobs), started)


class _IngressMethods(GrpcMethods, HandleMethods, AdminMethods):
    """What both ingress deployments answer: HTTP (the ASGI app), gRPC (TEI's services,
    ``deployments/grpc_methods.py``), the handle API (``deployments/handle_methods.py``)
    and the model admin API (``deployments/model_admin.py``)."""

    settings: BlitzSettings
    dispatcher: ServeDispatcher
    service: EmbeddingService
    tokens: TokenService
    outputs: OutputService
    images: ImageService
    parts: PartsService
    api: HttpApi

    def _serve(self, dispatcher: ServeDispatcher) -> None:
        tracing.configure(self.settings.tracing)  # off unless an OTLP endpoint is set
        self.dispatcher = dispatcher
        services = Services.build(self.settings, dispatcher, observer=metrics.observe_request,
                                  route_observer=metrics.observe_route)
        self.service, self.tokens = services.service, services.tokens
        self.outputs, self.images = services.outputs, services.images
        self.parts = services.parts
        self.late = services.late
        self.admin = model_admin(self.settings)
        self.model_table = IngressFollower(self.admin, self.service.registry, self._forget,
                                           self.settings.admin.poll_s)
        self.api = HttpApi(services, admin=self.admin, app=app_name())
        self.batches = self.api.kit.batches  # the batch API's calls (None when it is off)
        self.drain = self.api.drain  # gRPC and handle calls counted in flight too
        self.drain_watch = DrainWatch(self.drain, app_name(), replica_name())
        try:  # the async constructor runs on the replica's loop; else check_health starts it
            self.model_table.start()
            self.drain_watch.start()
        except RuntimeError:
            pass
        self.grpc = TeiServicer(self.service, self.tokens, self.outputs)
        host = http_host()
        keep_grpc_on_http_host(host)  # before Serve starts this replica's gRPC server
        warn_if_open(host, self.settings.auth)
        collector.settle()  # the start-up heap frozen: a request's collections skip it
        flush_replica_log()

    async def batch_requests(self, owner: str, endpoint: str,
                             bodies: list[bytes]) -> list[tuple[int, str, bytes]]:
        """A piece of a batch (the batch runner's call, ``deployments/batches.py``): each
        body a request to ``endpoint`` on this HTTP app, as ``owner``'s key, at priority
        low; (status, request id, reply body) each."""
        with self.drain.held():
            return await internal.run_lines(self.api.app, endpoint, bodies,
                                            self.api.app.keys.index_of(owner),
                                            self.settings.batches)

    def _forget(self, model_id: str) -> None:
        """The admin API changed or removed ``model_id``: what is known of it goes, and
        once it is not served any more, its queues."""
        self.outputs.forget(model_id)
        if model_id not in self.service.registry:
            self.dispatcher.forget(model_id)

    def __serve_build_asgi_app__(self) -> Any:
        return self.api.app  # the ASGI app HttpApi built, served with nothing in between


@serve.deployment
@serve.ingress()  # HTTP: the ASGI app from __serve_build_asgi_app__, no adapter in between
class Ingress(_IngressMethods):
    """The ingress with the pools in replicas of their own (``ingress.cpu_pool: replicas``)."""

    def __init__(self, settings: dict[str, Any], cpu_pool: DeploymentHandle,
                 gpu_pool: DeploymentHandle | None = None,
                 batch_runner: DeploymentHandle | None = None):
        route_library_logs_to_serve()
        keep_replica_grpc_on_node_ip()
        self.settings = BlitzSettings.from_args(settings)
        handles = {"cpu": cpu_pool} | ({"gpu": gpu_pool} if gpu_pool is not None else {})
        self._serve(ServeDispatcher(self.settings, handles))

    async def check_health(self) -> None:  # Serve calls it every few seconds
        self.dispatcher.placement.start()  # the constructor may have run without a loop
        self.model_table.start()
        self.drain_watch.start()


@serve.deployment
@serve.ingress()
class IngressWithCpuPool(_IngressMethods):
    """The ingress with the CPU pool inside it (``ingress.cpu_pool: in_process``): built
    like a CPU pool replica (its ``preload`` models resident before the first request),
    and unhealthy when that pool is."""

    async def __init__(self, settings: dict[str, Any],  # type: ignore[misc]
                       gpu_pool: DeploymentHandle | None = None,
                       batch_runner: DeploymentHandle | None = None):
        route_library_logs_to_serve()
        keep_replica_grpc_on_node_ip()
        self.settings = BlitzSettings.from_args(settings)
        self.cpu_pool = await in_process(self.settings)
        handles = {"gpu": gpu_pool} if gpu_pool is not None else {}
        self._serve(InProcessCpuDispatcher(self.settings, self.cpu_pool, handles))

    async def check_health(self) -> None:
        self.dispatcher.placement.start()
        self.model_table.start()
        self.drain_watch.start()
        await self.cpu_pool.check_health()
