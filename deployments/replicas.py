"""Which pools have a running replica, read without a call per request, and waking a pool
that has none.

Serve's controller pushes every change of a deployment's running replicas to each handle's
router (its long poll); the router keeps them to pick replicas from. Reading that set costs
nothing, and it follows scale-ups, scale-downs to zero and dead replicas as soon as the
controller does. It is Serve's private state (Ray 2.60: ``handle._router._asyncio_router``,
then its request router's ``curr_replicas``), so it is read in this one place, and a layout
this code does not know counts as "running": requests then go where the routing table
sends them and wait for a cold start, as they would without this module.
tests/integration/test_cold_gpu.py fails if the layout changes under a Ray upgrade.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ray.serve.handle import DeploymentHandle

logger = logging.getLogger("ray.serve")
_warned: set[str] = set()


def watch(handle: DeploymentHandle) -> None:
    """Create ``handle``'s router now (Serve does it on first use): it subscribes to the
    replica set, so it knows the running replicas before the first request asks."""
    if not handle.is_initialized:
        handle.options()


def running_replicas(handle: DeploymentHandle) -> int | None:
    """The running replicas ``handle``'s router knows of; None when it cannot tell."""
    watch(handle)
    inner: Any = getattr(getattr(handle, "_router", None), "_asyncio_router", None)
    request_router = getattr(inner, "_request_router", None)
    replicas: Any = None
    if request_router is not None:
        replicas = getattr(request_router, "curr_replicas", None)
    elif hasattr(inner, "_running_replicas"):  # kept here until the request router is built
        replicas = inner._running_replicas or ()  # None: the first update is not in yet
    if replicas is None:
        name = handle.deployment_name
        if name not in _warned:
            _warned.add(name)
            logger.warning("cannot read the running replicas of %s from this Ray's handle; "
                           "routing as if it had one", name)
        return None
    return len(replicas)


class PoolWaker:
    """Wakes a pool scaled to zero with one cheap call (``ModelPool.stats``): Serve's
    autoscaler counts the queued call as demand and starts a replica (from zero it skips
    ``upscale_delay_s``). At most one wake call per pool is outstanding; it gives up after
    ``timeout_s`` (a pool that cannot be placed), and the next cold request wakes again."""

    def __init__(self, handles: dict[str, DeploymentHandle], timeout_s: float):
        self.handles = handles
        self.timeout_s = timeout_s
        self.waking: dict[str, asyncio.Task[Any]] = {}

    def wake(self, pool: str) -> None:
        if pool not in self.waking:
            logger.info("the %s pool has no running replica: starting one", pool)
            self.waking[pool] = asyncio.ensure_future(self._wake(pool))

    async def _wake(self, pool: str) -> None:
        async def call() -> Any:
            return await self.handles[pool].stats.remote()

        try:
            await asyncio.wait_for(call(), self.timeout_s)
        except Exception as exc:  # the wake is best effort; requests never see it
            logger.warning("waking the %s pool failed: %s", pool, type(exc).__name__)
        finally:
            del self.waking[pool]
