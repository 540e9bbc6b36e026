"""Idle memory of a server's process tree: PSS per process and in all (Linux).

    python -m loadtest.memory PID [PID ...] [--json]

sums ``Pss`` from ``/proc/<pid>/smaps_rollup`` over each PID and all its descendants
(``bash scripts/serve.sh``'s pid covers Ray, its workers and HAProxy: lifecycle.py
adopts them as a subreaper; `serve run` too on its old path).
PSS divides each shared page among the processes that map it, so the per-process
figures add up to what the tree costs the machine, unlike RSS. Processes are grouped
by a short name (the Ray process title, the script, or the executable); reading
another user's processes needs root.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")

# python scripts Ray starts, by file name: what they are
RAY_SCRIPTS = {"dashboard.py": "dashboard head", "log_monitor.py": "log monitor",
               "monitor.py": "autoscaler monitor", "agent.py": "dashboard agent",
               "main.py": "runtime env agent"}


@dataclass(frozen=True)
class ProcessMemory:
    pid: int
    name: str
    pss_kib: int
    cpu_s: float | None = None  # user + system CPU seconds so far (``cpu_seconds``)


def pss_kib(pid: int, proc: Path = PROC) -> int | None:
    """The process's proportional set size in KiB; None when it is gone or unreadable."""
    try:
        text = (proc / str(pid) / "smaps_rollup").read_text()
    except OSError:
        return None
    match = re.search(r"^Pss:\s+(\d+) kB", text, re.MULTILINE)
    return int(match.group(1)) if match else None


def parent_pids(proc: Path = PROC) -> dict[int, int]:
    """pid -> parent pid for every process in ``proc``."""
    parents = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


def descendants(roots: Iterable[int], parents: dict[int, int]) -> list[int]:
    """``roots`` (those alive) and every process below them, sorted."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [r for r in roots if r in parents]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return sorted(found)


def process_name(argv: Sequence[str]) -> str:
    """A short name for a process from its command line (``/proc/PID/cmdline``)."""
    if not argv:
        return "?"
    first = argv[0]
    if first.startswith("ray::") or first.startswith("ray-dashboard-"):
        # a Ray process title: "ray::ServeController", "ray::Actor.method" while it runs one
        return first.split()[0].split(".")[0]
    exe = os.path.basename(first)
    if not exe.startswith("python"):
        return exe  # gcs_server, raylet, haproxy, bash
    rest = argv[1:]
    if rest[:1] == ["-B"] and "forkserver" in " ".join(rest):
        return "dashboard module forkserver"
    if len(rest) >= 2 and os.path.basename(rest[0]) in {"serve", "serve_run.py"} \
            and rest[1] == "run":  # `serve run`, or scripts/serve_run.py's stand-in
        return "serve run"
    for arg in rest:
        if arg.endswith(".py") or os.path.basename(arg) in {"serve", "ray", "blitz"}:
            script = os.path.basename(arg)
            return RAY_SCRIPTS.get(script, script)
        if arg == "-c":
            return "python -c"
    return exe


def _argv(pid: int, proc: Path) -> list[str]:
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def cpu_seconds(pid: int, proc: Path = PROC) -> float | None:
    """The process's user + system CPU seconds (``/proc/PID/stat``); None when gone."""
    try:
        fields = (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def tree_memory(roots: Iterable[int], proc: Path = PROC) -> list[ProcessMemory]:
    """PSS (and CPU time) of every live process in the trees under ``roots``, largest
    PSS first."""
    found = []
    for pid in descendants(roots, parent_pids(proc)):
        kib = pss_kib(pid, proc)
        if kib is not None:
            found.append(ProcessMemory(pid, process_name(_argv(pid, proc)), kib,
                                       cpu_seconds(pid, proc)))
    return sorted(found, key=lambda p: (-p.pss_kib, p.pid))


def haproxy_pids(proc: Path = PROC) -> list[int]:
    """Every process whose executable is named haproxy."""
    found = []
    for entry in proc.iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "haproxy":
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def roots(pids: Iterable[int], with_haproxy: bool, proc: Path = PROC) -> list[int]:
    return [*pids, *(haproxy_pids(proc) if with_haproxy else [])]


def peak_memory(pids: Sequence[int], every_s: float, with_haproxy: bool,
                proc: Path = PROC) -> list[ProcessMemory]:
    """Sample the trees every ``every_s`` until SIGTERM or SIGINT; the largest sample."""
    import signal
    import threading

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    best: list[ProcessMemory] = []
    while True:
        sample = tree_memory(roots(pids, with_haproxy, proc), proc)
        if sum(p.pss_kib for p in sample) > sum(p.pss_kib for p in best):
            best = sample
        if stop.wait(every_s):
            return best


def by_name(processes: Iterable[ProcessMemory]) -> list[tuple[str, int, int]]:
    """(name, process count, PSS KiB) per name, largest first."""
    totals: dict[str, list[int]] = {}
    for p in processes:
        entry = totals.setdefault(p.name, [0, 0])
        entry[0] += 1
        entry[1] += p.pss_kib
    return sorted(((n, c, k) for n, (c, k) in totals.items()), key=lambda t: (-t[2], t[0]))


def format_table(processes: Sequence[ProcessMemory]) -> str:
    lines = ["| process | count | PSS MiB |", "|---|---|---|"]
    for name, count, kib in by_name(processes):
        lines.append(f"| {name} | {count} | {kib / 1024:.0f} |")
    total = sum(p.pss_kib for p in processes)
    lines.append(f"| **total** | {len(processes)} | **{total / 1024:.0f}** |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.memory", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pids", type=int, nargs="+", help="roots of the process trees")
    parser.add_argument("--json", action="store_true", help="one JSON object per process")
    parser.add_argument("--with-haproxy", action="store_true",
                        help="also every process named haproxy, wherever it hangs (it may "
                             "be re-parented out of the tree)")
    parser.add_argument("--peak", type=float, metavar="SECONDS", default=0.0,
                        help="sample every SECONDS until SIGTERM/SIGINT, then report the "
                             "sample whose total PSS was largest")
    args = parser.parse_args(argv)
    processes = (peak_memory(args.pids, args.peak, args.with_haproxy) if args.peak > 0
                 else tree_memory(roots(args.pids, args.with_haproxy)))
    if not processes:
        print(f"no readable process under {args.pids}", file=sys.stderr)
        return 1
    if args.json:
        for p in processes:
            print(json.dumps({"pid": p.pid, "name": p.name, "pss_kib": p.pss_kib,
                              "cpu_s": p.cpu_s}))
    else:
        print(format_table(processes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
