"""The batcher's promises, searched rather than listed: random schedules of callers
(groups of items of random sizes, arriving at random moments, some leaving early), random
batch durations and failures, random bounds. Whatever the schedule:

- **bounded**: batches never exceed ``max_batch`` units, never more than ``max_in_flight``
  run at once, never more than ``max_waiting`` units wait;
- **nothing lost or mixed**: every caller that stays gets its own result, its own error,
  its batch's failure, or ``Overloaded`` (refused at once, never run);
- **nothing computed for a caller that left**: a batch never starts with an item whose
  caller has gone, and no item runs twice;
- **nothing stranded**: afterwards nothing waits and nothing runs;
- **priorities** (half the schedules give items levels): a batch holds one level, and an
  item refused to make room for a higher one (``Overloaded`` as its result) never ran.

The constants (how many batches in flight, how large) are inputs here, not facts.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from blitz.errors import Overloaded
from blitz.pool.batching import Batcher


@dataclass(frozen=True)
class Item:
    id: int
    units: int
    ticks: int  # how long a batch holding it runs, in loop turns
    outcome: str  # "ok" | "error" (its own) | "crash" (its whole batch fails)
    level: int = 1  # its priority (0 high, 1 normal, 2 low), when the schedule has them

    def __len__(self) -> int:
        return self.units


@dataclass(frozen=True)
class Caller:
    items: tuple[Item, ...]
    arrives: int  # loop turns after the previous caller
    leaves: int | None  # loop turns after arriving, or None: stays


@st.composite
def scenarios(draw):
    max_batch = draw(st.integers(1, 8))
    max_waiting = draw(st.integers(max_batch, 24))
    max_in_flight = draw(st.integers(1, 3))
    prioritized = draw(st.booleans())
    callers, next_id = [], 0
    for _ in range(draw(st.integers(1, 25))):
        items = []
        for _ in range(draw(st.integers(1, 3))):
            items.append(Item(next_id, draw(st.integers(1, max_batch)), draw(st.integers(0, 6)),
                              draw(st.sampled_from(["ok"] * 6 + ["error", "crash"])),
                              draw(st.integers(0, 2)) if prioritized else 1))
            next_id += 1
        while sum(i.units for i in items) > max_waiting:  # a group that fits an empty queue
            items.pop()
        leaves = draw(st.one_of(st.none(), st.integers(0, 8)))
        callers.append(Caller(tuple(items), draw(st.integers(0, 3)), leaves))
    return max_batch, max_waiting, max_in_flight, callers, prioritized


async def _turns(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def _play(max_batch: int, max_waiting: int, max_in_flight: int,
                callers: list[Caller], prioritized: bool) -> None:
    runs: dict[int, int] = {}  # item id -> times it reached the batch function
    gone: set[int] = set()  # items whose callers have left (and the batcher knows it)
    crashed: set[int] = set()  # items of batches that failed as a whole
    running = 0
    waiting_seen: list[int] = []

    async def run(items: list[Item]) -> list:
        nonlocal running
        assert not gone.intersection(i.id for i in items), "ran an item whose caller left"
        assert sum(i.units for i in items) <= max_batch
        assert len({i.level for i in items}) == 1, "a batch mixed priorities"
        running += 1
        assert running <= max_in_flight
        for i in items:
            runs[i.id] = runs.get(i.id, 0) + 1
        try:
            await _turns(max(i.ticks for i in items))
        finally:
            running -= 1
        if any(i.outcome == "crash" for i in items):
            crashed.update(i.id for i in items)
            raise RuntimeError("batch crashed")
        return [ValueError(i.id) if i.outcome == "error" else ("done", i.id) for i in items]

    batcher: Batcher[Item, tuple] = Batcher(run, max_batch=max_batch, max_waiting=max_waiting,
                                         max_in_flight=max_in_flight,
                                         on_waiting=waiting_seen.append,
                                         priority=(lambda i: i.level) if prioritized else None)

    async def call(caller: Caller) -> list | BaseException:
        try:
            return await batcher.submit_many(list(caller.items))
        except asyncio.CancelledError:
            gone.update(i.id for i in caller.items)  # the batcher has dropped them by now
            raise
        except Overloaded as exc:
            return exc

    tasks = []
    for caller in callers:
        await _turns(caller.arrives)
        task = asyncio.ensure_future(call(caller))
        tasks.append(task)
        if caller.leaves is not None:
            asyncio.get_running_loop().call_soon(
                lambda t=task, n=caller.leaves: asyncio.ensure_future(_leave(t, n)))
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    await _turns(10)  # batches whose callers all left wind down

    assert all(0 <= w <= max_waiting for w in waiting_seen)
    assert batcher.waiting == 0 and batcher.in_flight == 0
    assert all(n == 1 for n in runs.values()), "an item ran twice"
    for caller, outcome in zip(callers, outcomes, strict=True):
        ids = [i.id for i in caller.items]
        if isinstance(outcome, asyncio.CancelledError):
            continue  # left: whatever had started may have run once, nothing twice
        if isinstance(outcome, Overloaded):
            assert not any(i in runs for i in ids), "a refused item ran"
            continue
        assert not isinstance(outcome, BaseException), outcome
        for item, result in zip(caller.items, outcome, strict=True):
            if isinstance(result, Overloaded):  # shed for a higher item: never run
                assert prioritized and item.id not in runs
                continue
            assert runs.get(item.id) == 1
            if isinstance(result, RuntimeError):
                assert item.id in crashed  # its batch failed as a whole
                continue
            if item.outcome == "error":
                assert isinstance(result, ValueError) and result.args == (item.id,)
            else:
                assert result == ("done", item.id), (item, result)


async def _leave(task: asyncio.Task, after: int) -> None:
    await _turns(after)
    task.cancel()


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_any_schedule_keeps_the_bounds_loses_nothing_and_runs_nothing_for_leavers(scenario):
    async def bounded() -> None:  # a stranded waiter fails the example instead of hanging
        await asyncio.wait_for(_play(*scenario), 10)

    asyncio.run(bounded())
