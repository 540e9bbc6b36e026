"""Dead queue entries are let go (issue 54, L6): callers that submit and leave while a
batch runs (the head of the queue does not move) leave neither their payloads nor an
ever longer deque behind; the live items are still served, in order."""

from __future__ import annotations

import asyncio

from blitz.pool.aging_queue import AgingQueue
from blitz.pool.batching import Batcher

LIVE = 5
STORM = 2_000


def held(batcher: Batcher) -> tuple[int, int]:
    """(entries the batcher's queue holds, payloads among them)."""
    entries = [e for line in batcher._queue._lines for _, _, e in line]
    return len(entries), sum(e.item is not None for e in entries)


async def test_a_submit_then_disconnect_storm_holds_a_bounded_queue():
    gate = asyncio.Event()
    calls: list[list[str]] = []

    async def run(items):
        calls.append(list(items))
        if len(calls) == 1:
            await gate.wait()  # a long batch: nothing leaves the queue's head meanwhile
        return [item.upper() for item in items]

    batcher = Batcher(run, max_batch=100, max_waiting=LIVE + 1, size=lambda item: 1)
    first = asyncio.ensure_future(batcher.submit("first"))
    await asyncio.sleep(0)
    live = []
    most_entries = most_payloads = 0
    for i in range(STORM):
        if i % (STORM // LIVE) == 0:  # a live caller now and then, between the leavers
            live.append(asyncio.ensure_future(batcher.submit(f"live{len(live)}")))
        leaver = asyncio.ensure_future(batcher.submit("x" * 10_000))
        await asyncio.sleep(0)  # queued
        leaver.cancel()
        await asyncio.gather(leaver, return_exceptions=True)
        entries, payloads = held(batcher)
        most_entries, most_payloads = max(most_entries, entries), max(most_payloads, payloads)
    assert batcher.waiting == LIVE  # the leavers' units were released
    assert most_payloads <= LIVE + 1  # no leaver's payload kept (on main: all 2,000)
    assert most_entries <= 2 * LIVE + 2  # dead ones never outnumber the live for long
    gate.set()
    assert await first == "FIRST"
    assert await asyncio.gather(*live) == [f"LIVE{i}" for i in range(LIVE)]
    assert calls[1:] == [[f"live{i}" for i in range(LIVE)]]  # one batch, in arrival order
    assert held(batcher) == (0, 0)


def test_the_queue_compacts_once_the_dead_outnumber_the_live_and_keeps_order():
    gone: set[int] = set()
    queue: AgingQueue[int] = AgingQueue(levels=3, aging_s=5.0, clock=lambda: 0.0)
    for i in range(30):
        queue.push(i, level=i % 3)
    for i in range(15):  # half leave: not yet more dead than live
        gone.add(i)
        queue.left(gone.__contains__)
    assert len(queue) == 30 and queue.dead == 15
    gone.add(15)
    queue.left(gone.__contains__)  # 16 dead of 30: compacted
    assert len(queue) == 14 and queue.dead == 0
    order = []
    while (head := queue.best(gone.__contains__)) is not None:
        queue.pop(head)
        order.append(head.entry)
    assert order == [i for i in range(16, 30) if i % 3 == 0] + \
        [i for i in range(16, 30) if i % 3 == 1] + [i for i in range(16, 30) if i % 3 == 2]


def test_dead_entries_dropped_at_a_head_are_no_longer_counted():
    gone: set[int] = set()
    queue: AgingQueue[int] = AgingQueue(levels=1, aging_s=5.0, clock=lambda: 0.0)
    for i in range(10):
        queue.push(i, level=0)
    for i in range(3):
        gone.add(i)
        queue.left(gone.__contains__)
    head = queue.best(gone.__contains__)  # drops the three dead at the head
    assert head is not None and head.entry == 3
    assert queue.dead == 0 and len(queue) == 7
