"""The GPU replica's memory metric (``blitz.runtime.gpu_memory``), on a fake ``torch.cuda``."""

from __future__ import annotations

import asyncio

import pytest

from blitz.runtime import gpu_memory


class FakeCuda:
    def __init__(self, devices: int = 2, available: bool = True):
        self.devices, self.available = devices, available
        self.allocated = [1000 * (i + 1) for i in range(devices)]
        self.reserved = [4096 * (i + 1) for i in range(devices)]

    def is_available(self) -> bool:
        return self.available

    def device_count(self) -> int:
        return self.devices

    def memory_allocated(self, index: int) -> int:
        return self.allocated[index]

    def memory_reserved(self, index: int) -> int:
        return self.reserved[index]


def test_reads_allocated_and_reserved_per_device():
    assert gpu_memory.read(FakeCuda()) == {("0", "allocated"): 1000, ("0", "reserved"): 4096,
                                           ("1", "allocated"): 2000, ("1", "reserved"): 8192}


def test_reads_nothing_without_cuda():
    assert gpu_memory.read(FakeCuda(available=False)) == {}
    assert gpu_memory.read() == {}  # this machine's torch has no CUDA


async def test_reports_every_tick_follows_a_leak_and_survives_a_failed_reading(caplog):
    cuda = FakeCuda(devices=1)
    seen: list[tuple[str, str, int]] = []
    readings = 0

    def reader():
        nonlocal readings
        readings += 1
        if readings == 2:
            raise RuntimeError("driver hiccup")
        cuda.allocated[0] += 500  # a leak: allocated grows with every reading
        return gpu_memory.read(cuda)

    task = asyncio.create_task(gpu_memory.report_forever(
        lambda *reading: seen.append(reading), reader, every_s=0.001))
    while readings < 4:
        await asyncio.sleep(0.001)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    allocated = [v for _, kind, v in seen if kind == "allocated"]
    assert allocated[:2] == [1500, 2000] and allocated == sorted(allocated)
    assert "cannot read CUDA memory" in caplog.text
