"""Continuous batching: merged while a call runs, bounded, cancellation-aware, timed."""

from __future__ import annotations

import asyncio

import pytest

from blitz.errors import Overloaded, TimedOut, Unavailable
from blitz.pool.batching import Batcher


async def test_items_waiting_behind_a_running_call_are_merged():
    calls: list[list[int]] = []
    gate = asyncio.Event()

    async def run(items):
        calls.append(list(items))
        if len(calls) == 1:
            await gate.wait()
        return [i * 10 for i in items]

    batcher = Batcher(run, max_batch=100, max_waiting=100, size=lambda item: 1)
    first = asyncio.ensure_future(batcher.submit(0))
    await asyncio.sleep(0)
    rest = [asyncio.ensure_future(batcher.submit(i)) for i in range(1, 8)]
    await asyncio.sleep(0)
    assert batcher.waiting == 7
    gate.set()
    assert await first == 0 and await asyncio.gather(*rest) == [i * 10 for i in range(1, 8)]
    assert calls == [[0], list(range(1, 8))]


async def test_batches_respect_max_size_and_item_sizes():
    calls = []

    async def run(items):
        calls.append([len(x) for x in items])
        await asyncio.sleep(0)
        return items

    batcher = Batcher(run, max_batch=5, max_waiting=100, size=len, max_in_flight=1)
    await asyncio.gather(*(batcher.submit("ab") for _ in range(6)))
    # the first runs alone; the five that queued behind it merge two at a time (4 <= 5 < 6)
    assert calls == [[2], [2, 2], [2, 2], [2]]


async def test_errors_reach_their_own_caller_and_failed_calls_reach_everyone():
    async def run(items):
        if "boom" in items:
            raise RuntimeError("model crashed")
        return [ValueError(i) if i == "bad" else i.upper() for i in items]

    batcher = Batcher(run, max_batch=10, max_waiting=10, size=lambda item: 1)
    good, bad = await asyncio.gather(batcher.submit("ok"), batcher.submit("bad"),
                                     return_exceptions=True)
    assert good == "OK" and isinstance(bad, ValueError)
    with pytest.raises(RuntimeError, match="crashed"):
        await batcher.submit("boom")
    assert await batcher.submit("after") == "AFTER"  # the batcher keeps working


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

    batcher = Batcher(run, max_batch=1, max_waiting=100, size=lambda item: 1,
                   max_in_flight=3)
    assert await asyncio.gather(*(batcher.submit(i) for i in range(9))) == list(range(9))
    assert peak == 3


def _gated():
    """A run function that holds its first call until the gate opens."""
    calls: list[list] = []
    gate = asyncio.Event()

    async def run(items):
        calls.append(list(items))
        if len(calls) == 1:
            await gate.wait()
        return list(items)

    return run, calls, gate


async def test_a_full_queue_refuses_at_once_and_counts_it():
    run, calls, gate = _gated()
    rejected = []
    batcher = Batcher(run, max_batch=4, max_waiting=6, size=len,
                   on_reject=lambda: rejected.append(1))
    first = asyncio.ensure_future(batcher.submit("aaaa"))  # runs, holds the slot
    await asyncio.sleep(0)
    queued = [asyncio.ensure_future(batcher.submit("aaa")) for _ in range(2)]  # 6 texts wait
    await asyncio.sleep(0)
    assert batcher.waiting == 6
    with pytest.raises(Overloaded, match="limit 6"):
        await batcher.submit("a")
    assert rejected == [1] and batcher.waiting == 6  # the refused item takes no room
    gate.set()
    assert await first == "aaaa" and await asyncio.gather(*queued) == ["aaa", "aaa"]
    assert batcher.waiting == 0 and await batcher.submit("a") == "a"  # room again


async def test_on_waiting_hears_every_change_in_the_queue_depth():
    run, calls, gate = _gated()
    depths: list[int] = []
    batcher = Batcher(run, max_batch=4, max_waiting=8, size=len, on_waiting=depths.append)
    first = asyncio.ensure_future(batcher.submit("aa"))  # runs at once: nothing waits
    await asyncio.sleep(0)
    queued = [asyncio.ensure_future(batcher.submit(t)) for t in ("aaa", "a", "aa")]
    await asyncio.sleep(0)
    queued[1].cancel()  # a caller that leaves while queued frees its place
    await asyncio.sleep(0)
    assert depths == [0, 3, 4, 6, 5] and batcher.waiting == 5
    gate.set()
    assert await first == "aa" and await asyncio.gather(queued[0], queued[2]) == ["aaa", "aa"]
    assert depths[-1] == 0 and batcher.waiting == 0 and calls == [["aa"], ["aaa"], ["aa"]]


