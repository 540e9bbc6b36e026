"""The model pool's Serve wiring: one class, bound as the CPU pool and (when GPUs exist)
the GPU pool, each replica a ``blitz.pool.replica.PoolReplica`` behind Serve; and the same
replica inside the ingress (``in_process``: ``blitz.pool.dispatcher.ReplicaDispatcher``).

Serve's part only: the async constructor (``preload`` resident before Serve routes here),
``@serve.multiplexed get_model`` (Serve's LRU as the model set's cache,
``deployments/serve_lru.py``, reporting the ids routing uses), the model table followed,
the health check, the request's model id, the local hop's address and its drain at stop,
and the metrics the replica's events feed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Coroutine
from typing import Any

import ray
from ray import serve

from blitz.encoders.base import Encoded
from blitz.pool.dispatcher import ReplicaDispatcher
from blitz.pool.holder import ModelHolder
from blitz.pool.local_hop import LocalHopServer
from blitz.pool.mixed_batch import Job
from blitz.pool.model_set import ModelSet
from blitz.pool.replica import PoolReplica
from blitz.runtime import collector, gpu_memory, lean_imports, malloc, tracing
from blitz.settings.config import MAX_MODELS_PER_REPLICA, BlitzSettings
from deployments.bind_addresses import keep_replica_grpc_on_node_ip
from deployments.logs import flush_replica_log, route_library_logs_to_serve
from deployments.metrics import metrics
from deployments.model_admin import PoolFollower
from deployments.serve_lru import ServeModels

logger = logging.getLogger("ray.serve")


def _start_process() -> None:
    """What a process that holds models does first, before any model loads."""
    lean_imports.defer_sklearn_metrics()  # before sentence-transformers is imported
    malloc.fix_mmap_threshold()  # before any model: weights in mappings of their own
    route_library_logs_to_serve()
    keep_replica_grpc_on_node_ip()


@serve.deployment
class ModelPool:
    async def __init__(self, settings: dict[str, Any], pool: str):  # type: ignore[misc]
        """Serve awaits this before it routes anything here: the pool's ``preload`` models
        are resident before the first request, and the replica does not start at all if
        one of them cannot load."""
        constructed = time.perf_counter()
        _start_process()
        config = BlitzSettings.from_args(settings)
        registry = config.registry()
        self.follower = PoolFollower(config, registry, pool)  # the admin API's table
        self.lru = ServeModels(self, self.get_model, lambda: self.follower.pinned)
        self.replica = PoolReplica(config, pool, metrics.pool_events(pool), cache=self.lru,
                                   table=self.follower, registry=registry)
        tracing.configure(config.tracing)  # off unless an OTLP endpoint is set
        self._hop: LocalHopServer | None = None  # made when an ingress first asks for it
        if self.replica.device.startswith("cuda"):  # for as long as the replica lives
            self._memory_reports = asyncio.get_running_loop().create_task(
                gpu_memory.report_forever(metrics.gpu_memory_publisher(pool)))
        await self.replica.preload()
        self.follower.start(self.replica)  # pins loaded, evicts done
        collector.settle()  # the start-up heap frozen: a request's collections skip it
        self.constructor_s = round(time.perf_counter() - constructed, 3)
        logger.info("%s pool replica constructed in %.2f s (preload included)", pool,
                    self.constructor_s)
        flush_replica_log()

    @serve.multiplexed(max_num_models_per_replica=MAX_MODELS_PER_REPLICA)
    async def get_model(self, model_id: str) -> ModelHolder:
        """Serve's loader (it runs one at a time, under the LRU's lock). Serve evicts the
        least recently used model past ``MAX_MODELS_PER_REPLICA``; the model set evicts
        more through the same LRU until the new model's bytes fit."""
        self.lru.taught()
        models: ModelSet = self.replica.models
        return await models.load(model_id)

    async def check_health(self) -> None:
        """Serve calls this every ``health_check_period_s``; raising makes Serve replace
        the replica (after three in a row)."""
        problem = self.replica.problem()
        if problem is not None:
            logger.error("unhealthy %s pool replica: %s", self.replica.pool, problem)
            raise RuntimeError(problem)

    async def run_jobs(self, jobs: list[Job]) -> list[Encoded | BaseException]:
        """The Serve call: the model is the request's multiplexed id (checked by the
        replica: a handle caller can send any id, and none may create a queue here)."""
        return await self.replica.run_jobs(serve.get_multiplexed_model_id(), jobs)

    async def run_jobs_for(self, model_id: str, jobs: list[Job]) -> list[Encoded | BaseException]:
        """The call with no Serve request to carry the id: the local hop."""
        return await self.replica.run_jobs(model_id, jobs)

    async def local_hop_address(self) -> dict[str, Any]:
        """Where an ingress on this node calls ``run_jobs_for`` without Serve's hop
        (``blitz.pool.local_hop``; asked for when ``ingress.pool_hop`` is ``auto`` and this
        pool runs one fixed replica)."""
        if self._hop is None:
            hop = LocalHopServer(self.run_jobs_for)
            await hop.start()
            self._hop = hop
        return {"path": self._hop.path, "pid": os.getpid(),
                "node_id": ray.get_runtime_context().get_node_id()}

    def __del__(self) -> Coroutine[Any, Any, None] | None:
        """Serve calls this when the replica stops: the local hop's socket and folder go.
        Its calls are not Serve requests, so Serve's drain does not wait for them: with
        some in flight this returns a coroutine, which Serve awaits (it awaits one a sync
        method returns), answering them (within ``call_timeout_s``) before closing."""
        follower = getattr(self, "follower", None)
        if follower is not None:
            follower.close()
        hop, self._hop = getattr(self, "_hop", None), None
        return hop.stop(self.replica.pool_settings.call_timeout_s) if hop is not None else None

    async def stats(self) -> dict[str, Any]:
        """What this replica holds and does: for tests and operators."""
        return self.replica.stats() | {
            "constructor_s": self.constructor_s,
            "node_id": ray.get_runtime_context().get_node_id(),
            "local_hop_calls": self._hop.calls if self._hop is not None else None}


async def in_process(settings: BlitzSettings) -> ReplicaDispatcher:
    """The CPU pool's replica inside the calling replica (the ingress, with
    ``ingress.cpu_pool: in_process``): the same replica logic, queues, worker threads,
    health check, metrics and model table, its models in its own LRU, called without a
    Serve hop."""
    _start_process()
    registry = settings.registry()
    follower = PoolFollower(settings, registry, "cpu")
    pool = ReplicaDispatcher(settings, "cpu", metrics.pool_events("cpu"), table=follower,
                             registry=registry)
    tracing.configure(settings.tracing)
    await pool.start()
    follower.start(pool.replica)
    collector.settle()
    flush_replica_log()
    return pool
