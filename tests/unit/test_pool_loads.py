"""Model loads run on a thread of their own that ends with the load (deployments/pool.py):
a long-lived loader thread that once ran torch keeps an idle OpenMP team that slowed the
worker's torch fp32 by ~15%."""

from __future__ import annotations

import asyncio
import threading
import time

from deployments.pool import in_own_thread


def load_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("test-load")]


def test_a_load_runs_off_the_event_loop_and_its_thread_ends_with_it():
    async def main() -> tuple[str, int]:
        loop_thread = threading.current_thread().name
        name = await in_own_thread(lambda: threading.current_thread().name, "test-load",
                                   threading.Lock())
        assert name != loop_thread and name.startswith("test-load")
        for _ in range(200):  # the thread exits right after the call returns
            if not load_threads():
                break
            await asyncio.sleep(0.01)
        return name, len(load_threads())

    _, left = asyncio.run(main())
    assert left == 0


def test_loads_run_one_at_a_time_and_errors_reach_the_caller():
    running, most = 0, 0
    guard = threading.Lock()

    def load() -> int:
        nonlocal running, most
        with guard:
            running += 1
            most = max(most, running)
        time.sleep(0.05)
        with guard:
            running -= 1
        return 1

    def broken() -> int:
        raise ValueError("no such model")

    async def main() -> list:
        lock = threading.Lock()
        return await asyncio.gather(*(in_own_thread(load, "test-load", lock) for _ in range(3)),
                                    in_own_thread(broken, "test-load", lock),
                                    return_exceptions=True)

    results = asyncio.run(main())
    assert results[:3] == [1, 1, 1] and most == 1
    assert isinstance(results[3], ValueError)
