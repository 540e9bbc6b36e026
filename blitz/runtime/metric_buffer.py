"""Metric values gathered in the process and recorded by a background thread once a second.

Recording one value on a Ray metric hands it to Ray's core, which releases Python's GIL
and takes it back: under load, with model threads holding the GIL, each record kept the
ingress's event loop waiting. The ingress recorded about ten values per request, and
those records took a fifth of its loop's time (py-spy, docs/benchmarks-history.md "Round
nine").
Here the caller only adds the value to a dict under a lock; a daemon thread hands what
was gathered to Ray once per ``interval_s``:

- **Counters** are summed and **gauges** keep their last value, per metric and label
  set, so a second of traffic is one record each. **Histograms** keep every value (a
  bucket count needs each) and are recorded one by one, on the thread, not the loop.
- **Bounded**: at most ``max_values`` histogram values wait per label set; past that,
  new ones are dropped and counted in ``dropped`` (a flusher stuck in Ray must not
  grow memory without end).
- **Lost at most**: the values of the last interval, if the process dies first.
- **Idle, asleep**: the thread waits for the first value after a flush, then gathers for
  ``interval_s`` and flushes; a process that records nothing wakes it never (a replica
  at idle: no wake a second).
- **Failures**: a metric that refuses a value is logged and skipped; the rest still go.
- **Pickled** (Ray ships a deployment with what it references), a buffer arrives empty,
  with no thread: it starts one on its first value.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Hashable, Mapping
from typing import Any, Protocol

logger = logging.getLogger("blitz.metrics")

FLUSH_INTERVAL_S = 1.0
MAX_VALUES = 100_000  # histogram values waiting per metric and label set


class CounterLike(Protocol):  # ray.serve.metrics.Counter, as Ray 2.60 annotates it
    def inc(self, value: float, tags: dict[str, str]) -> object: ...


class GaugeLike(Protocol):  # ray.serve.metrics.Gauge
    def set(self, value: float, tags: dict[str, str]) -> object: ...


class HistogramLike(Protocol):  # ray.serve.metrics.Histogram
    def observe(self, value: float, tags: dict[str, str]) -> object: ...


class MetricBuffer:
    def __init__(self, interval_s: float = FLUSH_INTERVAL_S, max_values: int = MAX_VALUES):
        if interval_s <= 0 or max_values < 1:
            raise ValueError("interval_s must be positive and max_values at least 1")
        self.interval_s = interval_s
        self.max_values = max_values
        self.dropped = 0  # histogram values refused because max_values were waiting
        self._lock = threading.Lock()
        self._sums: dict[Hashable, list[Any]] = {}  # key -> [counter, tags, sum]
        self._lasts: dict[Hashable, list[Any]] = {}  # key -> [gauge, tags, last value]
        self._values: dict[Hashable, list[Any]] = {}  # key -> [histogram, tags, [values]]
        self._flusher: threading.Thread | None = None
        self._gathering = threading.Event()  # set by the first value after a flush

    def __getstate__(self) -> dict[str, float]:
        return {"interval_s": self.interval_s, "max_values": self.max_values}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["interval_s"], state["max_values"])  # type: ignore[misc]

    @property
    def pending(self) -> int:
        """Label sets with a value not yet recorded."""
        with self._lock:
            return len(self._sums) + len(self._lasts) + len(self._values)

    def inc(self, counter: CounterLike, value: float, tags: Mapping[str, str]) -> None:
        """Add ``value`` (> 0) to ``counter`` under ``tags``, at the next flush."""
        with self._lock:
            entry = self._entry(self._sums, counter, tags, value)
            if entry is not None:
                entry[2] += value

    def set(self, gauge: GaugeLike, value: float, tags: Mapping[str, str]) -> None:
        """Set ``gauge`` under ``tags`` to ``value`` at the next flush (the last value set
        by then wins)."""
        with self._lock:
            entry = self._entry(self._lasts, gauge, tags, value)
            if entry is not None:
                entry[2] = value

    def observe(self, histogram: HistogramLike, value: float, tags: Mapping[str, str]) -> None:
        """Observe ``value`` on ``histogram`` under ``tags`` at the next flush."""
        with self._lock:
            entry = self._entry(self._values, histogram, tags, [value])
            if entry is None:
                return
            if len(entry[2]) < self.max_values:
                entry[2].append(value)
            else:
                self.dropped += 1

    def _entry(self, waiting: dict[Hashable, list[Any]], metric: object,
               tags: Mapping[str, str], first: Any) -> list[Any] | None:
        """``metric``'s waiting entry under ``tags`` ([metric, tags, gathered]), or None
        when it had none and one was made holding ``first`` (lock held)."""
        if self._flusher is None:
            self._start_flusher()
        key = (id(metric), *tags.items())
        entry = waiting.get(key)
        if entry is None:
            waiting[key] = [metric, dict(tags), first]
            self._gathering.set()
        return entry

    def _start_flusher(self) -> None:
        """Start the flushing thread if this buffer has none yet (lock held)."""
        if self._flusher is None:
            self._flusher = threading.Thread(target=self._flush_forever, daemon=True,
                                             name="blitz-metrics")
            self._flusher.start()

    def _flush_forever(self) -> None:
        while True:
            self._gathering.wait()  # nothing gathered: no wake
            time.sleep(self.interval_s)
            self.flush()

    @property
    def gathering(self) -> bool:
        """A value waits for the next flush (the flusher is awake for it)."""
        return self._gathering.is_set()

    def flush(self) -> None:
        """Record everything gathered so far, now, on the calling thread."""
        with self._lock:
            sums, lasts, values = self._sums, self._lasts, self._values
            self._sums, self._lasts, self._values = {}, {}, {}
            self._gathering.clear()
        for counter, tags, total in sums.values():
            _record(counter.inc, total, tags)
        for gauge, tags, last in lasts.values():
            _record(gauge.set, last, tags)
        for histogram, tags, observed in values.values():
            for value in observed:
                _record(histogram.observe, value, tags)


def _record(method: Any, value: float, tags: dict[str, str]) -> None:
    try:
        method(value, tags=tags)
    except Exception:  # one bad metric must not cost the others their values
        logger.exception("could not record a metric value (%r, tags %r)", value, tags)
