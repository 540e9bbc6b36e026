"""glibc malloc's figures and trim (``blitz.runtime.malloc``), as the pool reports them."""

from __future__ import annotations

import sys

import pytest

from blitz.runtime import malloc

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")


def test_info_counts_a_live_allocation_and_trim_gives_freed_pages_back():
    before = malloc.info()
    assert before is not None and set(before) == {"arena", "in_use", "free", "mmapped",
                                                  "releasable"}
    # 64 x 64 KiB: under the mmap threshold, so in the arenas, as small tensors are
    blocks = [bytearray(64 << 10) for _ in range(64)]
    held = malloc.info()
    assert held is not None and held["in_use"] - before["in_use"] >= 4 << 20
    del blocks
    freed = malloc.info()
    assert freed is not None and freed["in_use"] < held["in_use"]
    assert isinstance(malloc.trim(), bool)


def test_a_fixed_mmap_threshold_maps_large_blocks_of_their_own():
    """Past the threshold a block is mapped alone (and unmapped whole at free), however
    large a block was freed before (glibc would have raised its threshold to that)."""
    assert malloc.fix_mmap_threshold()
    freed = bytearray(8 << 20)  # a large mapped block freed: the dynamic threshold's trigger
    del freed
    before = malloc.info()
    block = bytearray(1 << 20)
    held = malloc.info()
    assert before is not None and held is not None
    assert held["mmapped"] - before["mmapped"] >= 1 << 20
    del block


def test_blitz_malloc_trim_0_turns_both_off(monkeypatch):
    monkeypatch.setenv("BLITZ_MALLOC_TRIM", "0")
    assert malloc.trim() is False and malloc.fix_mmap_threshold() is False
