"""Priorities in the queues (``blitz.pool.aging_queue``, ``blitz.pool.batching``): higher
first, FIFO within a level, aging so that low is never starved, a full queue sheds its
newest low work for higher work, one level per batch, the last run slot kept for
interactive work while it arrives, and nothing left behind by a caller that leaves."""

from __future__ import annotations

import asyncio

import pytest

from blitz.errors import Overloaded
from blitz.hop_messages import HIGH, LOW, NORMAL
from blitz.pool.aging_queue import AgingQueue
from blitz.pool.batching import Batcher


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def never_gone(_: object) -> bool:
    return False


def drain(queue: AgingQueue, gone=never_gone) -> list:
    out = []
    while (head := queue.best(gone)) is not None:
        queue.pop(head)
        out.append(head.entry)
    return out


# ---- the queue ---------------------------------------------------------------------------

def test_higher_levels_first_and_fifo_within_a_level():
    queue: AgingQueue[str] = AgingQueue(3, aging_s=5, clock=Clock())
    for name, level in [("low1", LOW), ("n1", NORMAL), ("high1", HIGH), ("low2", LOW),
                        ("n2", NORMAL), ("high2", HIGH)]:
        queue.push(name, level)
    assert len(queue) == 6
    assert drain(queue) == ["high1", "high2", "n1", "n2", "low1", "low2"]
    assert len(queue) == 0 and queue.best(never_gone) is None


def test_a_waiting_low_entry_moves_up_a_level_every_aging_period():
    clock = Clock()
    queue: AgingQueue[str] = AgingQueue(3, aging_s=5, clock=clock)
    queue.push("low", LOW)
    clock.now += 4.9
    queue.push("normal", NORMAL)
    assert queue.best(never_gone).entry == "normal"  # 4.9 s: still low
    clock.now += 0.2  # 5.1 s: competes as normal, and came first
    head = queue.best(never_gone)
    assert (head.entry, head.line, head.level) == ("low", LOW, NORMAL)
    queue.push("high", HIGH)
    assert queue.best(never_gone).entry == "high"  # high beats low-aged-to-normal
    clock.now += 5  # 10.1 s: as high, and came before the high entry
    assert queue.best(never_gone).entry == "low"


def test_low_is_never_starved_by_a_steady_stream_of_high():
    clock = Clock()
    queue: AgingQueue[str] = AgingQueue(3, aging_s=5, clock=clock)
    queue.push("low", LOW)
    served = []
    for i in range(200):  # one high arrives and one entry is served every 0.1 s
        queue.push(f"high{i}", HIGH)
        head = queue.best(never_gone)
        queue.pop(head)
        served.append(head.entry)
        clock.now += 0.1
        if head.entry == "low":
            break
    assert "low" in served
    assert served.index("low") <= 2 * 5 / 0.1 + 3  # within two aging periods


def test_gone_entries_are_dropped_when_they_reach_a_head():
    queue: AgingQueue[str] = AgingQueue(3, aging_s=5, clock=Clock())
    for name in ("a", "b", "c"):
        queue.push(name, NORMAL)
    queue.push("x", LOW)
    gone = {"a", "c", "x"}
    assert drain(queue, gone.__contains__) == ["b"]
    assert len(queue) == 0


def test_shedding_takes_the_newest_lower_entries_that_have_not_aged_up():
    clock = Clock()
    queue: AgingQueue[str] = AgingQueue(3, aging_s=5, clock=clock)
    queue.push("old-low", LOW)
    clock.now += 6  # aged to normal
    queue.push("low1", LOW)
    queue.push("low2", LOW)
    queue.push("normal", NORMAL)
    one = {"old-low": 1, "low1": 1, "low2": 1, "normal": 1}.__getitem__
    # room for a normal entry: the newest low first; the aged one competes as normal
    assert queue.shed(NORMAL, 1, one, never_gone) == ["low2"]
    assert queue.shed(NORMAL, 2, one, never_gone) == []  # only low1 could go: none does
    assert len(queue) == 3
    assert queue.shed(HIGH, 3, one, never_gone) == ["low1", "old-low", "normal"]
    assert len(queue) == 0
    queue.push("low", LOW)
    assert queue.shed(LOW, 1, one, never_gone) == []  # nothing is below low


