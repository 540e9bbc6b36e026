"""A stop's drain, heard by every ingress replica through Ray's GCS key-value store.

scripts/lifecycle.py's drain (scripts/serve.sh and the image on SIGTERM, scripts/stop.sh)
puts ``stopping`` in the application's namespace, valid until a Unix time, then waits. Each
ingress replica reads it every ``POLL_S`` (``DrainWatch``; two seconds: one small GCS read,
well inside the drain's ``HEARD_S``, five, and every ``STOPPING_POLL_S`` during a stop, to
report its idleness as soon as it comes): from then on its HTTP requests
get 503 with ``Retry-After`` (``blitz.runtime.draining.Drain``), those in flight finish, and
it reports ``idle:<replica>`` (``1`` once nothing is in flight, ``0`` before). Once every
replica that heard it is idle, the stop shuts Serve down, so no request arriving during
the stop sees Serve's 404 for a deleted application, and none in flight is cut. A flag past
its time is ignored (a stop given up, or a store that outlived its Ray): the replica
serves again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from urllib.parse import quote

from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_put

from blitz.runtime.draining import Drain

logger = logging.getLogger("ray.serve")
NAMESPACE = "blitz-drain"
STOPPING = "stopping"  # key: the Unix time until which the stop holds
IDLE = "idle:"  # key prefix, one per replica that heard it: b"1" idle, b"0" not yet
POLL_S = 2.0  # serving: how soon a replica hears a stop
STOPPING_POLL_S = 0.25  # stopping: how soon it reports its last request done


def namespace(app: str) -> str:
    """The application's drain namespace (no ':' in a namespace: the GCS would split it)."""
    return f"{NAMESPACE}-{quote(app, safe='')}"


class DrainWatch:
    """One ingress replica's ear for the stop: ``tick`` reads the flag and reports."""

    def __init__(self, drain: Drain, app: str, replica: str, every_s: float = POLL_S,
                 stopping_every_s: float = STOPPING_POLL_S):
        self.drain = drain
        self.namespace = namespace(app)
        self.replica = replica
        self.every_s, self.stopping_every_s = every_s, stopping_every_s
        self.task: asyncio.Task | None = None
        self._reported: bytes | None = None

    def start(self) -> None:
        """Begin listening (from a coroutine of the replica's loop; again: nothing)."""
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        failed = False
        while True:
            try:
                await asyncio.to_thread(self.tick)
                failed = False
            except Exception as exc:  # noqa: BLE001 - the GCS may be restarting: retried
                if not failed:
                    logger.warning("drain watch: %s: %s (retrying every %.1f s)",
                                   type(exc).__name__, exc, self.every_s)
                failed = True
            await asyncio.sleep(self.next_tick_s())

    def next_tick_s(self) -> float:
        """Seconds to the next read: short only while a stop is under way."""
        return self.stopping_every_s if self.drain.stopping else self.every_s

    def tick(self) -> None:
        """Read the flag (blocking); begin or end the stop; report idleness while stopping."""
        value = _internal_kv_get(STOPPING, namespace=self.namespace)
        try:
            until = float(value) if value else 0.0
        except ValueError:
            until = 0.0
        if until > time.time():
            if not self.drain.stopping:
                self.drain.begin()
                logger.info("stopping: new requests get 503 + Retry-After; %d in flight "
                            "finish first", self.drain.in_flight)
            idle = b"1" if self.drain.in_flight == 0 else b"0"
            if idle != self._reported:
                _internal_kv_put(IDLE + self.replica, idle, overwrite=True,
                                 namespace=self.namespace)
                self._reported = idle
        elif self.drain.stopping:
            self.drain.end()
            self._reported = None
            logger.info("the stop was given up: serving again")
