"""Continuous batching: what queues while a call runs goes into the next call."""

from __future__ import annotations

import asyncio

import pytest

from blitz.batching import Coalescer


async def test_items_waiting_behind_a_running_call_are_merged():
    calls: list[list[int]] = []
    gate = asyncio.Event()

    async def run(items):
        calls.append(list(items))
        if len(calls) == 1:
            await gate.wait()
        return [i * 10 for i in items]

    lane = Coalescer(run, max_size=100)
    first = asyncio.ensure_future(lane.submit(0))
    await asyncio.sleep(0)
    rest = [asyncio.ensure_future(lane.submit(i)) for i in range(1, 8)]
    await asyncio.sleep(0)
    assert lane.waiting == 7
    gate.set()
    assert await first == 0 and await asyncio.gather(*rest) == [i * 10 for i in range(1, 8)]
    assert calls == [[0], list(range(1, 8))]


async def test_batches_respect_max_size_and_item_sizes():
    calls = []

    async def run(items):
        calls.append([len(x) for x in items])
        await asyncio.sleep(0)
        return items

    lane = Coalescer(run, max_size=5, size=len, max_in_flight=1)
    await asyncio.gather(*(lane.submit("ab") for _ in range(6)))
    assert all(sum(c) <= 5 for c in calls) and sum(map(sum, calls)) == 12


async def test_errors_reach_their_own_caller_and_failed_calls_reach_everyone():
    async def run(items):
        if "boom" in items:
            raise RuntimeError("model crashed")
        return [ValueError(i) if i == "bad" else i.upper() for i in items]

    lane = Coalescer(run, max_size=10)
    good, bad = await asyncio.gather(lane.submit("ok"), lane.submit("bad"),
                                     return_exceptions=True)
    assert good == "OK" and isinstance(bad, ValueError)
    with pytest.raises(RuntimeError, match="crashed"):
        await lane.submit("boom")
    assert await lane.submit("after") == "AFTER"  # the lane keeps working


async def test_several_calls_in_flight():
    running = 0
    peak = 0

    async def run(items):
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.01)
        running -= 1
        return items

    lane = Coalescer(run, max_size=1, max_in_flight=3)
    assert await asyncio.gather(*(lane.submit(i) for i in range(9))) == list(range(9))
    assert peak == 3