def test_shedding_skips_and_drops_entries_whose_callers_left():
    queue: AgingQueue[str] = AgingQueue(3, aging_s=5, clock=Clock())
    for name in ("a", "b", "c"):
        queue.push(name, LOW)
    sizes = {"a": 2, "b": 5, "c": 1}
    assert queue.shed(HIGH, 3, sizes.__getitem__, {"c"}.__contains__) == ["b"]
    assert drain(queue) == ["a"]  # c was dropped on the way, b taken out


# ---- the batcher -------------------------------------------------------------------------

class Gated:
    """A batch function that records each batch and holds the first until ``open``."""

    def __init__(self) -> None:
        self.batches: list[list[tuple[str, int]]] = []
        self.gate = asyncio.Event()

    async def __call__(self, items):
        self.batches.append([(name, level) for name, level in items])
        if len(self.batches) == 1:
            await self.gate.wait()
        return [name for name, _ in items]


def prioritized(run, clock=None, **options) -> Batcher:
    defaults = {"max_batch": 10, "max_waiting": 100, "size": lambda item: 1}
    return Batcher(run, priority=lambda item: item[1],
                   promote=lambda item, level: (item[0], level),
                   clock=clock or Clock(), **{**defaults, **options})


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def test_the_batcher_runs_high_before_low_and_one_level_per_batch():
    run = Gated()
    batcher = prioritized(run)
    first = asyncio.ensure_future(batcher.submit(("first", LOW)))
    await settle()
    waiting = [asyncio.ensure_future(batcher.submit(item)) for item in
               [("low1", LOW), ("n1", NORMAL), ("high1", HIGH), ("low2", LOW), ("high2", HIGH)]]
    await settle()
    run.gate.set()
    assert await first == "first"
    assert await asyncio.gather(*waiting) == ["low1", "n1", "high1", "low2", "high2"]
    assert [[name for name, _ in batch] for batch in run.batches] == [
        ["first"], ["high1", "high2"], ["n1"], ["low1", "low2"]]


async def test_an_aged_item_is_handed_on_at_the_level_it_reached():
    run, clock = Gated(), Clock()
    batcher = prioritized(run, clock)
    first = asyncio.ensure_future(batcher.submit(("first", NORMAL)))
    await settle()
    low = asyncio.ensure_future(batcher.submit(("low", LOW)))
    await settle()
    clock.now += 11  # two aging periods: it competes, and is handed on, as high
    normal = asyncio.ensure_future(batcher.submit(("normal", NORMAL)))
    await settle()
    run.gate.set()
    await asyncio.gather(first, low, normal)
    assert run.batches[1:] == [[("low", HIGH)], [("normal", NORMAL)]]


async def test_a_full_queue_sheds_its_newest_low_work_for_higher_work():
    run = Gated()
    rejected = []
    batcher = prioritized(run, max_waiting=3, on_reject=lambda: rejected.append(1))
    first = asyncio.ensure_future(batcher.submit(("first", LOW)))
    await settle()
    lows = [asyncio.ensure_future(batcher.submit((f"low{i}", LOW))) for i in range(3)]
    await settle()
    with pytest.raises(Overloaded):  # low cannot push low out
        await batcher.submit(("low3", LOW))
    high = asyncio.ensure_future(batcher.submit(("high", HIGH)))
    await settle()
    assert lows[2].done() and isinstance(lows[2].exception(), Overloaded)  # the newest low
    assert batcher.waiting == 3 and len(rejected) == 2
    run.gate.set()
    assert await high == "high" and await first == "first"
    assert await asyncio.gather(*lows[:2]) == ["low0", "low1"]
    assert batcher.waiting == 0


async def test_a_full_queue_of_higher_work_refuses_the_newcomer():
    run = Gated()
    batcher = prioritized(run, max_waiting=2)
    first = asyncio.ensure_future(batcher.submit(("first", HIGH)))
    await settle()
    highs = [asyncio.ensure_future(batcher.submit((f"h{i}", HIGH))) for i in range(2)]
    await settle()
    with pytest.raises(Overloaded):
        await batcher.submit(("normal", NORMAL))
    assert batcher.waiting == 2 and not any(h.done() for h in highs)
    run.gate.set()
    await asyncio.gather(first, *highs)


