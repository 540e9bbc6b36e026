"""``python -m loadtest.hop_floor``: the local hop's own round trip, with nothing behind it.

The floor under Blitz's ingress -> CPU pool hop (``blitz.pool.local_hop``, what the
shipped config takes on one node): a ``LocalHopServer`` in a second plain Python process
whose handler answers at once, and a ``LocalHopClient`` here, one call in flight at a
time, as one user's request makes it. Each call carries what a one-text request sends
(``[EmbedJob(texts=[text])]``) and gets back what the pool answers
(``[EmbedResult]`` with one 384-float vector). No Ray, no model, no HTTP: what crossing to
a second process over Blitz's socket and frames costs on this machine, to set beside the
Serve floor (``loadtest.serve_floor``) when asking what Blitz adds on top of both
(``loadtest/serving_path.sh``).

    python -m loadtest.hop_floor [--per-round 300] [--warmup 50] [--out FILE.json]

The report's ``summary.served`` has the p50 and p99 in ms, as ``loadtest hops`` writes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Sequence

import numpy as np

from blitz.hop_messages import EmbedJob, EmbedResult, Usage
from blitz.pool.local_hop import LocalHopClient, LocalHopServer

DIMENSION = 384


async def _serve() -> None:
    vector = np.zeros((1, DIMENSION), dtype=np.float32)

    async def handler(model_id: str, jobs: list[EmbedJob]) -> list[EmbedResult]:
        return [EmbedResult(vector.copy(), model_id, Usage(len(job), len(job))) for job in jobs]

    server = LocalHopServer(handler)
    await server.start()
    print(server.path, flush=True)
    try:
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until EOF
    finally:
        await server.aclose()
        await asyncio.sleep(0.1)  # the connection's task ends on its own


def _percentiles(values: Sequence[float]) -> dict[str, float]:
    return {"p50": round(float(np.percentile(values, 50)), 3),
            "p99": round(float(np.percentile(values, 99)), 3), "n": len(values)}


async def measure(path: str, per_round: int, warmup: int) -> list[float]:
    client = await LocalHopClient.connect(path)
    try:
        times = []
        for i in range(warmup + per_round):
            jobs = [EmbedJob(texts=[f"a query of one user, number {i}"])]
            start = time.perf_counter()
            results = await client.call("free", jobs)
            elapsed = (time.perf_counter() - start) * 1000
            assert results[0].embeddings.shape == (1, DIMENSION)
            if i >= warmup:
                times.append(elapsed)
        return times
    finally:
        client.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.hop_floor", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-round", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--out", default=None, help="write the JSON report here too")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the child
    args = parser.parse_args(argv)
    if args.serve:
        asyncio.run(_serve())
        return 0
    with subprocess.Popen([sys.executable, "-m", "loadtest.hop_floor", "--serve"],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as child:
        try:
            path = child.stdout.readline().strip()
            times = asyncio.run(measure(path, args.per_round, args.warmup))
        finally:
            child.stdin.close()  # the child's stdin ends: it closes its server and exits
            child.wait(timeout=10)
    report = {"what": "the local hop's round trip, a do-nothing handler in a second process",
              "summary": {"served": _percentiles(times)}}
    text = json.dumps(report, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
