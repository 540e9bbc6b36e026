"""Model loads (blitz.pool.load_queue): one at a time, each on a thread that ends with it, shared
by their callers, never run for nobody, and bounded by a deadline that a stuck load turns
into an unhealthy replica."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter

import pytest

from blitz.errors import ModelLoadFailed, Unavailable
from blitz.pool.load_queue import LoadQueue, LoadTimedOut
from tests.waiting import wait_until_async

NAME = "test-load"
WAIT_S = 10.0  # bound on every wait; a healthy run needs a small part of it


def load_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(NAME)]


async def until(condition, what: str) -> None:
    await wait_until_async(condition, what, timeout_s=WAIT_S, interval_s=0.01)


class Loads:
    """Load functions that count their runs; ``hang(key)`` blocks until ``release``."""

    def __init__(self) -> None:
        self.runs: Counter[str] = Counter()
        self.release = threading.Event()
        self.running = 0
        self.most = 0
        self._guard = threading.Lock()

    def quick(self, key: str):
        def load() -> str:
            with self._guard:
                self.runs[key] += 1
                self.running += 1
                self.most = max(self.most, self.running)
            time.sleep(0.02)
            with self._guard:
                self.running -= 1
            return f"model {key}"
        return load

    def hang(self, key: str):
        def load() -> str:
            self.runs[key] += 1
            self.release.wait(WAIT_S)
            return f"model {key}"
        return load


# The first two hold what tests/unit/test_pool_loads.py held for the loader this replaced.


async def test_a_load_runs_on_a_thread_of_its_own_that_ends_with_it():
    queue: LoadQueue[str] = LoadQueue(deadline_s=WAIT_S, name=NAME)
    loop_thread = threading.current_thread().name
    name = await queue.in_turn("a", lambda: threading.current_thread().name)
    assert name != loop_thread and name.startswith(NAME)
    await until(lambda: not load_threads(), "the load thread to end")


async def test_loads_run_one_at_a_time_in_order_and_errors_reach_their_callers():
    queue: LoadQueue[str] = LoadQueue(deadline_s=WAIT_S, name=NAME)
    loads = Loads()

    def broken() -> str:
        raise ValueError("no such model")

    results = await asyncio.gather(*(queue.in_turn(k, loads.quick(k)) for k in "abc"),
                                   queue.in_turn("broken", broken), return_exceptions=True)
    assert results[:3] == ["model a", "model b", "model c"] and loads.most == 1
    assert isinstance(results[3], ValueError)


async def test_a_hung_load_abandoned_by_20_callers_leaves_one_thread_and_runs_once():
    """Each caller gives up (Serve's and the ingress's timeouts): none leaves a thread
    queued behind the hung one, and none of their loads runs after it, for nobody."""
    queue: LoadQueue[str] = LoadQueue(deadline_s=WAIT_S, name=NAME)
    loads = Loads()
    for i in range(20):
        key = "hung" if i % 2 == 0 else f"other-{i}"
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(queue.in_turn(key, loads.hang(key)), 0.02)
    assert len(load_threads()) == 1 and dict(loads.runs) == {"hung": 1}

    loads.release.set()
    await until(lambda: not load_threads() and queue.loading is None, "the queue to drain")
    assert dict(loads.runs) == {"hung": 1}  # the abandoned loads never ran
    assert await queue.in_turn("other-1", loads.quick("other-1")) == "model other-1"


async def test_a_second_caller_shares_the_load_in_flight():
    queue: LoadQueue[str] = LoadQueue(deadline_s=WAIT_S, name=NAME)
    loads = Loads()
    first = asyncio.ensure_future(queue.in_turn("a", loads.hang("a")))
    await until(lambda: loads.runs["a"] == 1, "the load to start")
    second = asyncio.ensure_future(queue.in_turn("a", loads.hang("a")))
    await until(lambda: queue._loads["a"].waiters == 2, "the second caller to join")
    loads.release.set()
    assert await asyncio.gather(first, second) == ["model a", "model a"]
    assert loads.runs == {"a": 1} and len(load_threads()) <= 1


async def test_a_caller_leaving_does_not_cancel_the_load_for_the_others():
    queue: LoadQueue[str] = LoadQueue(deadline_s=WAIT_S, name=NAME)
    loads = Loads()
    leaving = asyncio.ensure_future(queue.in_turn("a", loads.hang("a")))
    staying = asyncio.ensure_future(queue.in_turn("a", loads.hang("a")))
    await until(lambda: loads.runs["a"] == 1, "the load to start")
    leaving.cancel()
    await until(leaving.done, "the leaving caller to go")
    loads.release.set()
    assert await asyncio.wait_for(staying, WAIT_S) == "model a"
    assert leaving.cancelled() and loads.runs == {"a": 1}


async def test_a_load_past_its_deadline_fails_its_callers_and_makes_the_replica_unhealthy():
    failures: list[tuple[str, Exception]] = []

    def on_failure(key: str, exc: Exception) -> ModelLoadFailed:
        failures.append((key, exc))
        return ModelLoadFailed(f"model {key!r}: {exc}", model=key)

    queue: LoadQueue[str] = LoadQueue(deadline_s=0.3, grace_s=0.2, name=NAME,
                                      on_failure=on_failure)
    loads = Loads()
    started = time.monotonic()
    callers = [asyncio.ensure_future(queue.in_turn("hung", loads.hang("hung"))) for _ in range(2)]
    behind = asyncio.ensure_future(queue.in_turn("b", loads.quick("b")))
    results = await asyncio.gather(*callers, behind, return_exceptions=True)

    assert 0.3 <= time.monotonic() - started < 2
    assert all(isinstance(r, ModelLoadFailed) and r.status == 424 for r in results[:2])
    assert [(key, type(exc)) for key, exc in failures] == [("hung", LoadTimedOut)]  # once
    assert isinstance(results[2], Unavailable)  # nothing can load behind a stuck load
    with pytest.raises(Unavailable):  # nor can a new one
        await queue.in_turn("c", loads.quick("c"))
    await until(lambda: queue.problem() is not None, "the stuck load to be reported")
    assert "'hung' is stuck" in queue.problem()

    loads.release.set()  # the load ends after all: the replica is healthy again
    await until(lambda: queue.problem() is None and queue.loading is None, "the load to end")
    assert await queue.in_turn("c", loads.quick("c")) == "model c"
    assert loads.runs == {"hung": 1, "c": 1}
