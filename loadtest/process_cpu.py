"""Each server process's CPU time, by role, and the wait for a machine left quiet.

    python -m loadtest.process_cpu snapshot PID --out FILE
    python -m loadtest.process_cpu settle [--previous FILE] [--timeout 120] [--quiet-pct 15]

``snapshot`` writes the CPU seconds of every process of the server started as PID (its
descendants, the processes of its session: ``setsid`` makes PID the session's leader,
and every HAProxy) to FILE as one JSON object, and prints their pids comma-separated
(for ``loadtest run --server-pids``). Two snapshots around a measurement give each
process role's CPU time over it (``role_cpu_s``).

``settle`` waits, up to ``--timeout`` seconds, until no process of the previous server
is left (those of the ``--previous`` snapshot, its session, and any Ray, Serve or
HAProxy process) and then until the machine is quiet (all cores' busy share over 3 s
under ``--quiet-pct``); it prints one JSON object: how long it waited and for what.
A ``serve run`` keeps a core and a half busy for over a minute after ``ray stop``: the
next server started then would measure the stopping one's load.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from loadtest.memory import PROC, _argv, cpu_seconds, descendants, haproxy_pids, process_name

INGRESS, POOL, HAPROXY, PROXY = "ingress replica", "pool replica", "HAProxy", "proxy"
CONTROLLER, GCS, RAYLET = "controller", "GCS", "raylet"
DASHBOARD, LOG_MONITOR, OTHER = "dashboard (+agents)", "log monitor", "other"
ROLES = (INGRESS, POOL, HAPROXY, PROXY, CONTROLLER, GCS, RAYLET, DASHBOARD, LOG_MONITOR, OTHER)

_BY_NAME = {"haproxy": HAPROXY, "ray::ProxyActor": PROXY, "ray::HAProxyManager": PROXY,
            "ray::ServeController": CONTROLLER, "gcs_server": GCS, "raylet": RAYLET,
            "dashboard head": DASHBOARD, "dashboard agent": DASHBOARD,
            "dashboard module forkserver": DASHBOARD, "runtime env agent": DASHBOARD,
            "ray::DashboardAgent": DASHBOARD, "ray::RuntimeEnvAgent": DASHBOARD,
            "log monitor": LOG_MONITOR}
# names of a server's processes that a stopped server must not leave behind
_SERVER_NAMES = {*_BY_NAME, "serve run", "autoscaler monitor"}


def role(name: str) -> str:
    """The role of a process named by ``loadtest.memory.process_name``."""
    if name.startswith("ray::ServeReplica:"):
        deployment = name.rsplit(":", 1)[-1]
        return INGRESS if deployment.startswith("Ingress") else POOL
    if name.startswith("ray-dashboard-"):
        return DASHBOARD
    return _BY_NAME.get(name, OTHER)


def is_server_process(name: str) -> bool:
    return name in _SERVER_NAMES or name.startswith(("ray::", "ray-dashboard-"))


def _stat_fields(pid: int, proc: Path) -> list[str] | None:
    try:  # "pid (comm) state ppid pgrp session ...": comm may hold spaces and parentheses
        return (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _pids(proc: Path) -> list[int]:
    return [int(e.name) for e in proc.iterdir() if e.name.isdigit()]


def session_pids(session: int, proc: Path = PROC) -> list[int]:
    """Every process whose session id is ``session``."""
    found = []
    for pid in _pids(proc):
        fields = _stat_fields(pid, proc)
        if fields and len(fields) > 3 and fields[3] == str(session):
            found.append(pid)
    return found


def start_ticks(pid: int, proc: Path = PROC) -> int | None:
    """When the process started, in clock ticks since boot: tells a pid from its reuse."""
    fields = _stat_fields(pid, proc)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def server_pids(root: int, proc: Path = PROC) -> list[int]:
    """The server started as ``root``: its descendants, its session, every HAProxy."""
    from loadtest.memory import parent_pids

    parents = parent_pids(proc)
    return descendants([root, *session_pids(root, proc), *haproxy_pids(proc)], parents)


def snapshot(root: int, proc: Path = PROC, clock: Callable[[], float] = time.time
             ) -> dict[str, Any]:
    """{"at": wall-clock seconds, "root": root, "processes": [{pid, started, name, role,
    cpu_s}]} for the server started as ``root``."""
    processes = []
    for pid in server_pids(root, proc):
        cpu, started = cpu_seconds(pid, proc), start_ticks(pid, proc)
        if cpu is None or started is None:
            continue
        name = process_name(_argv(pid, proc))
        processes.append({"pid": pid, "started": started, "name": name, "role": role(name),
                          "cpu_s": cpu})
    return {"at": clock(), "root": root, "processes": processes}


def role_cpu_s(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, float]:
    """CPU seconds each role used between two snapshots. A process started between them
    counts from zero; one gone by the second is left out (its last CPU time is unknown)."""
    start = {(p["pid"], p["started"]): p["cpu_s"] for p in before["processes"]}
    used: dict[str, float] = {}
    for p in after["processes"]:
        spent = p["cpu_s"] - start.get((p["pid"], p["started"]), 0.0)
        used[p["role"]] = used.get(p["role"], 0.0) + max(spent, 0.0)
    return used


def left_over(previous: Mapping[str, Any] | None, proc: Path = PROC) -> list[int]:
    """Processes of a stopped server still running: those of the ``previous`` snapshot
    (same pid and start), those of its session, and any Ray, Serve or HAProxy process."""
    found = set()
    if previous is not None:
        for p in previous["processes"]:
            if start_ticks(p["pid"], proc) == p["started"]:
                found.add(p["pid"])
        found.update(session_pids(int(previous["root"]), proc))
    for pid in _pids(proc):
        if pid not in found and is_server_process(process_name(_argv(pid, proc))):
            found.add(pid)
    return sorted(found)


def settle(left: Callable[[], Sequence[int]], busy_pct: Callable[[], float], *,
           timeout_s: float, quiet_pct: float, clock: Callable[[], float] = time.monotonic,
           pause: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Wait until ``left()`` is empty, then until ``busy_pct()`` (one sample, all cores,
    which takes its own time) is under ``quiet_pct``; both within ``timeout_s`` in all.
    Returns what it waited for: seconds, the processes still left, the last busy %."""
    start = clock()
    remaining = list(left())
    while remaining and clock() - start < timeout_s:
        pause(1.0)
        remaining = list(left())
    gone_s = clock() - start
    busy = busy_pct()
    while busy >= quiet_pct and clock() - start < timeout_s:
        busy = busy_pct()
    waited = clock() - start
    return {"waited_s": round(waited, 1), "gone_s": round(gone_s, 1), "left_over": remaining,
            "busy_pct": round(busy, 1), "quiet_pct": quiet_pct,
            "timed_out": bool(remaining) or busy >= quiet_pct}