async def test_a_cancelled_waiter_leaves_no_units_and_is_never_run():
    run = Gated()
    batcher = prioritized(run)
    first = asyncio.ensure_future(batcher.submit(("first", NORMAL)))
    await settle()
    leaving = asyncio.ensure_future(batcher.submit(("leaving", HIGH)))
    staying = asyncio.ensure_future(batcher.submit(("staying", LOW)))
    await settle()
    assert batcher.waiting == 2
    leaving.cancel()
    await settle()
    assert batcher.waiting == 1
    run.gate.set()
    assert await staying == "staying" and await first == "first"
    assert [name for batch in run.batches for name, _ in batch] == ["first", "staying"]
    assert batcher.waiting == 0 and batcher.in_flight == 0


async def test_a_cancelled_shed_victim_is_not_released_twice():
    run = Gated()
    batcher = prioritized(run, max_waiting=1)
    first = asyncio.ensure_future(batcher.submit(("first", LOW)))
    await settle()
    low = asyncio.ensure_future(batcher.submit(("low", LOW)))
    await settle()
    high = asyncio.ensure_future(batcher.submit(("high", HIGH)))
    await settle()
    assert low.done() and isinstance(low.exception(), Overloaded)
    high.cancel()
    await settle()
    assert batcher.waiting == 0  # neither the shed item nor the cancelled one counts
    run.gate.set()
    await first
    assert batcher.waiting == 0 and batcher.in_flight == 0


async def test_low_work_leaves_the_last_slot_while_interactive_work_arrives():
    clock = Clock()
    started: list[str] = []
    gates = {name: asyncio.Event() for name in ("low1", "low2", "low3", "normal")}

    async def run(items):
        started.extend(name for name, _ in items)
        for name, _ in items:
            await gates[name].wait()
        return [name for name, _ in items]

    batcher = prioritized(run, clock, max_in_flight=2, max_batch=1)
    # bulk alone: it takes both slots
    lows = [asyncio.ensure_future(batcher.submit((f"low{i}", LOW))) for i in (1, 2)]
    await settle()
    assert started == ["low1", "low2"] and not batcher.keeps_slot()
    normal = asyncio.ensure_future(batcher.submit(("normal", NORMAL)))
    low3 = asyncio.ensure_future(batcher.submit(("low3", LOW)))
    await settle()
    assert batcher.keeps_slot()
    gates["low1"].set()  # a slot frees: the normal item takes it
    await settle()
    assert started == ["low1", "low2", "normal"]
    gates["low2"].set()  # the last free slot: kept from low3 while interactive work arrives
    await settle()
    assert started == ["low1", "low2", "normal"]
    gates["normal"].set()  # a slot frees that is not the last: low3 runs
    gates["low3"].set()
    await asyncio.gather(*lows, normal, low3)
    assert started == ["low1", "low2", "normal", "low3"]
    clock.now += 6  # no interactive work within aging_s: nothing is kept
    assert not batcher.keeps_slot()


async def test_a_batcher_without_priorities_is_plain_fifo():
    run = Gated()
    batcher = Batcher(run, max_batch=10, max_waiting=100, size=lambda item: 1)
    first = asyncio.ensure_future(batcher.submit(("first", LOW)))
    await settle()
    rest = [asyncio.ensure_future(batcher.submit(item))
            for item in [("low", LOW), ("high", HIGH), ("normal", NORMAL)]]
    await settle()
    run.gate.set()
    await asyncio.gather(first, *rest)
    assert [[name for name, _ in batch] for batch in run.batches] == [
        ["first"], ["low", "high", "normal"]]
    assert not batcher.keeps_slot()


async def test_each_batch_reports_its_level_and_its_oldest_items_wait():
    run, clock = Gated(), Clock()
    waited: list[tuple[int, float]] = []
    batcher = prioritized(run, clock, on_waited=lambda level, s: waited.append((level, s)))
    first = asyncio.ensure_future(batcher.submit(("first", NORMAL)))
    await settle()
    low = asyncio.ensure_future(batcher.submit(("low", LOW)))
    await settle()
    clock.now += 2
    lows = [asyncio.ensure_future(batcher.submit((f"low{i}", LOW))) for i in range(3)]
    await settle()
    run.gate.set()
    await asyncio.gather(first, low, *lows)
    assert run.batches[1] == [("low", LOW)] + [(f"low{i}", LOW) for i in range(3)]
    assert waited == [(NORMAL, 0.0), (LOW, 2.0)]  # one value per batch: its oldest
