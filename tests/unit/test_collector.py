"""blitz.runtime.collector: the start-up heap frozen, the young collected less often, and a
freed model's cycles still collected although they were frozen."""

from __future__ import annotations

import gc
import weakref

import pytest

from blitz.runtime import collector


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture
def restored():
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


def cycle() -> Node:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return a


def test_settle_freezes_what_survives_and_collects_the_young_less_often(restored):
    alive = Node()  # lives on: frozen, never scanned again
    collector.settle()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold()[0] == collector.GEN0_THRESHOLD
    assert gc.is_tracked(alive)


def test_a_frozen_cycle_is_collected_by_collect_all_not_by_a_plain_collect(restored):
    held = [cycle()]
    ref = weakref.ref(held[0])
    collector.settle()  # the cycle is alive here (a model's objects at start-up): frozen
    held.clear()
    gc.collect()  # now garbage, but frozen: a plain collection never looks at it
    assert ref() is not None
    collector.collect_all()  # what the holder calls once a model is freed
    assert ref() is None
    assert gc.get_freeze_count() > 0  # frozen again


def test_off_leaves_pythons_defaults(restored, monkeypatch):
    monkeypatch.setenv("BLITZ_GC_TUNING", "0")
    before = gc.get_threshold()
    collector.settle()
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before
    ref = weakref.ref(cycle())
    collector.collect_all()
    assert ref() is None
