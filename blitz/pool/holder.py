"""The object a pool's multiplexed loader returns: it owns one encoder and frees it on eviction.

Ray evicts a model by calling its ``__del__`` on Ray's own executor, which can happen
while a pool thread still runs a batch on it; Python calls ``__del__`` again when the
object is collected. So work holds a lease (``with holder.lease() as encoder:``) and
``__del__`` only marks the holder evicted: the encoder is freed at once when no lease is
out, otherwise by the last lease to end. Freeing happens exactly once, and ends with
``malloc_trim`` (``blitz.runtime.malloc``): glibc keeps the freed weights' pages in its
arenas otherwise, and under steady eviction a CPU replica's RSS grew with them
(docs/reliability.md, "Memory under eviction").
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from blitz.encoders.base import Encoder
from blitz.runtime import collector, malloc


class ModelFreed(RuntimeError):
    """The holder's encoder is gone (evicted and freed): load the model again."""


class ModelHolder:
    def __init__(self, encoder: Encoder, on_release: Callable[[str], None] | None = None):
        self.model_id = encoder.model_id
        self._encoder: Encoder | None = encoder
        self._on_release = on_release
        self._lock = threading.Lock()
        self._leases = 0
        self._evicted = False

    @property
    def evicted(self) -> bool:
        return self._evicted

    def acquire(self) -> Encoder:
        """The encoder, kept alive until ``release`` even if the model is evicted meanwhile."""
        with self._lock:
            if self._encoder is None:
                raise ModelFreed(f"model {self.model_id!r} was evicted and freed")
            self._leases += 1
            return self._encoder

    def release(self) -> None:
        with self._lock:
            self._leases -= 1
            free = self._evicted and self._leases == 0
        if free:
            self._free()

    @contextlib.contextmanager
    def lease(self) -> Iterator[Encoder]:
        encoder = self.acquire()
        try:
            yield encoder
        finally:
            self.release()

    def call(self, fn: Callable[[Encoder], Any]) -> Any:
        """``fn(encoder)`` under a lease."""
        with self.lease() as encoder:
            return fn(encoder)

    def __del__(self) -> None:
        with self._lock:
            self._evicted = True
            free = self._leases == 0
        if free:
            self._free()

    def _free(self) -> None:
        with self._lock:
            encoder, self._encoder = self._encoder, None
        if encoder is None:  # already freed
            return
        on_cuda = encoder.device.startswith("cuda")
        encoder.close()
        del encoder
        collector.collect_all()  # its cycles too, though they were frozen at start-up
        malloc.trim()  # the freed pages back to the system, from every arena
        if on_cuda:
            import torch

            torch.cuda.empty_cache()
        if self._on_release is not None:
            self._on_release(self.model_id)
