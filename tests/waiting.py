"""Bounded waits: poll a condition until it holds, instead of sleeping and hoping.

``wait_until`` blocks (for sync tests and threads); ``wait_until_async`` awaits (for async
tests; its condition may be sync or async). Both return the condition's first truthy value
and fail the test naming ``what`` when ``timeout_s`` passes first.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

T = TypeVar("T")

Describe = str | Callable[[], str]  # a callable is asked only on failure, for the latest state


def _fail(what: Describe, timeout_s: float) -> None:
    pytest.fail(f"timed out after {timeout_s:g} s waiting for "
                f"{what() if callable(what) else what}")


def wait_until(condition: Callable[[], T], what: Describe, timeout_s: float = 30,
               interval_s: float = 0.05) -> T:
    """Call ``condition`` until it returns something truthy, and return that."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            _fail(what, timeout_s)
        time.sleep(interval_s)


async def wait_until_async(condition: Callable[[], T | Awaitable[T]], what: Describe,
                           timeout_s: float = 30, interval_s: float = 0.05) -> T:
    """Like ``wait_until``, without blocking the event loop; awaits ``condition()`` when it
    returns an awaitable."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() > deadline:
            _fail(what, timeout_s)
        await asyncio.sleep(interval_s)
