"""A replica's model worker threads, counted by what they really do.

``asyncio.wait_for(run_in_executor(...))`` frees its caller at the timeout, but not the
thread: it keeps running the hung call, and the executor queues the next calls behind
it, where they time out in turn, forever. ``WorkerSlots.run`` submits a call only when a
worker thread is free, and counts the thread busy until it really returns:

- **No executor queue**: a call takes a slot first (waiting as a coroutine, in order,
  for at most its timeout, then ``TimedOut``: 503), so it never waits behind a hung
  thread; a call that gives up waiting leaves nothing behind.
- **Honest release**: a call running past its timeout raises ``TimedOut`` at once, and
  its slot stays taken until its thread returns.
- **Stuck is visible**: a thread busy longer than ``stuck_after_s`` is stuck (``stuck``).
  Once all are, new calls are refused at once with ``Unavailable`` instead of queueing
  where nothing can drain, and ``problem()`` says so: the replica reports itself
  unhealthy and Serve replaces it.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from blitz.errors import TimedOut, Unavailable

R = TypeVar("R")


class WorkerSlots:
    def __init__(self, workers: int, *, stuck_after_s: float, name: str = "blitz-worker",
                 clock: Callable[[], float] = time.monotonic):
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self.workers = workers
        self.stuck_after_s = stuck_after_s
        self.name = name
        self._clock = clock
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self._lock = threading.Lock()  # _busy is written by worker threads too
        self._busy: dict[int, float] = {}  # call number -> when its thread took it
        self._numbers = itertools.count()
        self._free: asyncio.Semaphore | None = None  # made on the loop of the first call
        self._waiting = 0

    @property
    def busy(self) -> int:
        """Worker threads running a call (timed out or not)."""
        with self._lock:
            return len(self._busy)

    @property
    def stuck(self) -> int:
        """Worker threads running one call for longer than ``stuck_after_s``."""
        now = self._clock()
        with self._lock:
            return sum(now - started > self.stuck_after_s for started in self._busy.values())

    @property
    def waiting(self) -> int:
        """Calls waiting for a free worker."""
        return self._waiting

    def problem(self) -> str | None:
        """Why no call can run on these workers any more, or None."""
        if len(self._busy) < self.workers or self.stuck < self.workers:  # a free one: none
            return None
        return (f"{self.name}: all {self.workers} worker threads are stuck in a model call "
                f"for more than {self.stuck_after_s:g} s (call_timeout_s)")

    def refuse_if_stuck(self, what: str = "the model") -> None:
        """Raise ``Unavailable`` when all workers are stuck: nothing queued would run."""
        if len(self._busy) >= self.workers and self.problem() is not None:  # (a free
            # worker, the usual case, is read without a call: once per hop of a request)
            raise Unavailable(f"{what} cannot run on this replica now: its workers are "
                              "busy with calls that overran; retry shortly")

    async def run(self, fn: Callable[[], R], timeout_s: float, what: str = "the model") -> R:
        """``fn()`` on a free worker thread. Waits at most ``timeout_s`` for the worker,
        then gives the call ``timeout_s`` to run (a call started with little time left
        would only hold a worker for nobody). Raises ``TimedOut`` past either,
        ``Unavailable`` when all workers are stuck, and whatever ``fn`` raised."""
        self.refuse_if_stuck(what)
        free = self._semaphore()
        self._waiting += 1
        try:
            async with asyncio.timeout(timeout_s):  # a free slot is taken without a wait
                await free.acquire()
        except TimeoutError:
            raise TimedOut(f"{what} found no free worker within {timeout_s:g} s; "
                           "retry shortly") from None
        finally:
            self._waiting -= 1
        try:
            call = self._submit(fn, free, asyncio.get_running_loop())
        except BaseException:
            free.release()
            raise
        try:
            async with asyncio.timeout(timeout_s):
                return await asyncio.wrap_future(call)
        except TimeoutError:
            raise TimedOut(f"{what} gave no answer within {timeout_s:g} s; "
                           "retry shortly") from None

    def _semaphore(self) -> asyncio.Semaphore:
        if self._free is None:
            self._free = asyncio.Semaphore(self.workers)
        return self._free

    def _submit(self, fn: Callable[[], R], free: asyncio.Semaphore,
                loop: asyncio.AbstractEventLoop) -> Future[R]:
        number = next(self._numbers)
        with self._lock:
            self._busy[number] = self._clock()  # a worker is free: it starts at once

        def returned(_: Future) -> None:  # on the worker thread, or here if never started
            with self._lock:
                self._busy.pop(number, None)
            try:
                loop.call_soon_threadsafe(free.release)
            except RuntimeError:  # the loop has closed: nobody waits for a slot any more
                pass

        try:
            call = self._executor.submit(fn)
        except BaseException:
            with self._lock:
                del self._busy[number]
            raise
        call.add_done_callback(returned)
        return call
