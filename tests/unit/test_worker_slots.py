"""Worker threads counted by what they really do (blitz.pool.worker_slots): a call that times out
keeps its worker until its thread returns, no call waits behind a hung thread, and a
replica whose workers are all stuck refuses work and reports itself unhealthy."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from blitz.errors import TimedOut, Unavailable
from blitz.pool.worker_slots import WorkerSlots

WAIT_S = 10.0  # bound on every wait; a healthy run needs a small part of it
CALL_S = 0.2  # the call timeout, and how long a call runs before its worker is stuck


async def until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


class Calls:
    def __init__(self) -> None:
        self.release = threading.Event()
        self.ran: list[str] = []

    def hang(self, name: str):
        def call() -> str:
            self.ran.append(name)
            self.release.wait(WAIT_S)
            return name
        return call

    def quick(self, name: str):
        def call() -> str:
            self.ran.append(name)
            return name
        return call


async def test_two_hung_calls_on_two_workers_refuse_new_work_and_fail_health():
    slots = WorkerSlots(2, stuck_after_s=CALL_S, name="test-worker")
    calls = Calls()
    try:
        for name in ("hung-1", "hung-2"):
            with pytest.raises(TimedOut):
                await slots.run(calls.hang(name), CALL_S)
        assert slots.busy == 2  # the callers left, the threads did not
        await until(lambda: slots.stuck == 2, "both workers to be stuck")
        assert "all 2 worker threads are stuck" in slots.problem()

        started = time.monotonic()
        with pytest.raises(Unavailable) as refused:
            await slots.run(calls.quick("new"), CALL_S)
        assert time.monotonic() - started < CALL_S  # at once, not after a timeout
        assert refused.value.status == 503
    finally:
        calls.release.set()
    await until(lambda: slots.busy == 0, "the hung threads to return")
    assert slots.problem() is None
    assert await slots.run(calls.quick("after"), CALL_S) == "after"
    assert calls.ran == ["hung-1", "hung-2", "after"]  # the refused call never ran


async def test_a_hung_call_that_finally_returns_frees_its_worker():
    slots = WorkerSlots(1, stuck_after_s=CALL_S, name="test-worker")
    calls = Calls()

    def broken() -> str:
        raise ValueError("bad input")

    with pytest.raises(ValueError, match="bad input"):  # an error frees its worker too
        await slots.run(broken, CALL_S)
    await until(lambda: slots.busy == 0, "the failed call's worker to be free")
    with pytest.raises(TimedOut):
        await slots.run(calls.hang("hung"), CALL_S)
    assert slots.busy == 1
    calls.release.set()
    await until(lambda: slots.busy == 0, "the hung call to return")
    started = time.monotonic()
    assert await slots.run(calls.quick("next"), CALL_S) == "next"
    assert time.monotonic() - started < CALL_S


async def test_a_caller_leaving_while_it_waits_takes_no_worker_with_it():
    slots = WorkerSlots(1, stuck_after_s=WAIT_S, name="test-worker")
    calls = Calls()
    busy = asyncio.ensure_future(slots.run(calls.hang("busy"), WAIT_S))
    await until(lambda: calls.ran == ["busy"], "the first call to start")
    leaving = asyncio.ensure_future(slots.run(calls.quick("leaving"), WAIT_S))
    await until(lambda: slots.waiting == 1, "the second call to wait")
    leaving.cancel()
    await asyncio.sleep(0.05)
    calls.release.set()
    await busy
    assert await asyncio.wait_for(slots.run(calls.quick("next"), CALL_S), WAIT_S) == "next"
    assert calls.ran == ["busy", "next"] and slots.waiting == 0
