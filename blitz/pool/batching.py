"""Continuous batching for one hop: bounded, cancellation-aware, sized in texts.

One ``Batcher`` per hop and model (the ingress's pool calls, a pool's model calls):

- **Continuous**: a batch is formed when a run slot frees (``max_in_flight``), from
  everything that queued meanwhile, oldest first, up to ``max_batch`` units. The first
  item after an idle spell runs at once, so a lone request pays no batching delay.
- **Prioritized**: with ``priority`` (an item's level, 0 first), the queue is an
  ``AgingQueue``: higher levels first, FIFO within one, and an item moves up a level
  every ``aging_s`` it waits, so none starves. A batch holds one level (the best
  waiting), so a high item never rides in a batch made long by low ones; ``promote``
  hands an aged item on at the level it reached (the next hop's queue honours it).
  While work above low arrives, low work leaves the last free run slot to it
  (``keeps_slot``): an interactive item then waits for no bulk batch to end.
- **Bounded**: at most ``max_waiting`` units wait; past that ``submit`` raises
  ``Overloaded`` at once (503 + Retry-After) instead of growing memory and latency,
  unless the newest waiting items of a lower priority can make room: those are refused
  instead (``Overloaded``), so bulk work never pushes interactive work out.
- **Cancellation-aware**: an item whose caller has gone is dropped before its batch
  runs (its payload at once; its queue slot when dead entries outnumber live ones, so a
  storm of callers that submit and leave holds no more than ``max_waiting`` units of
  payload and about twice the live entries), and a running batch whose callers have all
  gone is cancelled.
- **Failures isolated**: ``run`` returns one result or exception per item, so one bad
  item fails alone; if ``run`` itself raises, each item of that batch gets the error.
- **Timed**: a batch that runs longer than ``timeout_s`` fails its items with
  ``TimedOut`` and frees its slot, so a hung model call cannot hold it forever.
- **Visible**: ``on_reject`` hears of each refusal, ``on_waiting`` of each change in
  the units waiting (the metrics' queue depth), ``on_waited`` of each batch as it forms:
  the level its first item came with and how long that item (its oldest) waited.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import time
from collections.abc import Awaitable, Callable, Sized
from typing import Generic, TypeVar

from blitz.errors import Overloaded, TimedOut, Unavailable
from blitz.pool.aging_queue import AgingQueue

LEVELS = 3  # priority levels (blitz.hop_messages.PRIORITIES): 0 high, 1 normal, 2 low
ONE_LEVEL = 1  # a Batcher without ``priority``: every item at level 0, plain FIFO
DEFAULT_AGING_S = 5.0

T = TypeVar("T", bound=Sized)  # an item: len(item) units unless `size` says otherwise
R = TypeVar("R")

RunBatch = Callable[[list[T]], Awaitable[list[R | BaseException]]]


class _Entry(Generic[T]):
    __slots__ = ("item", "units", "future", "batch")

    def __init__(self, item: T, units: int, future: asyncio.Future):
        self.item = item
        self.units = units
        self.future = future
        self.batch: _Batch | None = None  # set once the entry leaves the queue


class _Batch:
    __slots__ = ("entries", "task")

    def __init__(self, entries: list[_Entry]):
        self.entries = entries
        self.task: asyncio.Task | None = None

    def abandoned(self) -> bool:
        return all(e.future.done() for e in self.entries)


def _gone(entry: _Entry) -> bool:
    return entry.future.done()  # its caller has left (its units released then)


class Batcher(Generic[T, R]):
    def __init__(self, run: RunBatch, *, max_batch: int, max_waiting: int,
                 size: Callable[[T], int] = len, max_in_flight: int = 1,
                 timeout_s: float | None = None, name: str = "batcher",
                 priority: Callable[[T], int] | None = None,
                 promote: Callable[[T, int], T] | None = None,
                 aging_s: float = DEFAULT_AGING_S, clock: Callable[[], float] = time.monotonic,
                 on_reject: Callable[[], None] | None = None,
                 on_waiting: Callable[[int], None] | None = None,
                 on_waited: Callable[[int, float], None] | None = None):
        if max_batch < 1 or max_waiting < 1 or max_in_flight < 1:
            raise ValueError("max_batch, max_waiting and max_in_flight must be at least 1")
        self._call_run = run  # the caller's function: one batch of items in, one result each out
        self.max_batch = max_batch
        self.max_waiting = max_waiting
        self.max_in_flight = max_in_flight
        self.timeout_s = timeout_s
        self.name = name
        self._size = size
        self._priority = priority
        self._promote = promote
        self._clock = clock
        self._on_reject = on_reject
        self._on_waiting = on_waiting
        self._on_waited = on_waited
        self._queue: AgingQueue[_Entry[T]] = AgingQueue(
            LEVELS if priority is not None else ONE_LEVEL, aging_s, clock)
        self._waiting_units = 0
        self._running: set[_Batch] = set()
        self._above_low_at = -float("inf")  # when work above low last arrived (keeps_slot)

    @property
    def waiting(self) -> int:
        """Units (texts) waiting for a batch."""
        return self._waiting_units

    @property
    def in_flight(self) -> int:
        return len(self._running)

    async def submit(self, item: T) -> R:
        """The item's result; raises its own error, ``Overloaded`` when the queue is full,
        ``TimedOut`` when its batch overran."""
        (result,) = await self.submit_many([item])
        if isinstance(result, BaseException):
            raise result
        return result

    async def submit_many(self, items: list[T]) -> list[R | BaseException]:
        """Several items queued at once, so they can share one batch (a merged call from
        the hop before); one result or exception per item. Raises ``Overloaded`` for all
        of them when they do not fit the queue."""
        units = [self._size(item) for item in items]
        total = sum(units)
        levels = [self._priority(item) for item in items] if self._priority else [0] * len(items)
        if min(levels, default=LEVELS) < LEVELS - 1:
            self._above_low_at = self._clock()
        if self._waiting_units + total > self.max_waiting and self._waiting_units:
            self._make_room(total, min(levels, default=0))
        loop = asyncio.get_running_loop()
        entries = [_Entry(item, n, loop.create_future()) for item, n in zip(items, units, strict=True)]
        for entry, level in zip(entries, levels, strict=True):
            self._queue.push(entry, level)
        self._waiting_units += total
        self._start_batches()
        self._waiting_changed()
        try:
            for entry in entries:
                await entry.future
        except asyncio.CancelledError:
            for entry in entries:  # the awaited one is cancelled already, the rest not yet
                if entry.future.cancelled() or not entry.future.done():
                    self._abandon(entry)
            raise
        return [entry.future.result() for entry in entries]

    def _make_room(self, units: int, level: int) -> None:
        """Room for ``units`` more of ``level``: the newest waiting items of lower levels
        are refused (``Overloaded``) when that frees enough; else ``Overloaded`` here."""
        over = self._waiting_units + units - self.max_waiting
        shed = self._queue.shed(level, over, lambda entry: entry.units, _gone)
        for victim in shed:
            self._waiting_units -= victim.units
            victim.future.set_result(Overloaded(
                f"{self.name}: a request of higher priority took this one's place in a full "
                f"queue (limit {self.max_waiting} texts); retry shortly"))
            if self._on_reject is not None:
                self._on_reject()
        if not shed:
            if self._on_reject is not None:
                self._on_reject()
            raise Overloaded(f"{self.name}: {self._waiting_units} texts already wait "
                             f"(limit {self.max_waiting}); retry shortly")
        self._waiting_changed()

    def _abandon(self, entry: _Entry[T]) -> None:
        entry.future.cancel()
        if entry.batch is None:  # still queued: it no longer counts against the bound
            self._waiting_units -= entry.units
            entry.item = None  # type: ignore[assignment]  # never read again: it is gone
            self._queue.left(_gone)
            self._waiting_changed()
        elif entry.batch.task is not None and entry.batch.abandoned():
            entry.batch.task.cancel()  # nobody waits for this batch any more

    def _waiting_changed(self) -> None:
        if self._on_waiting is not None:
            self._on_waiting(self._waiting_units)

    def _start_batches(self) -> None:
        while len(self._running) < self.max_in_flight:
            entries = self._take_batch(last_slot=len(self._running) == self.max_in_flight - 1)
            if not entries:
                return
            batch = _Batch(entries)
            for e in entries:
                e.batch = batch
            self._running.add(batch)
            # a context of its own: the batch serves many callers, so nothing tied to the
            # caller that happened to start it (Serve's request context, whose cancellation
            # Serve passes on to every call made under it) may end it for the others
            batch.task = asyncio.get_running_loop().create_task(
                self._run_batch(batch), context=contextvars.Context())
            # here, not in the task: a task cancelled before its first step never runs a line
            batch.task.add_done_callback(functools.partial(self._finished, batch))

    def _finished(self, batch: _Batch, _task: asyncio.Task | None = None) -> None:
        """Free ``batch``'s slot (once: at its task's end, or when it was cancelled unrun)."""
        if batch not in self._running:
            return
        self._running.discard(batch)
        self._start_batches()
        self._waiting_changed()

    def keeps_slot(self) -> bool:
        """Whether the last free run slot is kept from low work now: with priorities and
        two slots or more, while work above low arrives (some came within ``aging_s``),
        so that the next interactive item runs at once instead of after a bulk batch.
        Low work that aged up a level is not low any more: it takes the slot."""
        return (self._priority is not None and self.max_in_flight > 1
                and self._clock() - self._above_low_at < self._queue.aging_s)

    def _take_batch(self, last_slot: bool = False) -> list[_Entry[T]]:
        """The next batch: the best waiting item's level only, in order, up to
        ``max_batch`` units (an item that does not fit waits for the next batch); none
        when only low work waits for the ``last_slot`` that ``keeps_slot`` keeps."""
        entries: list[_Entry[T]] = []
        total = 0
        level: int | None = None
        now = self._clock()
        while (head := self._queue.best(_gone)) is not None:
            entry = head.entry
            if level is None and last_slot and head.level == LEVELS - 1 and self.keeps_slot():
                break
            if level is not None and head.level != level:
                break
            if entries and total + entry.units > self.max_batch:
                break
            self._queue.pop(head)
            level = head.level
            self._waiting_units -= entry.units
            total += entry.units
            if head.level < head.line and self._promote is not None:
                entry.item = self._promote(entry.item, head.level)
            if not entries and self._on_waited is not None:  # the batch's longest wait
                self._on_waited(head.line, now - head.since)
            entries.append(entry)
        return entries

    async def _run_batch(self, batch: _Batch) -> None:
        try:
            await self._answer([e for e in batch.entries if not e.future.done()])
        finally:
            self._finished(batch)

    async def _answer(self, live: list[_Entry[T]]) -> None:
        if not live:
            return
        try:
            async with asyncio.timeout(self.timeout_s):  # no task of its own, unlike wait_for
                results = await self._call_run([e.item for e in live])
            if len(results) != len(live):
                raise RuntimeError(f"batch function returned {len(results)} results "
                                   f"for {len(live)} items")
        except TimeoutError:
            results = [TimedOut(f"{self.name}: no answer within {self.timeout_s:g} s; "
                                "retry shortly")] * len(live)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                return  # abandoned: every caller has gone
            # the call was cancelled under it (not by us): its callers still wait
            results = [Unavailable(f"{self.name}: the call was cancelled before it answered; "
                                   "retry shortly")] * len(live)
        except Exception as exc:  # every waiter gets the failure, none hangs
            results = [exc] * len(live)
        for entry, result in zip(live, results, strict=True):
            if not entry.future.done():
                entry.future.set_result(result)
