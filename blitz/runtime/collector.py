"""Python's cyclic garbage collector, tuned for a serving process.

A replica holds a large, long-lived heap once it has started (Ray, Serve, the models,
their tokenizers: ~160,000 tracked objects in an ingress before any model) and then
allocates short-lived objects per request, nearly all freed by reference counting. With
CPython's defaults (a collection of the youngest generation every 700 net allocations,
the whole heap scanned every hundred of those) the collector costs ~40 µs a one-text
request in process, most of it full scans of the start-up heap that find nothing
(BENCHMARKS.md, "Against the pinned baseline").

``settle()``, once a replica has started and after each model load: collect once, then
``gc.freeze()`` what is left (never scanned again) and collect the youngest generation
every ``GEN0_THRESHOLD`` net allocations instead of 700: ~3 µs a request. What a frozen
object's cycle holds is collected only once it is unfrozen, so ``collect_all()`` (a model
freed) unfreezes, collects the whole heap and freezes again: an evicted model's cycles
are freed as before. ``BLITZ_GC_TUNING=0`` in a replica's environment leaves Python's
defaults (to measure without it).
"""

from __future__ import annotations

import gc
import os

GEN0_THRESHOLD = 7000  # net container allocations between collections of the youngest
# generation (CPython: 700); the older two keep CPython's ratios (10, 10)


def _off() -> bool:
    return os.environ.get("BLITZ_GC_TUNING") == "0"


def settle() -> None:
    """Collect, freeze what survives, and collect the young less often (see the module)."""
    if _off():
        return
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, older, oldest)


def collect_all() -> None:
    """Collect the whole heap, frozen objects included (a model was just freed), then
    freeze again what survives; a plain ``gc.collect()`` with the tuning off."""
    if _off() or gc.get_freeze_count() == 0:
        gc.collect()
        return
    gc.unfreeze()
    gc.collect()
    gc.freeze()
