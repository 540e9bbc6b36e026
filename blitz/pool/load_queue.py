"""Model loads on a pool replica: one at a time, shared, each with a deadline.

``LoadQueue.in_turn(key, fn)`` runs ``fn()`` (a blocking load) and returns what it returns:

- **On a thread of its own** that ends with the load, never on the event loop. Not a
  long-lived executor: a thread that ran torch keeps an idle OpenMP thread team for as
  long as it lives, and one such team beside the worker's slows the worker's torch
  calls (they share the cores; measured in docs/benchmarks-history.md). The team ends
  with its thread.
- **One at a time**, in the order asked for; callers wait as coroutines, so a caller
  that gives up leaves no thread behind.
- **Shared**: a caller for a key already queued or loading awaits that same load. A
  caller leaving never cancels it for the others (a load half done is not thrown away),
  and a queued load whose callers have all left is skipped, never run for nobody.
- **With a deadline**: a load running past ``deadline_s`` fails its callers with
  ``LoadTimedOut`` (through ``on_failure``, like any load error), and so do the loads
  queued behind it: nothing can start while its thread runs (no thread can be stopped),
  and new loads are refused with ``Unavailable`` meanwhile. A thread still running
  ``grace_s`` past its deadline is stuck: ``problem()`` says so, and the replica reports
  itself unhealthy so that Serve replaces it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

from blitz.errors import Unavailable

logger = logging.getLogger("blitz.models")
STUCK_GRACE_S = 5.0  # past its deadline, a load's thread has this long to end (a killed child)
V = TypeVar("V")
R = TypeVar("R")


class LoadTimedOut(TimeoutError):
    """A load ran past its deadline; its thread may still be running."""


def in_own_thread(fn: Callable[[], R], name: str) -> asyncio.Future[R]:
    """``fn()`` on a new thread that ends with it."""
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
    try:
        return asyncio.get_running_loop().run_in_executor(executor, fn)
    finally:
        executor.shutdown(wait=False)  # the thread exits once ``fn`` returns


def one_at_a_time(fn: Callable[[str], Awaitable[R]]) -> Callable[[str], Awaitable[R]]:
    """``fn`` with its calls one after another, as Serve's multiplexed LRU holds its lock
    across a load: the shared load above hands one result to every caller waiting on it,
    so concurrent callers of a loader that wraps it would share what each thinks its own."""
    lock = asyncio.Lock()

    async def call(key: str) -> R:
        async with lock:
            return await fn(key)

    return call


class _Load:
    __slots__ = ("key", "fn", "future", "waiters", "started")

    def __init__(self, key: str, fn: Callable[[], Any], future: asyncio.Future):
        self.key = key
        self.fn = fn
        self.future = future  # shared by every caller of this load
        self.waiters = 0
        self.started: float | None = None


def _retrieve(future: asyncio.Future) -> None:
    """Mark an error as seen: a load whose callers all left has nobody to raise it to."""
    if not future.cancelled():
        future.exception()


class LoadQueue(Generic[V]):
    def __init__(self, *, deadline_s: float, name: str = "blitz-load",
                 on_failure: Callable[[str, Exception], BaseException] | None = None,
                 grace_s: float = STUCK_GRACE_S, clock: Callable[[], float] = time.monotonic):
        """``on_failure(key, error)`` turns a failed load's error into the one its callers
        get, once per load (the pool remembers and counts it there)."""
        self.deadline_s = deadline_s
        self.name = name
        self.grace_s = grace_s
        self._on_failure = on_failure or (lambda _key, exc: exc)
        self._clock = clock
        self._loads: dict[str, _Load] = {}  # queued or running, by key
        self._queue: deque[_Load] = deque()
        self._running: _Load | None = None
        self._drainer: asyncio.Task | None = None

    @property
    def loading(self) -> str | None:
        """The key whose load runs now (past its deadline included)."""
        return self._running.key if self._running is not None else None

    @property
    def queued(self) -> list[str]:
        return [load.key for load in self._queue if load.waiters]

    def running_s(self) -> float:
        """How long the running load has run; 0 when none runs."""
        running = self._running
        if running is None or running.started is None:
            return 0.0
        return self._clock() - running.started

    def overdue_s(self) -> float:
        """How far the running load is past its deadline; 0 when none is."""
        running = self.running_s()
        return max(0.0, running - self.deadline_s) if running else 0.0

    def problem(self) -> str | None:
        """Why this queue can never drain (a load's thread stuck past its deadline), or None."""
        overdue = self.overdue_s()
        if overdue <= self.grace_s or self._running is None:
            return None
        return (f"{self.name}: the load of {self._running.key!r} is stuck, "
                f"{self.deadline_s + overdue:.0f} s after it started (deadline "
                f"{self.deadline_s:g} s); no other model can load on this replica")

    async def in_turn(self, key: str, fn: Callable[[], V]) -> V:
        """``fn()``'s result, or the load's error (after ``on_failure``); ``fn`` is
        ignored when a load of ``key`` is queued or running already. Raises
        ``Unavailable`` when a load is past its deadline (nothing can load meanwhile)."""
        if self.overdue_s() > 0:
            raise Unavailable("a model load on this replica is stuck; retry shortly")
        entry = self._loads.get(key)
        if entry is None:
            entry = self._loads[key] = _Load(key, fn, asyncio.get_running_loop().create_future())
            entry.future.add_done_callback(_retrieve)
            self._queue.append(entry)
            if self._drainer is None:
                self._drainer = asyncio.ensure_future(self._drain())
        entry.waiters += 1
        try:
            return await asyncio.shield(entry.future)
        finally:
            entry.waiters -= 1

    async def _drain(self) -> None:
        try:
            while self._queue:
                entry = self._queue.popleft()
                if entry.waiters == 0 or entry.future.done():  # everyone left, or failed
                    self._settle(entry, cancel=True)
                    continue
                await self._load_one(entry)
        finally:
            self._drainer = None
            for entry in list(self._loads.values()):  # only when the loop itself stops
                self._settle(entry, cancel=True)

    async def _load_one(self, entry: _Load) -> None:
        self._running = entry
        entry.started = self._clock()
        thread = in_own_thread(entry.fn, self.name)
        try:
            try:
                result = await asyncio.wait_for(asyncio.shield(thread), self.deadline_s)
            except TimeoutError:
                self._timed_out(entry)
                await asyncio.wait([thread])  # one load at a time, a stuck one included
                logger.warning("%s: the overdue load of %r ended after all", self.name,
                               entry.key)
            except Exception as exc:
                self._settle(entry, error=self._failure(entry.key, exc))
            else:
                self._settle(entry, result=result)
        finally:
            self._running = None
            thread.add_done_callback(_retrieve)

    def _timed_out(self, entry: _Load) -> None:
        error = LoadTimedOut(f"the load did not finish within {self.deadline_s:g} s "
                             "(load_timeout_s)")
        self._settle(entry, error=self._failure(entry.key, error))
        while self._queue:  # nothing behind a stuck load can start: answer them now
            self._settle(self._queue.popleft(), error=Unavailable(
                "a model load on this replica is stuck; retry shortly"))

    def _failure(self, key: str, exc: Exception) -> BaseException:
        try:
            return self._on_failure(key, exc)
        except Exception as hook_error:  # the callers still get an error, never a hang
            return hook_error

    def _settle(self, entry: _Load, *, result: Any = None, error: BaseException | None = None,
                cancel: bool = False) -> None:
        if self._loads.get(entry.key) is entry:
            del self._loads[entry.key]  # a later caller starts a load of its own
        if entry.future.done():
            return
        if cancel:
            entry.future.cancel()
        elif error is not None:
            entry.future.set_exception(error)
        else:
            entry.future.set_result(result)