def _load(path: Path | None) -> dict[str, Any] | None:
    if path is None:
        return None
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.process_cpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    snap = sub.add_parser("snapshot", help="each server process's CPU seconds, to a file")
    snap.add_argument("pid", type=int, help="the server's pid (its session's leader)")
    snap.add_argument("--out", type=Path, required=True)
    wait = sub.add_parser("settle", help="wait for the previous server to be gone and quiet")
    wait.add_argument("--previous", type=Path, help="a snapshot of the previous server")
    wait.add_argument("--timeout", type=float, default=120.0, help="seconds (%(default)s)")
    wait.add_argument("--quiet-pct", type=float, default=15.0,
                      help="busy share of all cores over 3 s counted quiet (%(default)s)")
    args = parser.parse_args(None if argv is None else list(argv))
    if args.command == "snapshot":
        document = snapshot(args.pid)
        args.out.write_text(json.dumps(document))
        print(",".join(str(p["pid"]) for p in document["processes"]) or str(args.pid))
        return 0
    previous = _load(args.previous)
    sampler = BusySampler()
    result = settle(lambda: left_over(previous), sampler, timeout_s=args.timeout,
                    quiet_pct=args.quiet_pct)
    print(json.dumps({**result, "busiest": sampler.busiest}))
    return 0


class BusySampler:
    """The machine's busy % of all cores over ``seconds``; it keeps the processes that
    used the most CPU in the last sample (``busiest``: [name, % of one core]), to tell a
    wait for the stopped server from a wait for other people's work."""

    def __init__(self, seconds: float = 3.0, keep: int = 3, proc: Path = PROC,
                 machine_pct: Callable[[float], float] | None = None):
        self.seconds, self.keep, self.proc = seconds, keep, proc
        self.machine_pct = machine_pct or _machine_pct
        self.busiest: list[tuple[str, float]] = []

    def _cpu(self) -> dict[tuple[int, int | None], float]:
        found = {}
        for pid in _pids(self.proc):
            cpu = cpu_seconds(pid, self.proc)
            if cpu is not None:
                found[(pid, start_ticks(pid, self.proc))] = cpu
        return found

    def __call__(self) -> float:
        start = self._cpu()
        busy = self.machine_pct(self.seconds)
        used = sorted(((cpu - start.get(key, 0.0), key[0]) for key, cpu in self._cpu().items()),
                      reverse=True)[:self.keep]
        self.busiest = [(process_name(_argv(pid, self.proc)), round(100 * s / self.seconds, 1))
                        for s, pid in used if s > 0]
        return busy


def _machine_pct(seconds: float) -> float:
    import psutil

    return float(psutil.cpu_percent(interval=seconds))


if __name__ == "__main__":
    sys.exit(main())
