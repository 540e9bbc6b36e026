"""A bounded load loop for fault tests: every reply recorded, none left hanging."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx


@dataclass
class Outcome:
    started: float
    seconds: float
    status: int  # 0: no HTTP reply (timeout or connection error)
    retry_after: str | None
    error: str = ""


@dataclass
class LoadRecord:
    outcomes: list[Outcome] = field(default_factory=list)

    def statuses(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        for o in self.outcomes:
            counts[o.status] = counts.get(o.status, 0) + 1
        return counts

    def bad(self) -> list[Outcome]:
        """Replies that are neither 200 nor 503 with Retry-After."""
        return [o for o in self.outcomes
                if not (o.status == 200 or (o.status == 503 and o.retry_after))]


async def send(client: httpx.AsyncClient, record: LoadRecord, request: Callable,
               check: Callable[[httpx.Response], None] | None = None) -> Outcome:
    started = time.monotonic()
    try:
        r = await request(client)
        if r.status_code == 200 and check is not None:
            check(r)
        outcome = Outcome(started, time.monotonic() - started, r.status_code,
                          r.headers.get("retry-after"),
                          "" if r.status_code == 200 else r.text[:200])
    except Exception as exc:  # a timeout or a dropped connection: the request was lost
        outcome = Outcome(started, time.monotonic() - started, 0, None,
                          f"{type(exc).__name__}: {exc}")
    record.outcomes.append(outcome)
    return outcome


async def run_clients(base_url: str, clients: int, request: Callable, until: Callable[[], bool],
                      deadline_s: float, record: LoadRecord, timeout_s: float = 30.0,
                      check: Callable[[httpx.Response], None] | None = None) -> None:
    """``clients`` loops sending ``request`` until ``until()`` or ``deadline_s`` passes."""
    end = time.monotonic() + deadline_s
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout_s, limits=limits) as client:
        async def loop() -> None:
            while not until() and time.monotonic() < end:
                await send(client, record, request, check)

        await asyncio.gather(*(loop() for _ in range(clients)))
