"""A server's stop as its requests see it: ``Drain``, one per ingress replica.

Once a stop begins (``begin``: scripts/lifecycle.py's drain, which each ingress replica
hears through ``deployments/draining.py``), every new HTTP request is refused with 503 and
``Retry-After`` (``refuse_if_stopping``), which clients and load balancers retry, instead of
Serve's 404 for an application already deleted; the requests in flight (HTTP, gRPC and
handle calls, each counted while ``held``) finish. ``idle`` tells the stop when none is left,
so that Serve's shutdown, which kills the HTTP front at once, cuts nothing. ``end`` serves
again (a stop given up).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from blitz.errors import Unavailable

STOPPING = ("this server is stopping: retry shortly (another replica, or this server once "
            "it is back)")


class Drain:
    def __init__(self) -> None:
        self.stopping = False
        self.in_flight = 0  # requests and calls held now

    def begin(self) -> None:
        self.stopping = True

    def end(self) -> None:
        self.stopping = False

    def refuse_if_stopping(self) -> None:
        """Raises ``Unavailable`` (503 + Retry-After) once the stop has begun."""
        if self.stopping:
            raise Unavailable(STOPPING)

    @contextmanager
    def held(self) -> Iterator[None]:
        """Counts a request or call in flight for as long as it runs."""
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1

    @property
    def idle(self) -> bool:
        """The stop has begun and nothing is in flight any more."""
        return self.stopping and self.in_flight == 0
