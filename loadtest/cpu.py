"""CPU accounting (psutil): the server's processes and the whole machine.

On a small or shared machine, requests/s moves with whatever else runs; CPU-ms per
request of the server's own processes does not, so reports carry both.
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class CpuSample:
    server_s: float | None  # CPU seconds of the watched processes and their descendants
    busy_s: float | None  # CPU seconds the machine spent busy (all processes)
    total_s: float | None  # CPU seconds the machine had (all cores)


def process_tree_cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of the live processes ``pids`` and their descendants."""
    tree: dict[int, psutil.Process] = {}
    for pid in pids:
        try:
            root = psutil.Process(pid)
            tree.update((p.pid, p) for p in [root, *root.children(recursive=True)])
        except psutil.Error:  # gone, or not ours to read
            continue
    total = 0.0
    for process in tree.values():
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def machine_cpu_s() -> tuple[float, float]:
    """(busy, total) CPU seconds since boot, all cores.

    Idle includes I/O wait; guest time is already part of user time on Linux.
    """
    times = psutil.cpu_times()
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    idle = times.idle + getattr(times, "iowait", 0.0)
    return total - idle, total


class CpuProbe:
    def __init__(self, server_pids: list[int] | None = None):
        self.server_pids = server_pids or []

    def sample(self) -> CpuSample:
        busy, total = machine_cpu_s()
        server = process_tree_cpu_s(self.server_pids) if self.server_pids else None
        return CpuSample(server, busy, total)


def delta(before: CpuSample, after: CpuSample) -> CpuSample:
    def sub(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else b - a

    return CpuSample(sub(before.server_s, after.server_s), sub(before.busy_s, after.busy_s),
                     sub(before.total_s, after.total_s))
