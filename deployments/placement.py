"""Pool replicas Ray cannot place, found by the ingress and said out loud.

Serve reports a replica that waits for resources only as "Upscaling", without naming
what it lacks, so a pool whose claim fits nowhere would wait in silence forever. Every
``CHECK_EVERY_S`` the ingress asks Ray's GCS which replica actors of its pools are still
``PENDING_CREATION``; one that has waited ``ingress.unplaced_after_s`` (30 s: longer
than a worker process takes to start) is *unplaced*: one WARNING naming the claim and what is free
(``blitz.ingress.placement``; the claim as Ray holds it for the actor), the reason in ``/ready`` and ``/models``, and the gauge
``blitz_pool_unplaced`` at 1 until Ray places it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping

from blitz.ingress.placement import unplaced_message
from deployments.metrics import metrics

logger = logging.getLogger("ray.serve")
CHECK_EVERY_S = 10.0
CHECK_TIMEOUT_S = 5.0  # a GCS that does not answer: try again next time


def pending_replicas() -> dict[tuple[str, str], dict[str, float]]:
    """(application, deployment) -> what one of its replica actors Ray has not placed
    yet claims (Ray's resource names; memory in bytes)."""
    from ray._private import state
    from ray.core.generated import gcs_pb2

    accessor = state.state._connect_and_get_accessor()  # what ray.util.state reads, no dashboard
    pending: dict[tuple[str, str], dict[str, float]] = {}
    for raw in accessor.get_actor_table(None, "PENDING_CREATION"):
        actor = gcs_pb2.ActorTableData.FromString(raw)  # type: ignore[attr-defined]
        kind, _, rest = actor.class_name.partition(":")  # ServeReplica:<app>:<deployment>
        app, _, deployment = rest.partition(":")
        if kind == "ServeReplica" and deployment:
            pending[(app, deployment)] = {k: float(v) for k, v in
                                          actor.required_resources.items() if v}
    return pending


def free_resources() -> dict[str, float]:
    import ray

    return dict(ray.available_resources())


class PlacementWatch:
    """Which of ``pools`` (pool -> its deployment's name) of application ``app`` has a
    replica Ray has not placed, and why."""

    def __init__(self, app: str, pools: Mapping[str, str], *, after_s: float,
                 every_s: float = CHECK_EVERY_S):
        self.app, self.after_s, self.every_s = app, after_s, every_s
        self.pools = dict(pools)
        self.problems: dict[str, str] = {}  # pool -> why it waits
        self._since: dict[str, float] = {}
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        """Watch in the background from now on (idempotent; needs a running loop and a
        connected Ray: a dispatcher built outside a replica, in tests, watches nothing)."""
        import ray

        if not ray.is_initialized():
            return
        if self._task is None or self._task.done():
            with contextlib.suppress(RuntimeError):  # no running loop: a later call starts it
                self._task = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            try:
                pending, free = await asyncio.wait_for(
                    asyncio.to_thread(lambda: (pending_replicas(), free_resources())),
                    CHECK_TIMEOUT_S)
                self.update(pending, free, time.monotonic())
            except Exception as exc:  # noqa: BLE001 - a watch never fails the ingress
                logger.debug("placement check failed: %r", exc)
            await asyncio.sleep(self.every_s)

    def update(self, pending: Mapping[tuple[str, str], Mapping[str, float]],
               free: Mapping[str, float], now: float) -> None:
        """``pending_replicas()`` and ``free_resources()`` as of ``now``."""
        for pool, deployment in self.pools.items():
            claim = pending.get((self.app, deployment))
            if claim is None:
                self._since.pop(pool, None)
                if self.problems.pop(pool, None) is not None:
                    logger.warning("the %s pool's replica is placed now", pool)
            else:
                since = self._since.setdefault(pool, now)
                if now - since >= self.after_s:
                    message = unplaced_message(f"{pool}_pool", deployment, claim, free,
                                               now - since)
                    if pool not in self.problems:
                        logger.warning("blitz: %s", message)
                    self.problems[pool] = message
            metrics.pool_unplaced.set(1 if pool in self.problems else 0, tags={"pool": pool})