async def test_cancelled_callers_are_dropped_before_their_batch_runs():
    run, calls, gate = _gated()
    batcher = Batcher(run, max_batch=10, max_waiting=10, size=lambda item: 1)
    first = asyncio.ensure_future(batcher.submit("first"))
    await asyncio.sleep(0)
    gone = asyncio.ensure_future(batcher.submit("gone"))
    kept = asyncio.ensure_future(batcher.submit("kept"))
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.sleep(0)
    assert batcher.waiting == 1  # the cancelled item no longer counts against the bound
    gate.set()
    assert await first == "first" and await kept == "kept"
    assert calls == [["first"], ["kept"]]  # "gone" was never computed


async def test_a_running_batch_whose_callers_all_left_is_cancelled():
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def run(items):
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return items

    batcher = Batcher(run, max_batch=10, max_waiting=10, size=lambda item: 1)
    caller = asyncio.ensure_future(batcher.submit("x"))
    await started.wait()
    caller.cancel()
    await asyncio.wait_for(cancelled.wait(), 5)
    await asyncio.sleep(0)
    assert batcher.in_flight == 0


async def test_a_hung_batch_times_out_and_frees_its_slot():
    hang = asyncio.Event()

    async def run(items):
        if "hang" in items:
            await hang.wait()  # never set
        return items

    batcher = Batcher(run, max_batch=1, max_waiting=10, size=lambda item: 1,
                   timeout_s=0.05, name="test batcher")
    with pytest.raises(TimedOut, match="test batcher"):
        await batcher.submit("hang")
    assert batcher.in_flight == 0
    assert await batcher.submit("next") == "next"


async def test_a_wrong_number_of_results_fails_every_item_of_that_batch():
    async def run(items):
        return items[1:]

    batcher = Batcher(run, max_batch=10, max_waiting=10, size=lambda item: 1)
    with pytest.raises(RuntimeError, match="1 items"):
        await batcher.submit(1)


async def test_items_submitted_together_share_one_batch_even_when_idle():
    calls: list[list[int]] = []

    async def run(items):
        calls.append(list(items))
        return [i * 10 if i >= 0 else ValueError(f"bad {i}") for i in items]

    batcher = Batcher(run, max_batch=3, max_waiting=100, size=lambda item: 1)
    results = await batcher.submit_many([1, -2, 3, 4])
    assert calls == [[1, -2, 3], [4]]  # one batch up to max_batch, not one per item
    assert results[0] == 10 and results[2:] == [30, 40]
    assert isinstance(results[1], ValueError)  # a failed item fails alone, as a value
    assert batcher.waiting == 0


async def test_items_submitted_together_are_refused_together_when_they_do_not_fit():
    run, calls, gate = _gated()
    batcher = Batcher(run, max_batch=10, max_waiting=4, size=lambda item: 1)
    first = asyncio.ensure_future(batcher.submit("first"))
    await asyncio.sleep(0)
    queued = asyncio.ensure_future(batcher.submit_many(["a", "b"]))
    await asyncio.sleep(0)
    with pytest.raises(Overloaded):
        await batcher.submit_many(["c", "d", "e"])
    assert batcher.waiting == 2
    gate.set()
    assert await first == "first" and await queued == ["a", "b"]


async def test_a_cancelled_group_releases_all_its_queued_items():
    run, calls, gate = _gated()
    batcher = Batcher(run, max_batch=10, max_waiting=10, size=lambda item: 1)
    first = asyncio.ensure_future(batcher.submit("first"))
    await asyncio.sleep(0)
    group = asyncio.ensure_future(batcher.submit_many(["x", "y", "z"]))
    await asyncio.sleep(0)
    assert batcher.waiting == 3
    group.cancel()
    await asyncio.sleep(0)
    assert batcher.waiting == 0
    gate.set()
    assert await first == "first"
    await asyncio.sleep(0)
    assert calls == [["first"]]  # none of the group was computed


async def test_a_call_cancelled_under_the_batch_fails_its_callers_instead_of_leaving_them():
    """Serve cancels calls made under a request when that request is cancelled; a merged
    pool call cancelled that way is not "every caller has gone": the other callers must
    still be answered."""
    async def run(items):
        raise asyncio.CancelledError  # from the call, not from the batch's own cancel

    batcher = Batcher(run, max_batch=10, max_waiting=10, size=lambda item: 1)
    results = await asyncio.wait_for(asyncio.gather(batcher.submit(1), batcher.submit(2),
                                                    return_exceptions=True), 5)
    assert all(isinstance(r, Unavailable) for r in results)
    assert batcher.in_flight == 0


async def test_a_batch_runs_in_a_context_of_its_own():
    """Nothing tied to the caller that starts a batch (Serve's request context) reaches the
    call made for every caller of the batch."""
    import contextvars

    request = contextvars.ContextVar("request", default=None)
    seen = []

    async def run(items):
        seen.append(request.get())
        return items

    batcher = Batcher(run, max_batch=10, max_waiting=10, size=lambda item: 1)
    request.set("the first caller's request")
    assert await batcher.submit(1) == 1
    assert seen == [None]
