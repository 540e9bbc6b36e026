"""glibc malloc's figures and trim (``blitz.runtime.malloc``), as the pool reports them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from blitz.runtime import malloc

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")


def test_info_counts_a_live_allocation_and_trim_gives_freed_pages_back():
    before = malloc.info()
    assert before is not None and set(before) == {"arena", "in_use", "free", "mmapped",
                                                  "releasable"}
    # 128 x 64 KiB: under the mmap threshold, so in the arenas, as small tensors are (8 MiB
    # for a 4 MiB bound: other threads of the test process allocate and free meanwhile)
    blocks = [bytearray(64 << 10) for _ in range(128)]
    held = malloc.info()
    assert held is not None and held["in_use"] - before["in_use"] >= 4 << 20
    del blocks
    freed = malloc.info()
    assert freed is not None and freed["in_use"] < held["in_use"]
    assert isinstance(malloc.trim(), bool)


MAPPED_AFTER_A_LARGE_FREE = """
import json, sys
from blitz.runtime import malloc
fixed = sys.argv[1] == "fix" and malloc.fix_mmap_threshold()
freed = bytearray(24 << 20)  # a large mapped block freed (under glibc's 32 MiB cap)
del freed
before = malloc.info()
block = bytearray(16 << 20)
print(json.dumps({"fixed": fixed, "mapped": malloc.info()["mmapped"] - before["mmapped"]}))
"""


def mapped_after_a_large_free(mode: str) -> dict:
    """In a fresh interpreter (a heap with no 16 MiB free in it, whatever ran here
    before), the bytes newly mapped for a 16 MiB block allocated after a 24 MiB one was
    freed."""
    out = subprocess.run([sys.executable, "-c", MAPPED_AFTER_A_LARGE_FREE, mode],
                         capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


def test_a_fixed_mmap_threshold_maps_large_blocks_of_their_own():
    """Past the fixed threshold a block is mapped alone (and unmapped whole at free),
    however large a block was freed before; glibc's own threshold rises to the freed
    block's size and puts the next one in the heap, where a trim cannot free its pages."""
    fixed = mapped_after_a_large_free("fix")
    assert fixed["fixed"] and fixed["mapped"] >= 16 << 20
    default = mapped_after_a_large_free("default")
    assert not default["fixed"] and default["mapped"] < 16 << 20


def test_blitz_malloc_trim_0_turns_both_off(monkeypatch):
    monkeypatch.setenv("BLITZ_MALLOC_TRIM", "0")
    assert malloc.trim() is False and malloc.fix_mmap_threshold() is False
