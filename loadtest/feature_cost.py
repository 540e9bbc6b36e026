"""``python -m loadtest.feature_cost``: what each optional feature costs one request, off
and on (issue 55 item 4): Python calls (counted, ``loadtest.request_work``) and CPU
microseconds (``time.process_time`` of the whole process, the pool's threads included).

Every variant is a fresh in-process server (``request_work.serve_in_process``: the ASGI
app, the in-process CPU pool, ``fake:384``) answering one-text ``POST /embed`` requests
one at a time. ``off`` is the shipped default; each feature's ``on`` rows:

- priorities: the request names ``priority: low``;
- traces: an SDK tracer provider with the in-memory exporter installed
  (``blitz.runtime.tracing.install``: every request sampled and its spans kept);
- admin watch: the model was added through the model table (``blitz.admin``, an
  in-memory store, the ingress's and the pool's registries following it) and the
  request names it;
- vector cache: ``ingress.vector_cache_mb: 64``, new texts every time (miss) and the
  same text every time (hit);
- images: a fake dual encoder configured beside the text model (a text request);
- cost budget: the model with ``request_chunking: true`` (a plain request: a chunked one
  cannot run on a fake model, which is no bi-encoder: the pool refuses it, 422).

Calls: the fewest of ``--requests`` counted requests after a warm-up (as
``request_work``). Microseconds: ``--timed`` requests per measurement on servers with no
counter installed, the variants interleaved (off, on, off, on... ``--rounds`` times), the
median per request. A markdown table on stdout.

    python -m loadtest.feature_cost [--requests 30] [--timed 2000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from loadtest import request_work as rw

Setup = Callable[[rw.Served], Awaitable[None]]


@dataclass
class Variant:
    """One way of serving a one-text request: settings, what the request sends, and what is
    done to the server (``setup``) or the process (``install``, returning its undo) first."""

    label: str
    args: dict[str, Any] = field(default_factory=lambda: copy.deepcopy(rw.ARGS))
    model: str = rw.MODEL
    extra: dict[str, Any] | None = None
    unique: bool = True
    setup: Setup | None = None
    install: Callable[[], Callable[[], None]] | None = None


def _with(**changes: Any) -> dict[str, Any]:
    """``rw.ARGS`` with ``changes`` (``models`` replaced, settings sections merged)."""
    args = copy.deepcopy(rw.ARGS)
    for key, value in changes.items():
        args[key] = {**args.get(key, {}), **value} if isinstance(value, dict) else value
    return args


def _traces_in_memory() -> Callable[[], None]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from blitz.runtime import tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)

    def undo() -> None:
        tracing.uninstall()
        provider.shutdown()

    return undo


ADDED = "added"


async def _added_through_the_table(served: rw.Served) -> None:
    """Model ``ADDED`` put in the model table and followed by the ingress and the pool, as
    ``deployments.model_admin``'s followers do (their polls are not per request)."""
    from blitz.admin.store import MemoryStore
    from blitz.admin.table import ModelAdmin
    from blitz.admin.watch import ModelWatch

    admin = ModelAdmin(served.settings, MemoryStore())
    admin.add({"id": ADDED, "source": f"fake:{rw.DIMENSION}"})
    for registry in (served.service.registry, served.pool.replica.registry):
        ModelWatch(admin.store, registry).poll()


def features() -> list[tuple[str, Variant, list[Variant]]]:
    """Each feature: its ``off`` variant and its ``on`` ones."""
    def off() -> Variant:
        return Variant("off")

    chunking = _with(models=[{**rw.ARGS["models"][0], "request_chunking": True}])
    cached = _with(ingress={"vector_cache_mb": 64})
    dual = _with(models=[*rw.ARGS["models"], {"id": "images", "source": f"fake:{rw.DIMENSION}",
                                              "kind": "dual-encoder"}])
    return [
        ("priorities", off(), [Variant("priority low", extra={"priority": "low"})]),
        ("traces", off(), [Variant("in-memory exporter", install=_traces_in_memory)]),
        ("admin watch", off(), [Variant("model from the table", model=ADDED,
                                        setup=_added_through_the_table)]),
        ("vector cache", off(), [Variant("miss", args=cached),
                                 Variant("hit", args=cached, unique=False)]),
        ("images", off(), [Variant("dual encoder configured", args=dual)]),
        ("cost budget", off(), [Variant("request_chunking on", args=chunking)]),
    ]


