"""The ingress's queue table: one ``Batcher`` per (pool, model), in front of the pool calls.

Concurrent jobs of every kind for one pool and model go through one queue, this hop's
only one: they become one pool call (``PoolCall``: ``run_jobs`` on a replica) that
answers each job on its own, bounded in units waiting (``ingress.max_queued_texts``) and
in calls in flight (``calls_in_flight``), timed by ``ingress.pool_timeout_s``; higher
priorities first, aged by the pool's ``priority_aging_s``. How a pool call travels (Serve's
handle, the local hop, a pool object in this process) is the caller's: ``deployments/``
passes Ray's, tests pass a replica here.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from blitz import timing
from blitz.encoders.base import Encoded
from blitz.hop_messages import priority_of, units_of, with_priority
from blitz.pool.batching import Batcher
from blitz.pool.mixed_batch import Job
from blitz.runtime import tracing
from blitz.settings.config import BlitzSettings

# pool calls in flight per (pool, model) and pool replica before requests wait to be
# merged: at least two keep a replica busy while the ingress gathers the next (with
# `workers: 2`, both compute at once; three cost throughput, as more small calls share
# the cores: docs/benchmarks-history.md), and one per worker so that every worker of a
# bigger replica has a batch
CALLS_IN_FLIGHT_PER_REPLICA = 2

PoolCall = Callable[[str, str, list[Job]], Awaitable[Any]]
"""One pool call: (pool, model id, jobs) -> one result or exception per job."""


def calls_in_flight(workers: int, replicas: int) -> int:
    """Pool calls one ingress batcher keeps in flight to a pool of ``replicas`` replicas with
    ``workers`` worker threads each."""
    return max(CALLS_IN_FLIGHT_PER_REPLICA, workers) * max(1, replicas)


def _nothing(*_: Any) -> None:
    return None


@dataclass(frozen=True)
class QueueObservers:
    """What the queues tell the metrics (``deployments.metrics``); by default nothing."""

    rejected: Callable[[], None] = _nothing  # a job refused: its queue was full
    # (pool, model) -> the units waiting in that queue, on each change
    waiting: Callable[[str, str], Callable[[int], None] | None] = _nothing
    # pool -> a batch's priority level and its oldest job's wait, as it forms
    waited: Callable[[str], Callable[[int, float], None] | None] = _nothing


def stamped(results: Any, started: float) -> Any:
    """One pool call's ``results``, each stamped with when the call began at ``started``
    (the mark ``PoolQueues.submit`` turns into ``ingress-queue``) and its round trip
    (``call``)."""
    timing.mark(results, "ingress-queue", started)
    timing.record(results, call=time.perf_counter() - started)
    return results


class PoolQueues:
    """The table of queues, one per (pool, model), made on first use."""

    def __init__(self, settings: BlitzSettings, call: PoolCall,
                 observers: QueueObservers | None = None):
        self.settings = settings
        self._call = call
        self._observers = observers or QueueObservers()
        self._batchers: dict[tuple[str, str], Batcher] = {}

    def __contains__(self, key: tuple[str, str]) -> bool:
        return key in self._batchers

    def keys(self) -> list[tuple[str, str]]:
        """The (pool, model) pairs with a queue now."""
        return list(self._batchers)

    def forget(self, model_id: str) -> None:
        """Drop ``model_id``'s queues (a model the admin API removed; any thread)."""
        for key in list(self._batchers):
            if key[1] == model_id:
                self._batchers.pop(key, None)

    def batcher(self, pool: str, model_id: str) -> Batcher:
        """The one queue for ``model_id``'s jobs of every kind on ``pool``."""
        batcher = self._batchers.get((pool, model_id))
        if batcher is None:
            settings = self.settings.pool(pool)
            call: Callable[[list[Job]], Awaitable[Any]] = functools.partial(
                self._call, pool, model_id)
            if tracing.TRACER is not None:  # traces on: each job's pool call in a hop span
                call = tracing.hops(call, pool, model_id)
            observers = self._observers
            batcher = self._batchers[(pool, model_id)] = Batcher(
                call,
                max_batch=settings.max_batch_size,
                max_waiting=self.settings.ingress.max_queued_texts,
                max_in_flight=calls_in_flight(settings.worker_count, settings.max_replicas),
                timeout_s=self.settings.ingress.pool_timeout_s,
                name=f"{pool} pool queue for {model_id!r}",
                priority=priority_of, promote=with_priority, aging_s=settings.priority_aging_s,
                size=units_of,
                on_reject=observers.rejected,
                on_waiting=observers.waiting(pool, model_id),
                on_waited=observers.waited(pool))
        return batcher

    async def submit(self, pool: str, model_id: str, job: Job) -> Encoded:
        """``job`` through the one queue for ``pool`` and ``model_id``; its
        ``ingress-queue`` is the time from here to its pool call (``stamped``)."""
        entered = time.perf_counter()
        result = await self.batcher(pool, model_id).submit(job)
        timing.since([result], "ingress-queue", entered)
        if job.trace is not None:  # traced (blitz.runtime.tracing): that wait as a span
            tracing.waited(job.trace, "blitz.ingress_queue", entered,
                           result.timings.get("ingress-queue", 0.0),
                           {"blitz.pool": pool, "blitz.model": model_id})
        return result
