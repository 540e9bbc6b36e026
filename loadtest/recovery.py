"""``python -m loadtest.recovery``: how long a killed pool replica takes to serve again.

Against a running server on this machine (``bash scripts/serve.sh``): finds the pool
replica's process by its Ray title (``ray::ServeReplica:<app>:<deployment>``), sends
one-text requests until they answer 200, SIGKILLs the replica, then keeps sending (one
in flight, every ``--every-ms``) until one answers 200 again. Reports the time from the
kill to that answer (what recovery and autoscaling wait for), the time from the new
replica process's start to it (Ray may hand the replica a worker process it started
earlier, so this can be longer than the recovery), both moments in wall-clock time (the
replica log's "constructed in" line gives the constructor's end and length: compare),
and every status seen meanwhile.

    python -m loadtest.recovery [--url URL] [--model minilm] [--deployment CPUPool|Ingress]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path


def replica_pids(app: str, deployment: str) -> list[int]:
    title = f"ray::ServeReplica:{app}:{deployment}"
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if cmdline.startswith(title):
            pids.append(int(proc.name))
    return pids


def started_at(pid: int) -> float:
    """The process's start, as ``time.time()``, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[19])  # starttime: field 22, the 20th after the name
    boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                if line.startswith("btime"))
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def ask(url: str, model: str, timeout_s: float) -> int:
    body = json.dumps({"texts": ["is it back?"], "model": model}).encode()
    request = urllib.request.Request(url + "/embed", data=body, headers={
        "content-type": "application/json", "accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:
            reply.read()
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0  # no answer: connection refused, reset or timed out


def measure(url: str, model: str, app: str, deployment: str, every_s: float = 0.02,
            deadline_s: float = 180.0) -> dict:
    pids = replica_pids(app, deployment)
    if len(pids) != 1:
        raise SystemExit(f"expected one {deployment} replica of app {app!r}, found {pids}")
    for _ in range(50):
        if ask(url, model, 30) == 200:
            break
    else:
        raise SystemExit("the server does not answer 200 before the kill")
    os.kill(pids[0], signal.SIGKILL)
    killed = time.time()
    statuses: Counter[int] = Counter()
    while time.time() - killed < deadline_s:
        status = ask(url, model, 5)
        if status == 200:
            break
        statuses[status] += 1
        time.sleep(every_s)
    else:
        raise SystemExit(f"no 200 within {deadline_s:g} s of the kill; seen {dict(statuses)}")
    back = time.time()
    new = [p for p in replica_pids(app, deployment) if p != pids[0]]
    out = {"killed_at": _clock(killed), "first_200_at": _clock(back),
           "kill_to_200_s": round(back - killed, 2), "statuses_meanwhile": dict(statuses),
           "old_pid": pids[0], "new_pid": new[0] if new else None}
    if new:
        start = started_at(new[0])
        out["process_start_to_200_s"] = round(back - start, 2)
        out["kill_to_process_start_s"] = round(start - killed, 2)
    return out


def _clock(t: float) -> str:
    """Wall-clock time as Serve's logs print it (local time, milliseconds)."""
    return time.strftime("%H:%M:%S", time.localtime(t)) + f",{int(t % 1 * 1000):03d}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.recovery",
                                     description=__doc__.split("\n\n")[1])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--app", default="blitz")
    parser.add_argument("--deployment", help="default: CPUPool, or Ingress where the CPU "
                        "pool runs inside it (ingress.cpu_pool: in_process)")
    parser.add_argument("--every-ms", type=float, default=20.0)
    args = parser.parse_args(argv)
    deployment = args.deployment or (
        "CPUPool" if replica_pids(args.app, "CPUPool") else "Ingress")
    print(json.dumps(measure(args.url, args.model, args.app, deployment,
                             args.every_ms / 1000)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
