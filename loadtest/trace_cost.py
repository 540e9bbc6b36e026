"""``python -m loadtest.trace_cost``: what OpenTelemetry traces cost one request in process,
off and on, against the code before them (docs/operations.md, "Traces (OpenTelemetry)").

Requests go one at a time into the real ASGI app (``HttpApi``: the middleware, the routes,
the service), called directly (no HTTP client, no sockets), each with a ``traceparent``:

- ``app``: a dispatcher that answers at once with a ready vector: the middleware's and the
  service's own work, where the off switch lives;
- ``pool``: the ingress's dispatcher (its queue, the hop) into a pool replica in the same
  process (``ingress.cpu_pool: in_process``) on a fake model: every span of a request.

Variants, each in a fresh interpreter: ``before`` (``--before DIR``: a tree without traces,
e.g. ``git worktree add DIR <commit>``), ``off`` (this tree, default settings), ``on`` (an
SDK tracer provider and a batch span processor whose exporter drops every span: making
spans, not sending them). Rounds alternate the variants; per variant and path, the median
of the rounds' mean microseconds per request (each round after a warm-up).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TRACEPARENT = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
ARGS = {"models": [{"id": "m", "source": "fake:4"}], "cpu_pool": {"workers": 1},
        "ingress": {"pool_hop": "serve"}}
BODY = b'{"texts": ["a short sentence"]}'


def _scope() -> dict[str, Any]:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": "/embed", "raw_path": b"/embed",
            "root_path": "", "query_string": b"", "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 8000),
            "headers": [(b"content-type", b"application/json"),
                        (b"accept", b"application/json"),
                        (b"content-length", str(len(BODY)).encode()),
                        (b"traceparent", TRACEPARENT)]}


async def _request(app: Any) -> int:
    status = 0
    given = False

    async def receive() -> dict[str, Any]:
        nonlocal given
        if given:
            await asyncio.Event().wait()  # no disconnect: the request ends first
        given = True
        return {"type": "http.request", "body": BODY, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(_scope(), receive, send)
    return status


def _tracing_on() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    from blitz.runtime import tracing

    class Dropped(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropped()))
    tracing.install(provider)


async def _measure(path: str, variant: str, requests: int, warmup: int) -> float:
    """Mean microseconds per request on ``path`` in this interpreter."""
    import numpy as np

    from blitz.encoders.base import Encoded
    from blitz.http.api import HttpApi
    from blitz.ingress.service import EmbeddingService
    from blitz.settings.config import BlitzSettings

    if variant == "on":
        _tracing_on()
    settings = BlitzSettings.from_args(ARGS)
    if path == "app":
        class Ready:  # blitz.ingress.service.Dispatcher, answering at once
            pools = frozenset({"cpu"})

            def max_batch(self, pool: str) -> int:
                return 128

            def running_pools(self) -> frozenset[str]:
                return self.pools

            def wake(self, pool: str) -> None:
                pass

            def unplaced_pools(self) -> dict[str, str]:
                return {}

            async def submit(self, pool: str, model_id: str, job: Any) -> Encoded:
                return Encoded(np.ones((len(job), 4), np.float32), np.ones(len(job), np.int64))

        dispatcher: Any = Ready()
    else:
        from blitz.pool.dispatcher import ReplicaDispatcher
        from deployments.ingress import InProcessCpuDispatcher

        dispatcher = InProcessCpuDispatcher(settings, ReplicaDispatcher(settings, "cpu"), {})
    app = HttpApi(EmbeddingService(settings, dispatcher))
    for _ in range(warmup):
        assert await _request(app) == 200
    started = time.perf_counter()
    for _ in range(requests):
        await _request(app)
    return (time.perf_counter() - started) / requests * 1e6


def _child(args: argparse.Namespace) -> None:
    mean = asyncio.run(_measure(args.path, args.variant, args.requests, args.warmup))
    print(json.dumps({"us": mean}))


def _round(tree: Path, path: str, variant: str, requests: int, warmup: int) -> float:
    env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{REPO}"}  # the tree's blitz first
    env = {k: v for k, v in env.items() if not k.startswith("OTEL_")}
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child",
                           "--path", path, "--variant", variant, "--requests", str(requests),
                           "--warmup", str(warmup)], env=env, capture_output=True, text=True,
                          check=False, cwd=tree)
    if done.returncode != 0:
        raise SystemExit(f"{variant} on {path} failed:\n{done.stderr[-3000:]}")
    return float(json.loads(done.stdout.strip().splitlines()[-1])["us"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="a tree of the code without traces")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--paths", default="app,pool")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args)
        return 0
    variants = [("before", args.before)] if args.before else []
    variants += [("off", REPO), ("on", REPO)]
    means: dict[str, dict[str, list[float]]] = {}
    for path in args.paths.split(","):
        for k in range(args.rounds):
            for variant, tree in variants if k % 2 == 0 else variants[::-1]:
                us = _round(tree, path, variant, args.requests, args.warmup)
                means.setdefault(path, {}).setdefault(variant, []).append(us)
    report = {path: {variant: round(statistics.median(values), 1)
                     for variant, values in by_variant.items()}
              for path, by_variant in means.items()}
    print("path  " + "  ".join(f"{variant:>8}" for variant, _ in variants)
          + "   (median of rounds, us per request)")
    for path, medians in report.items():
        print(f"{path:5} " + "  ".join(f"{medians[v]:8.1f}" for v, _ in variants))
    if args.out:
        args.out.write_text(json.dumps({"medians_us": report, "rounds": means}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
