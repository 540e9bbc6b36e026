"""``python -m loadtest.grpc_vs_http``: TEI's gRPC API beside HTTP msgpack on a running
server (``scripts/serve.sh`` or ``serve run serve_config.yaml``: HTTP on 8000, gRPC on
9000, both through HAProxy to the ingress replicas on the fast path).

Two profiles, each in rounds that alternate HTTP, gRPC, HTTP, gRPC ... so both are
measured however this machine's speed moves:

- ``single``: one text per request, ``--concurrency`` requests in flight: ``POST /embed``
  with a msgpack body and reply, against gRPC ``Embed``;
- ``batch32``: 32 texts per request, ``--batch-concurrency`` in flight: one ``/embed`` of
  32 texts, against one gRPC ``EmbedStream`` of 32 messages (TEI's proto carries one
  text per message; its streams are how a client batches).

Every reply is checked (one vector of the model's dimension per text), and before the
rounds one text's gRPC vector must equal its HTTP vector bit for bit. Per round:
texts/s, requests/s, p50 and p99 (a batch32 request is the whole 32-text exchange). The
client runs on the same machine as the server and takes CPU from it: httpx costs more
per request than grpc's C core, which is part of what a client of each API pays.
Writes ``grpc-vs-http.json`` under ``--out`` and prints the table for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np

from blitz import codecs
from blitz.grpc_api import rpc_table
from blitz.grpc_api import tei_pb2 as pb
from loadtest import results
from loadtest.corpus import sentences
from loadtest.report import environment

BATCH = 32
MSGPACK = {"content-type": "application/msgpack", "accept": "application/msgpack"}


class Http:
    name = "http-msgpack"

    def __init__(self, base: str, concurrency: int, model: str | None):
        self.client = httpx.AsyncClient(base_url=base, timeout=120,
                                        limits=httpx.Limits(max_connections=concurrency))
        self.model = model

    async def embed(self, texts: list[str]) -> np.ndarray:
        body = {"texts": texts} | ({"model": self.model} if self.model else {})
        r = await self.client.post("/embed", content=codecs.pack(body), headers=MSGPACK)
        r.raise_for_status()
        return codecs.unpack(r.content)["embeddings"]

    async def close(self) -> None:
        await self.client.aclose()


class Grpc:
    name = "grpc"

    def __init__(self, target: str, model: str | None):
        self.channel = grpc.aio.insecure_channel(target)
        self.unary = rpc_table.client_method(self.channel, "Embed")
        self.stream = rpc_table.client_method(self.channel, "EmbedStream")
        self.metadata = (("model", model),) if model else ()

    async def embed(self, texts: list[str]) -> np.ndarray:
        if len(texts) == 1:
            reply = await self.unary(pb.EmbedRequest(inputs=texts[0], truncate=True),
                                     metadata=self.metadata)
            return np.array([reply.embeddings], dtype=np.float32)
        requests = [pb.EmbedRequest(inputs=text, truncate=True) for text in texts]
        rows = [r.embeddings async for r in self.stream(iter(requests),
                                                         metadata=self.metadata)]
        return np.array(rows, dtype=np.float32)

    async def close(self) -> None:
        await self.channel.close()


async def one_round(client: Http | Grpc, texts: list[str], per_request: int,
                    concurrency: int, seconds: float, dimension: int) -> dict[str, Any]:
    latencies: list[float] = []
    errors = 0
    position = 0
    end = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal position, errors
        while time.perf_counter() < end:
            batch = [texts[(position + i) % len(texts)] for i in range(per_request)]
            position += per_request
            sent = time.perf_counter()
            try:
                rows = await client.embed(batch)
            except (httpx.HTTPError, grpc.RpcError):
                errors += 1
                continue
            if rows.shape != (per_request, dimension):
                errors += 1
                continue
            latencies.append(time.perf_counter() - sent)

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    took = time.perf_counter() - began
    ms = sorted(x * 1000 for x in latencies)
    return {"texts_per_s": round(len(ms) * per_request / took, 1),
            "requests_per_s": round(len(ms) / took, 1),
            "p50_ms": round(statistics.median(ms), 2) if ms else None,
            "p99_ms": round(ms[int(0.99 * (len(ms) - 1))], 2) if ms else None,
            "errors": errors}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    texts = sentences(4_000, seed=11)
    http = Http(args.http, max(args.concurrency, args.batch_concurrency), args.model)
    rpc = Grpc(args.grpc, args.model)
    try:
        probe = "the same text over both APIs"
        over_http, over_grpc = await http.embed([probe]), await rpc.embed([probe])
        check = {"grpc_equals_http": bool(np.array_equal(over_http, over_grpc)),
                 "dimension": int(over_http.shape[1])}
        print(check, flush=True)
        rounds = []
        for number in range(1, args.rounds + 1):
            for profile, per, concurrency in (("single", 1, args.concurrency),
                                              ("batch32", BATCH, args.batch_concurrency)):
                for client in (http, rpc):
                    got = await one_round(client, texts, per, concurrency, args.seconds,
                                          check["dimension"])
                    rounds.append({"round": number, "profile": profile, "api": client.name,
                                   **got})
                    print(rounds[-1], flush=True)
        return {"check": check, "rounds": rounds}
    finally:
        await http.close()
        await rpc.close()


def table(rounds: list[dict[str, Any]]) -> str:
    lines = ["| profile | round | HTTP msgpack texts/s | gRPC texts/s | gRPC/HTTP | "
             "HTTP p50 ms | gRPC p50 ms | errors |", "|---|---|---|---|---|---|---|---|"]
    pairs: dict[tuple[str, int], dict[str, dict[str, Any]]] = {}
    for row in rounds:
        pairs.setdefault((row["profile"], row["round"]), {})[row["api"]] = row
    for (profile, number), pair in sorted(pairs.items()):
        h, g = pair.get("http-msgpack"), pair.get("grpc")
        if h is None or g is None:
            continue
        lines.append(f"| {profile} | {number} | {h['texts_per_s']:,} | {g['texts_per_s']:,} | "
                     f"{g['texts_per_s'] / h['texts_per_s']:.2f}x | {h['p50_ms']} | "
                     f"{g['p50_ms']} | {h['errors'] + g['errors']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.grpc_vs_http", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--http", default="http://127.0.0.1:8000")
    parser.add_argument("--grpc", default="127.0.0.1:9000")
    parser.add_argument("--model", default=None, help="a model id (the default model if unset)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--batch-concurrency", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("results/grpc-vs-http"))
    parser.add_argument("--results", type=Path, default=results.RESULTS,
                        help="where the results file BENCHMARKS.md is rendered from goes "
                        "(python -m loadtest.render)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"kind": "grpc-vs-http", "environment": environment(),
              "settings": vars(args) | {"out": str(args.out)}, **asyncio.run(run(args))}
    (args.out / "grpc-vs-http.json").write_text(json.dumps(result, indent=2))
    measured = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    results.save("grpc-vs-http", {"kind": "grpc-vs-http", "measured": measured,
                                  "rounds": result["rounds"]}, args.results)
    print(table(result["rounds"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