async def _served(variant: Variant) -> tuple[rw.Served, rw.Request]:
    served = await rw.serve_in_process(variant.args)
    if variant.setup is not None:
        await variant.setup(served)
    return served, rw.embed_request(served.app, 1, model=variant.model, extra=variant.extra,
                                    unique=variant.unique)


def calls(variant: Variant, requests: int, warmup: int) -> rw.Measured:
    """``variant``'s Python calls per request (``request_work``'s count)."""
    undo = variant.install() if variant.install else None
    counter = rw.CallCounter()
    try:
        with counter.installed():
            async def go() -> rw.Measured:
                _, request = await _served(variant)
                return rw.measured(variant.label, await rw.count(counter, request, requests,
                                                                 warmup))
            return asyncio.run(go())
    finally:
        if undo is not None:
            undo()


def microseconds(variants: list[Variant], timed: int, rounds: int, warmup: int
                 ) -> list[float]:
    """Each variant's CPU microseconds per request: ``rounds`` measurements of ``timed``
    requests, the variants taking turns, the median of each's."""
    async def go() -> list[float]:
        servers = []
        for variant in variants:
            undo = variant.install() if variant.install else None
            served, request = await _served(variant)
            servers.append((request, undo))
            if undo is not None:
                undo()
        per: list[list[float]] = [[] for _ in variants]
        for _ in range(rounds):
            for k, variant in enumerate(variants):
                request, _ = servers[k]
                undo = variant.install() if variant.install else None
                try:
                    for _ in range(warmup):
                        call = request()
                        await call.run
                    started = time.process_time()
                    for _ in range(timed):
                        await request().run
                    per[k].append((time.process_time() - started) / timed * 1e6)
                finally:
                    if undo is not None:
                        undo()
        return [statistics.median(values) for values in per]

    return asyncio.run(go())


@dataclass
class Row:
    feature: str
    variant: str
    calls: int
    calls_over_off: int
    us: float | None
    us_over_off: float | None


def measure(requests: int = 30, warmup: int = 10, timed: int = 2000, rounds: int = 3,
            only: list[str] | None = None) -> list[Row]:
    rows = []
    for feature, off, ons in features():
        if only and feature not in only:
            continue
        counted = [calls(v, requests, warmup) for v in (off, *ons)]
        us: list[float | None] = (microseconds([off, *ons], timed, rounds, warmup)
                                  if timed else [None] * (1 + len(ons)))
        for variant, m, t in zip((off, *ons), counted, us, strict=True):
            rows.append(Row(feature, variant.label, m.calls, m.calls - counted[0].calls, t,
                            None if t is None or us[0] is None else t - us[0]))
    return rows


def markdown(rows: list[Row]) -> str:
    lines = ["| feature | variant | calls / request | calls over off | µs / request "
             "(CPU) | µs over off |", "|---|---|---|---|---|---|"]
    for r in rows:
        us = "-" if r.us is None else f"{r.us:.0f}"
        over = "-" if r.us_over_off is None else f"{r.us_over_off:+.0f}"
        lines.append(f"| {r.feature} | {r.variant} | {r.calls} | {r.calls_over_off:+d} | "
                     f"{us} | {over} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.feature_cost",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=30, help="counted per variant")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--timed", type=int, default=2000, help="timed per measurement; 0: "
                        "calls only")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", help="comma-separated features")
    args = parser.parse_args(argv)
    rows = measure(args.requests, args.warmup, args.timed, args.rounds,
                   args.only.split(",") if args.only else None)
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
