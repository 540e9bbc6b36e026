"""``python -m loadtest hops``: one user's latency, hop by hop, beside the in-process call.

One request in flight, one text each (a search box embedding a query). Each reply's
``server-timing`` header (``blitz.timing``) says where its time went inside Blitz; what
the client measured beyond the server's ``total`` is the HTTP proxy, the network and the
client's own parsing (``proxy``). With ``--inprocess BACKEND`` the same model is also
called in this process (one text per call, one caller, the encoder's default threads),
in blocks interleaved with the served ones (A B A B ...), so the two are measured side
by side however the machine's speed moves; the report gives the p50 and p99 of each and
the p50 of every hop. ``--gap-ms`` adds a block of in-process calls each made after that
long asleep: a server that waits for one user's next request runs its model call after
an idle gap too, and on this machine such a call takes ~1 ms longer than one made back
to back (cold caches, idle cores waking), whatever server runs it.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from blitz import timing
from loadtest.apis import auth_headers, get_api
from loadtest.corpus import sentences
from loadtest.http_client import make_http_client

PROXY = "proxy"  # client latency beyond the server's total: HTTP proxy, network, client


@dataclass
class HopsReport:
    url: str
    model: str
    api: str
    rounds: int
    per_round: int
    served_ms: list[float] = field(default_factory=list)
    inprocess_ms: list[float] = field(default_factory=list)
    hops_ms: dict[str, list[float]] = field(default_factory=dict)
    inprocess_backend: str | None = None
    inprocess_threads: int | None = None
    gap_ms: float = 0.0  # > 0: also in-process calls each after this long asleep
    inprocess_gapped_ms: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"served": _percentiles(self.served_ms)}
        if self.inprocess_ms:
            out["inprocess"] = _percentiles(self.inprocess_ms)
            out["served_minus_inprocess_p50_ms"] = round(
                out["served"]["p50"] - out["inprocess"]["p50"], 3)
            out["served_p99_over_p50"] = round(out["served"]["p99"] / out["served"]["p50"], 2)
        if self.inprocess_gapped_ms:
            out["inprocess_after_gaps"] = _percentiles(self.inprocess_gapped_ms)
        out["hops_p50_ms"] = {name: round(float(np.median(values)), 3)
                              for name, values in self.hops_ms.items() if values}
        return out

    def to_json(self) -> dict[str, Any]:
        return {"config": {k: v for k, v in asdict(self).items()
                           if k not in ("served_ms", "inprocess_ms", "hops_ms",
                                        "inprocess_gapped_ms")},
                "summary": self.summary(), "served_ms": self.served_ms,
                "inprocess_gapped_ms": self.inprocess_gapped_ms,
                "inprocess_ms": self.inprocess_ms, "hops_ms": self.hops_ms}


def _percentiles(values: list[float]) -> dict[str, float]:
    a = np.asarray(values)
    return {"n": len(values), "p50": round(float(np.percentile(a, 50)), 3),
            "p90": round(float(np.percentile(a, 90)), 3),
            "p99": round(float(np.percentile(a, 99)), 3)}


async def _served_block(client, api, texts, model: str, n: int, report: HopsReport,
                        record: bool) -> None:
    for _ in range(n):
        request = api.request([next(texts)], model)
        started = time.perf_counter()
        reply = await client.post(request.path, request.body, request.headers)
        if reply.status_code != 200:
            raise RuntimeError(f"HTTP {reply.status_code}: {reply.content[:300]!r}")
        api.parse(reply.content, reply.headers)
        ms = (time.perf_counter() - started) * 1000
        if not record:
            continue
        report.served_ms.append(ms)
        hops = timing.parse_header(reply.headers.get(timing.HEADER, ""))
        if "total" in hops:
            hops[PROXY] = max(0.0, ms - hops["total"])
        for name, value in hops.items():
            report.hops_ms.setdefault(name, []).append(value)


def _inprocess_block(embed: Callable[[list[str]], Any], texts, n: int, into: list[float],
                     gap_s: float = 0.0) -> None:
    for _ in range(n):
        text = next(texts)
        if gap_s:
            time.sleep(gap_s)  # idle between calls, as a server is between one user's requests
        started = time.perf_counter()
        embed([text])
        into.append((time.perf_counter() - started) * 1000)


async def measure(url: str, model: str, *, api_name: str = "native-msgpack",
                  path: str | None = None, rounds: int = 5,
                  per_round: int = 200, warmup: int = 50, api_key: str | None = None,
                  inprocess: Callable[[list[str]], Any] | None = None,
                  inprocess_backend: str | None = None, gap_ms: float = 0.0,
                  transport: Any = None) -> HopsReport:
    api = get_api(api_name, path)
    texts = itertools.cycle(sentences(4096))
    report = HopsReport(url, model, api_name, rounds, per_round,
                        inprocess_backend=inprocess_backend,
                        inprocess_threads=_threads() if inprocess is not None else None,
                        gap_ms=gap_ms)
    client = make_http_client("aiohttp", url, auth_headers(api_key), 60.0, 1, transport)
    try:
        await _served_block(client, api, texts, model, warmup, report, record=False)
        if inprocess is not None:
            for _ in range(warmup):
                inprocess([next(texts)])
        for _ in range(rounds):
            await _served_block(client, api, texts, model, per_round, report, record=True)
            if inprocess is not None:
                _inprocess_block(inprocess, texts, per_round, report.inprocess_ms)
                if gap_ms:
                    _inprocess_block(inprocess, texts, per_round, report.inprocess_gapped_ms,
                                     gap_ms / 1000)
    finally:
        await client.aclose()
    return report


def render(report: HopsReport) -> str:
    s = report.summary()
    lines = [f"one user: {report.rounds} rounds x {report.per_round} requests, 1 in flight, "
             f"model {report.model!r}, {report.api}"]
    served = s["served"]
    lines.append(f"  served     p50 {served['p50']:7.3f} ms   p99 {served['p99']:7.3f} ms")
    if "inprocess" in s:
        ip = s["inprocess"]
        lines.append(f"  in process p50 {ip['p50']:7.3f} ms   p99 {ip['p99']:7.3f} ms "
                     f"({report.inprocess_backend}, 1 text per call, "
                     f"{report.inprocess_threads} thread(s))")
        if "inprocess_after_gaps" in s:
            gapped = s["inprocess_after_gaps"]
            lines.append(f"  in process p50 {gapped['p50']:7.3f} ms   p99 {gapped['p99']:7.3f} ms "
                         f"(each call after {report.gap_ms:g} ms idle)")
        lines.append(f"  served - in process (p50): {s['served_minus_inprocess_p50_ms']:.3f} ms;"
                     f" served p99 / p50: {s['served_p99_over_p50']:.2f}")
    lines.append("  where the served time goes (p50 per hop, ms; they need not add up):")
    for name in (*timing.ENTRIES, PROXY):
        if name in s["hops_p50_ms"]:
            lines.append(f"    {name:<14}{s['hops_p50_ms'][name]:8.3f}")
    return "\n".join(lines)


def _threads() -> int:
    from blitz.runtime import model_threads

    return model_threads.count()


def run(args) -> int:
    import orjson

    embed = None
    if args.inprocess:
        from blitz.runtime import model_threads
        from loadtest.inprocess import blitz_embed

        if args.threads:
            model_threads.configure(args.threads)
        embed = blitz_embed(args.model, args.source, args.inprocess)
    report = asyncio.run(measure(args.url, args.model, api_name=args.api, path=args.path,
                                 rounds=args.rounds,
                                 per_round=args.per_round, warmup=args.warmup,
                                 api_key=args.api_key, inprocess=embed,
                                 inprocess_backend=args.inprocess, gap_ms=args.gap_ms))
    print(render(report))
    if args.out:
        with open(args.out, "wb") as f:
            f.write(orjson.dumps(report.to_json(), option=orjson.OPT_INDENT_2))
    return 0
