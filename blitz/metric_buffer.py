"""Counter increments and gauge values gathered in the process, recorded once a second.

Recording one value on a Ray metric costs the caller tens of microseconds (tags merged
and checked in Python, then handed to Ray's core), and the ingress recorded about ten
per request: under load that was a fifth of its event loop's time (py-spy, BENCHMARKS.md
"Round nine"). A counter is a sum and a gauge its last value, so both can be gathered
here and handed on once per ``interval_s`` and label set, which changes nothing a
scrape reads (Ray itself exports every few seconds) and costs a dict update per value.
Histograms need every value and are not gathered.

- **Where**: values added on a thread running an asyncio loop are gathered, and the
  first one schedules the flush on that loop (``call_later``). A value added with no
  running loop (a worker thread, a test) is recorded at once: nothing waits on a loop
  that may never run it.
- **Lost at most**: the last interval's values, if the process dies or its loop closes
  before the flush runs.
- **Failures**: a metric that refuses a value is logged and skipped; the rest still go.
- **Pickled** (Ray ships a deployment with what it references), a buffer arrives empty.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Hashable, Mapping
from typing import Any, Protocol

logger = logging.getLogger("blitz.metrics")

FLUSH_INTERVAL_S = 1.0


class CounterLike(Protocol):  # ray.serve.metrics.Counter, as Ray 2.60 annotates it
    def inc(self, value: float, tags: dict[str, str]) -> object: ...


class GaugeLike(Protocol):  # ray.serve.metrics.Gauge
    def set(self, value: float, tags: dict[str, str]) -> object: ...


class MetricBuffer:
    def __init__(self, interval_s: float = FLUSH_INTERVAL_S):
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._sums: dict[Hashable, list[Any]] = {}  # key -> [counter, tags, sum]
        self._lasts: dict[Hashable, list[Any]] = {}  # key -> [gauge, tags, last value]
        self._flush_on: asyncio.AbstractEventLoop | None = None  # the loop a flush waits on

    def __getstate__(self) -> dict[str, float]:
        """A copy (Ray pickles deployments with what they reference) starts empty: the
        values gathered are this process's to record."""
        return {"interval_s": self.interval_s}

    def __setstate__(self, state: dict[str, float]) -> None:
        self.__init__(state["interval_s"])  # type: ignore[misc]

    @property
    def pending(self) -> int:
        """Label sets with a value not yet recorded."""
        with self._lock:
            return len(self._sums) + len(self._lasts)

    def inc(self, counter: CounterLike, value: float, tags: Mapping[str, str]) -> None:
        """Add ``value`` (> 0) to ``counter`` under ``tags``, at the next flush."""
        loop = _running_loop()
        if loop is None:
            counter.inc(value, tags=dict(tags))
            return
        key = (id(counter), *tags.items())
        with self._lock:
            entry = self._sums.get(key)
            if entry is None:
                self._sums[key] = [counter, dict(tags), value]
            else:
                entry[2] += value
            schedule = self._claim_flush(loop)
        if schedule:
            loop.call_later(self.interval_s, self.flush)

    def set(self, gauge: GaugeLike, value: float, tags: Mapping[str, str]) -> None:
        """Set ``gauge`` under ``tags`` to ``value`` at the next flush (the last value set
        by then wins)."""
        loop = _running_loop()
        if loop is None:
            gauge.set(value, tags=dict(tags))
            return
        key = (id(gauge), *tags.items())
        with self._lock:
            entry = self._lasts.get(key)
            if entry is None:
                self._lasts[key] = [gauge, dict(tags), value]
            else:
                entry[2] = value
            schedule = self._claim_flush(loop)
        if schedule:
            loop.call_later(self.interval_s, self.flush)

    def _claim_flush(self, loop: asyncio.AbstractEventLoop) -> bool:
        """True for the one caller that must schedule the next flush on ``loop`` (lock
        held): none is pending, or the one pending waits on a loop that has closed."""
        pending = self._flush_on
        if pending is loop or (pending is not None and not pending.is_closed()):
            return False
        self._flush_on = loop
        return True

    def flush(self) -> None:
        """Record everything gathered so far, now."""
        with self._lock:
            sums, lasts = self._sums, self._lasts
            self._sums, self._lasts = {}, {}
            self._flush_on = None
        for counter, tags, total in sums.values():
            _record(counter.inc, total, tags)
        for gauge, tags, last in lasts.values():
            _record(gauge.set, last, tags)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _record(method: Any, value: float, tags: dict[str, str]) -> None:
    try:
        method(value, tags=tags)
    except Exception:  # one bad metric must not cost the others their values
        logger.exception("could not record a metric value (%r, tags %r)", value, tags)
