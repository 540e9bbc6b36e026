"""CPU accounting from /proc (Linux): the server's processes and the whole machine.

On a small or shared machine, requests/s moves with whatever else runs; CPU-ms per
request of the server's own processes does not, so reports carry both. Elsewhere (no
/proc) every reading is ``None``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class CpuSample:
    server_s: float | None  # CPU seconds of the watched processes and their descendants
    busy_s: float | None  # CPU seconds the machine spent busy (all processes)
    total_s: float | None  # CPU seconds the machine had (all cores)


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()  # fields after "pid (comm) "


def _children(pids: set[int]) -> set[int]:
    """``pids`` and every process descended from them."""
    parents: dict[int, int] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (fields := _stat_fields(int(entry.name))):
            parents[int(entry.name)] = int(fields[1])
    found = set(pids) & set(parents)
    grew = True
    while grew:
        new = {pid for pid, ppid in parents.items() if ppid in found} - found
        found |= new
        grew = bool(new)
    return found


def process_tree_cpu_s(pids: list[int]) -> float:
    total = 0
    for pid in _children(set(pids)):
        fields = _stat_fields(pid)
        if fields:
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / _TICK


def machine_cpu_s() -> tuple[float, float] | None:
    """(busy, total) CPU seconds since boot, all cores; None without /proc/stat."""
    try:
        first = (PROC / "stat").read_text().splitlines()[0].split()
    except OSError:
        return None
    values = [int(v) for v in first[1:9]]  # user nice system idle iowait irq softirq steal
    idle = values[3] + values[4]
    return (sum(values) - idle) / _TICK, sum(values) / _TICK


class CpuProbe:
    def __init__(self, server_pids: list[int] | None = None):
        self.server_pids = server_pids or []
        self.available = PROC.joinpath("stat").exists()

    def sample(self) -> CpuSample:
        if not self.available:
            return CpuSample(None, None, None)
        machine = machine_cpu_s()
        server = process_tree_cpu_s(self.server_pids) if self.server_pids else None
        return CpuSample(server, *(machine or (None, None)))


def delta(before: CpuSample, after: CpuSample) -> CpuSample:
    def sub(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else b - a

    return CpuSample(sub(before.server_s, after.server_s), sub(before.busy_s, after.busy_s),
                     sub(before.total_s, after.total_s))
