"""CUDA memory held by this process, per device: what a GPU pool replica reports.

Seed users watch a GPU replica's memory for leaks, so each GPU pool replica exports the
bytes torch's caching allocator has handed out (``allocated``) and holds from the driver
(``reserved``), per device, as the ``blitz_gpu_memory_bytes`` gauge, every
``REPORT_EVERY_S`` seconds. ``read`` takes the ``torch.cuda`` module as an argument, so
tests give it a fake and run on any machine.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("blitz.gpu_memory")
REPORT_EVERY_S = 5.0


def read(cuda: Any = None) -> dict[tuple[str, str], int]:
    """{(device index, kind): bytes} for every CUDA device this process sees; empty
    without CUDA (or without torch)."""
    if cuda is None:
        try:
            import torch
        except ImportError:
            return {}
        cuda = torch.cuda
    if not cuda.is_available():
        return {}
    out: dict[tuple[str, str], int] = {}
    for index in range(cuda.device_count()):
        out[(str(index), "allocated")] = int(cuda.memory_allocated(index))
        out[(str(index), "reserved")] = int(cuda.memory_reserved(index))
    return out


async def report_forever(publish: Callable[[str, str, int], None],
                         reader: Callable[[], dict[tuple[str, str], int]] = read,
                         every_s: float = REPORT_EVERY_S) -> None:
    """Call ``publish(device, kind, bytes)`` for each reading, every ``every_s`` seconds,
    until cancelled. A failed reading is logged once and retried at the next tick: the
    metric must never take a replica down."""
    failing = False
    while True:
        try:
            for (device, kind), value in reader().items():
                publish(device, kind, value)
            failing = False
        except Exception:
            if not failing:
                logger.warning("cannot read CUDA memory; retrying every %g s", every_s,
                               exc_info=True)
            failing = True
        await asyncio.sleep(every_s)
