"""Continuous batching: work that arrives while earlier work runs goes into the next call.

``@serve.batch`` forms a batch as soon as its wait timeout passes and only then waits
for a free slot (``max_concurrent_batches``), so under steady load it queues many
batches of one or two items behind the running one. A ``Coalescer`` forms the batch
when a slot frees instead: everything that queued meanwhile (up to ``max_size``) goes
into one call. The first item after an idle spell runs at once, so a lone request
pays no batching delay.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Coalescer(Generic[T, R]):
    def __init__(self, run: Callable[[list[T]], Awaitable[list[R | BaseException]]],
                 max_size: int, size: Callable[[T], int] = lambda item: 1,
                 max_in_flight: int = 1):
        """``run`` takes a list of items and returns one result (or exception) per item."""
        self._run = run
        self.max_size = max_size
        self._size = size
        self.max_in_flight = max_in_flight
        self._pending: deque[tuple[T, asyncio.Future]] = deque()
        self._in_flight = 0

    @property
    def waiting(self) -> int:
        return len(self._pending)

    async def submit(self, item: T) -> R:
        future = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        self._start_batches()
        result = await future
        if isinstance(result, BaseException):
            raise result
        return result

    def _start_batches(self) -> None:
        while self._in_flight < self.max_in_flight and self._pending:
            batch = [self._pending.popleft()]
            total = self._size(batch[0][0])
            while self._pending and total + self._size(self._pending[0][0]) <= self.max_size:
                item = self._pending.popleft()
                total += self._size(item[0])
                batch.append(item)
            self._in_flight += 1
            asyncio.ensure_future(self._run_batch(batch))

    async def _run_batch(self, batch: list[tuple[T, asyncio.Future]]) -> None:
        try:
            results: list = await self._run([item for item, _ in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"batch function returned {len(results)} results "
                                   f"for {len(batch)} items")
        except BaseException as exc:  # every waiter gets the failure, none hangs
            results = [exc] * len(batch)
        finally:
            self._in_flight -= 1
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)
        self._start_batches()
