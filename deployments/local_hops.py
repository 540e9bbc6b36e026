"""Which pools an ingress calls over the local hop (``blitz.pool.local_hop``), found through
Serve's handle.

A pool qualifies (``ingress.pool_hop: auto``) when it runs exactly one replica
(``num_replicas: 1``, or autoscaling from 1 to 1: the shipped shape on up to 11 cores):
then the replica Serve would route to is always that one, Serve's autoscaling has
nothing to count, and the ingress asks it once, over the handle, where its socket is.
If it lives on this node, calls go down the socket; until then, when it is elsewhere,
and for a moment after the socket broke (the replica died or was replaced), they take
Serve's handle. Finding runs in the background: no call waits for it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

import ray
from ray.serve.handle import DeploymentHandle

from blitz.pool.local_hop import LocalHopClient
from blitz.settings.config import BlitzSettings

logger = logging.getLogger("ray.serve")
RETRY_S = 2.0  # after a failed find or a broken socket, Serve's handle this long
ELSEWHERE_RETRY_S = 60.0  # a replica on another node: ask again this much later
FIND_TIMEOUT_S = 10.0  # a pool that does not say where its socket is: Serve's handle


def qualifies(settings: BlitzSettings, pool: str) -> bool:
    """Whether ``pool`` runs exactly one replica, always (fixed, or autoscaling 1..1)."""
    pool_settings = settings.pool(pool)
    return (settings.ingress.pool_hop == "auto"
            and pool_settings.min_replicas == pool_settings.max_replicas == 1)


class LocalHops:
    def __init__(self, settings: BlitzSettings, handles: dict[str, DeploymentHandle]):
        self._handles = {pool: h for pool, h in handles.items() if qualifies(settings, pool)}
        self._clients: dict[str, LocalHopClient] = {}
        self._finding: dict[str, asyncio.Task] = {}
        self._next_try: dict[str, float] = {}

    def client(self, pool: str) -> LocalHopClient | None:
        """The live local hop to ``pool``'s replica, or None (take the handle); starts
        finding one when there is none."""
        client = self._clients.get(pool)
        if client is not None and not client.lost:
            return client
        if client is not None:  # lost: the replica died or was replaced
            client.close()
            del self._clients[pool]
            self._next_try[pool] = time.monotonic() + RETRY_S
        if (pool in self._handles and pool not in self._finding
                and time.monotonic() >= self._next_try.get(pool, 0.0)):
            self._finding[pool] = asyncio.ensure_future(self._find(pool))
        return None

    async def _find(self, pool: str) -> None:
        retry_s = RETRY_S
        try:
            async with asyncio.timeout(FIND_TIMEOUT_S):
                address = await self._handles[pool].local_hop_address.remote()
                if (address["node_id"] != ray.get_runtime_context().get_node_id()
                        or not os.path.exists(address["path"])):
                    retry_s = ELSEWHERE_RETRY_S
                    return
                self._clients[pool] = await LocalHopClient.connect(address["path"])
            logger.info("the %s pool's replica (pid %s) is called over the local hop %s",
                        pool, address["pid"], address["path"])
        except Exception as exc:  # noqa: BLE001 - a timeout included: Serve's handle serves
            logger.info("no local hop to the %s pool yet (%s); Serve's handle serves", pool,
                        type(exc).__name__)
        finally:
            self._next_try[pool] = time.monotonic() + retry_s
            self._finding.pop(pool, None)
