"""Eviction never frees a model while a batch still runs on it (the holder's leases)."""

from __future__ import annotations

import gc
import threading

import pytest

from blitz.encoders.fake import FakeEncoder
from blitz.pool.holder import ModelFreed, ModelHolder


class _TrackedEncoder(FakeEncoder):
    def __init__(self):
        super().__init__("m", 8)
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


def test_eviction_without_leases_frees_at_once_and_only_once():
    released: list[str] = []
    encoder = _TrackedEncoder()
    holder = ModelHolder(encoder, released.append)
    holder.__del__()
    holder.__del__()  # Ray calls it on eviction, Python again on collection
    assert released == ["m"] and encoder.closed == 1 and holder.evicted
    with pytest.raises(ModelFreed, match="evicted"):
        holder.acquire()
    del holder
    gc.collect()
    assert released == ["m"] and encoder.closed == 1


def test_eviction_during_a_batch_waits_for_the_batch():
    released: list[str] = []
    encoder = _TrackedEncoder()
    holder = ModelHolder(encoder, released.append)
    in_batch, evicted = threading.Event(), threading.Event()
    outcome: dict = {}

    def batch():  # the pool's worker thread
        with holder.lease() as leased:
            in_batch.set()
            evicted.wait(5)
            outcome["rows"] = leased.embed(["still usable"], normalize=True).values.shape
            outcome["closed_mid_batch"] = encoder.closed

    worker = threading.Thread(target=batch)
    worker.start()
    in_batch.wait(5)
    holder.__del__()  # Ray's executor thread evicts while the batch runs
    assert encoder.closed == 0 and released == []
    evicted.set()
    worker.join(5)
    assert outcome == {"rows": (1, 8), "closed_mid_batch": 0}
    assert encoder.closed == 1 and released == ["m"]  # freed by the batch's end


def test_overlapping_leases_free_after_the_last():
    encoder = _TrackedEncoder()
    holder = ModelHolder(encoder)
    first, second = holder.acquire(), holder.acquire()
    assert first is second is encoder
    holder.__del__()
    holder.release()
    assert encoder.closed == 0
    holder.release()
    assert encoder.closed == 1


def test_freeing_gives_the_pages_back_once(monkeypatch):
    """A freed model's pages go back to the system (``malloc_trim``), once per free: glibc
    would keep them in its arenas, and a replica under eviction would grow."""
    from blitz.runtime import malloc

    trims: list[bool] = []
    monkeypatch.setattr(malloc, "trim", lambda: trims.append(True) or True)
    holder = ModelHolder(_TrackedEncoder())
    with holder.lease():
        holder.__del__()
        assert trims == []  # a batch still runs on it
    holder.__del__()
    assert trims == [True]
