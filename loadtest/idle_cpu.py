"""Idle CPU of a server's process tree, by process: % of one core over a window (Linux).

    python -m loadtest.idle_cpu [--warm 20] [--window 60] [--rounds 1] [--out FILE.json]
    python -m loadtest.idle_cpu --attach PID [--window 60]
    python -m loadtest.idle_cpu --tree /tmp/before    # another checkout's serve.sh
    python -m loadtest.idle_cpu --env RAY_SERVE_CONTROL_LOOP_INTERVAL_S=0.5   # a Ray setting

starts ``bash scripts/serve.sh`` (the environment passes through: set Ray's variables
here to measure what they lower), waits for ``/ready``, embeds one text, waits
``--warm`` seconds, then reads every process's CPU seconds (user + system,
``/proc/PID/stat``) in serve.sh's tree and every HAProxy, ``--window`` seconds apart, and
stops the server (SIGTERM to serve.sh: its drain and Ray's stop). ``--attach`` measures a
tree already running under PID instead. Processes are named as ``loadtest.memory`` names
them (``ray::ServeReplica:blitz:Ingress``, ``ray::ServeController``, ``gcs_server``...). On
a shared machine hold the lock: ``flock /tmp/blitz-ray.lock python -m loadtest.idle_cpu``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from loadtest.memory import PROC, _argv, cpu_seconds, descendants, parent_pids, process_name, roots

Snapshot = dict[int, tuple[str, float]]  # pid -> (name, CPU seconds so far)


@dataclass(frozen=True)
class IdleCpu:
    name: str
    count: int  # processes of this name alive at both readings
    cpu_ms: float  # CPU milliseconds they spent in the window
    percent: float  # of one core


def snapshot(root_pids: Sequence[int], proc: Path = PROC) -> Snapshot:
    """Name and CPU seconds of every live process in the trees (and every HAProxy)."""
    found: Snapshot = {}
    for pid in descendants(roots(root_pids, True, proc), parent_pids(proc)):
        seconds = cpu_seconds(pid, proc)
        if seconds is not None:
            found[pid] = (process_name(_argv(pid, proc)), seconds)
    return found


def idle_by_name(before: Mapping[int, tuple[str, float]],
                 after: Mapping[int, tuple[str, float]], window_s: float) -> list[IdleCpu]:
    """CPU spent between two snapshots ``window_s`` apart, per process name, most first.
    Only processes in both count (one that started or ended inside the window would be
    charged its whole life or nothing); a process's name is its name at the end."""
    if window_s <= 0:
        raise ValueError("window_s must be positive")
    totals: dict[str, list[float]] = {}
    for pid, (name, end_s) in after.items():
        if pid in before:
            entry = totals.setdefault(name, [0, 0.0])
            entry[0] += 1
            entry[1] += max(0.0, end_s - before[pid][1])
    rows = [IdleCpu(name, int(count), spent * 1000, 100 * spent / window_s)
            for name, (count, spent) in totals.items()]
    return sorted(rows, key=lambda r: (-r.cpu_ms, r.name))


def format_table(rows: Sequence[IdleCpu], window_s: float) -> str:
    lines = [f"| process | count | CPU-ms in {window_s:g} s | % of a core |", "|---|---|---|---|"]
    lines += [f"| {r.name} | {r.count} | {r.cpu_ms:.0f} | {r.percent:.2f} |" for r in rows]
    lines.append(f"| **total** | {sum(r.count for r in rows)} | "
                 f"{sum(r.cpu_ms for r in rows):.0f} | **{sum(r.percent for r in rows):.2f}** |")
    return "\n".join(lines)


def measure(root_pids: Sequence[int], window_s: float) -> list[IdleCpu]:
    before = snapshot(root_pids)
    start = time.monotonic()
    time.sleep(window_s)
    after = snapshot(root_pids)
    return idle_by_name(before, after, time.monotonic() - start)


def _wait_ready(url: str, server: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"serve.sh exited ({server.returncode}) before /ready")
        try:
            with urllib.request.urlopen(f"{url}/ready", timeout=5) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise SystemExit(f"no /ready within {timeout_s:g} s")


def _embed_once(url: str) -> None:
    request = urllib.request.Request(
        f"{url}/embed", data=b'{"texts": ["an idle server"], "model": "minilm"}',
        headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as reply:
        reply.read()


def serve_and_measure(args: argparse.Namespace) -> list[list[IdleCpu]]:
    env = {**os.environ, "BLITZ_SKIP_INSTALL": os.environ.get("BLITZ_SKIP_INSTALL", "1"),
           "BLITZ_DRAIN_S": "0", **dict(v.split("=", 1) for v in args.env)}
    server = subprocess.Popen(["bash", "scripts/serve.sh"], env=env, start_new_session=True,
                              cwd=args.tree,
                              stdout=subprocess.DEVNULL if not args.log else open(args.log, "w"),
                              stderr=subprocess.STDOUT)
    try:
        started = time.monotonic()
        _wait_ready(args.url, server, args.ready_timeout)
        print(f"ready {time.monotonic() - started:.1f} s after serve.sh started", flush=True)
        _embed_once(args.url)
        time.sleep(args.warm)
        return [measure([server.pid], args.window) for _ in range(args.rounds)]
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=180)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.idle_cpu", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attach", type=int, metavar="PID",
                        help="measure the tree under PID (running) instead of starting one")
    parser.add_argument("--tree", default=".",
                        help="the checkout whose scripts/serve.sh to start (another commit's "
                             "tree, for a before/after)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="set in serve.sh's environment (again for more): a Ray setting "
                             "measured against the same tree without it")
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--warm", type=float, default=20.0,
                        help="seconds idle after /ready and one embed before measuring")
    parser.add_argument("--window", type=float, default=60.0, help="seconds measured")
    parser.add_argument("--rounds", type=int, default=1, help="windows one after the other")
    parser.add_argument("--ready-timeout", type=float, default=300.0)
    parser.add_argument("--log", help="serve.sh's output to this file")
    parser.add_argument("--out", help="the rows as JSON to this file")
    args = parser.parse_args(argv)
    if args.attach:
        windows = [measure([args.attach], args.window) for _ in range(args.rounds)]
    else:
        windows = serve_and_measure(args)
    for rows in windows:
        print(format_table(rows, args.window), end="\n\n")
    if args.out:
        Path(args.out).write_text(json.dumps(
            [[r.__dict__ for r in rows] for rows in windows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
