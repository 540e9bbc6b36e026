"""glibc malloc's own figures and its trim, through ctypes (Linux with glibc; elsewhere
``info()`` is None and ``trim()`` does nothing).

``info()`` is ``mallinfo2()`` summed over every arena: ``arena`` (bytes malloc took from
the system with brk/mmap for its heaps), ``in_use`` (``uordblks``: held by live
allocations), ``free`` (``fordblks``: free but still mapped, what fragmentation keeps),
``mmapped`` (``hblkhd``: large blocks mapped one by one, returned at free) and
``releasable`` (``keepcost``: free at the top of the main heap). ``trim()`` is
``malloc_trim(0)``: it gives the free pages of every arena back to the system (glibc 2.8+
releases whole free pages inside a heap too, not only its top).

``fix_mmap_threshold()`` pins ``M_MMAP_THRESHOLD`` at 128 KiB, glibc's starting value: by
default glibc raises it to the size of each mapped block freed (up to 32 MiB), after which
a model's weight and initializer blocks land in the heaps, among small blocks that outlive
them, and the heaps fragment at page level where no trim can reach (a replica evicting
ONNX models twice a second climbed ~30% in 100 s with the trims alone).

``BLITZ_MALLOC_TRIM=0`` in a replica's environment turns both off, to measure without them
(``python -m loadtest.eviction_soak``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from typing import Any

_lock = threading.Lock()
_libc: Any = None
_loaded = False


M_MMAP_THRESHOLD = -3  # mallopt's parameter (malloc.h)
MMAP_THRESHOLD = 128 << 10


def _off() -> bool:
    return os.environ.get("BLITZ_MALLOC_TRIM") == "0"


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]


def _glibc() -> Any:
    global _libc, _loaded
    with _lock:
        if not _loaded:
            _loaded = True
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                libc.mallinfo2.restype = _Mallinfo2
                libc.malloc_trim.argtypes = [ctypes.c_size_t]
                libc.malloc_trim.restype = ctypes.c_int
                libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
                libc.mallopt.restype = ctypes.c_int
                _libc = libc
            except (OSError, AttributeError):  # not glibc, or glibc before 2.33
                _libc = None
        return _libc


def info() -> dict[str, int] | None:
    """This process's malloc figures in bytes (see the module's doc); None without glibc."""
    libc = _glibc()
    if libc is None:
        return None
    m = libc.mallinfo2()
    return {"arena": m.arena, "in_use": m.uordblks, "free": m.fordblks,
            "mmapped": m.hblkhd, "releasable": m.keepcost}


def trim() -> bool:
    """``malloc_trim(0)``: free pages back to the system; True when some were released."""
    if _off():
        return False
    libc = _glibc()
    return bool(libc is not None and libc.malloc_trim(0))


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD) -> bool:
    """Blocks of ``threshold`` bytes and more get mappings of their own, returned whole at
    free, from now on in this process (glibc's dynamic threshold off); True when set."""
    if _off():
        return False
    libc = _glibc()
    return bool(libc is not None and libc.mallopt(M_MMAP_THRESHOLD, threshold))
