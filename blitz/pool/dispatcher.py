"""A pool replica called in this process, without Ray: the production ``PoolReplica`` with
its models in its own LRU (``blitz.pool.model_set.OwnLru``, ``MAX_MODELS_PER_REPLICA`` of
them, pins never its victims).

``ReplicaDispatcher`` answers both sides of a pool call: the ingress's ``Dispatcher``
(``submit``: one job, through the replica's queue for its model; what the service and the
HTTP API run on in unit tests) and a pool's call (``run_jobs_for``: the ingress's queue in
front, ``ingress.cpu_pool: in_process``, ``deployments/pool.py``). Every pool it is asked
for is this one replica (``pools`` names them).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from blitz.encoders.base import Encoded
from blitz.pool.mixed_batch import Job
from blitz.pool.model_set import ModelTable, PoolEvents
from blitz.pool.replica import PoolReplica
from blitz.settings.config import MAX_MODELS_PER_REPLICA, BlitzSettings
from blitz.settings.registry import Registry

logger = logging.getLogger("blitz.pool")


class ReplicaDispatcher:
    def __init__(self, settings: BlitzSettings, pool: str = "cpu",
                 events: PoolEvents | None = None, *, pools: frozenset[str] | None = None,
                 table: ModelTable | None = None, registry: Registry | None = None):
        """``pool``: whose settings the replica runs with; ``pools``: the names it answers
        for (default: ``pool``); ``table`` and ``registry``: the model table it follows
        (``blitz.pool.model_set.ModelTable``) and the registry that table updates."""
        self.settings = settings
        self._max_batch = settings.max_batch_sizes()
        self.pools = pools if pools is not None else frozenset({pool})
        self.replica = PoolReplica(settings, pool, events, max_models=MAX_MODELS_PER_REPLICA,
                                   table=table, registry=registry)
        self.registry = self.replica.registry
        # a pool's call (the ingress's queue in front): the replica's own, no wrapper
        self.run_jobs_for: Callable[[str, list[Job]], Awaitable[list[Encoded | BaseException]]]
        self.run_jobs_for = self.replica.run_jobs

    async def start(self) -> None:
        """The pool's ``preload`` models loaded (a failure raises)."""
        await self.replica.preload()

    # ---- the ingress's Dispatcher ------------------------------------------------------

    def max_batch(self, pool: str) -> int:
        return self._max_batch[pool]

    def running_pools(self) -> frozenset[str]:
        return self.pools  # it runs wherever this code runs

    def wake(self, pool: str) -> None:
        return None

    def unplaced_pools(self) -> dict[str, str]:
        return {}

    async def submit(self, pool: str, model_id: str, job: Job) -> Encoded:
        """``job`` through the replica's queue for ``model_id``; what it raised, raised."""
        (result,) = await self.replica.run_jobs(model_id, [job])
        if isinstance(result, BaseException):
            raise result
        return result

    def forget(self, model_id: str) -> None:
        self.replica.forget(model_id)

    # ---- a pool's call -----------------------------------------------------------------

    def problem(self) -> str | None:
        return self.replica.problem()

    async def check_health(self) -> None:
        """Raises the replica's problem (an ingress's health check: Serve replaces it)."""
        problem = self.replica.problem()
        if problem is not None:
            logger.error("unhealthy %s pool replica: %s", self.replica.pool, problem)
            raise RuntimeError(problem)

    def stats(self) -> dict[str, Any]:
        return self.replica.stats()

    def close(self) -> None:
        return None
