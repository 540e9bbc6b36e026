"""Fault: four models on a three-model replica under mixed load (issue #8, item 3).

Two clients send 64-text batches to one model while a third rotates single texts over
the other three, so every rotation evicts a model, sometimes one a batch is using.
Every answer must be a 200 equal to in-process encoding, and the replica's memory must
stay flat over the evictions. 200 by default (~2.5 min here): 500, the default before
issue #34 item 5 (~6 min), caught a leak 2.5x smaller per eviction; set
BLITZ_SOAK_EVICTIONS=500 or more for that.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time

import httpx
import numpy as np

from blitz import codecs
from tests.faults.conftest import small_app

APP = "fault-evict"
EVICTIONS = int(os.environ.get("BLITZ_SOAK_EVICTIONS", "200"))
WARMUP_EVICTIONS = 30
DEADLINE_S = 900
BATCH = [f"batch sentence {i} on topic {i % 7}" for i in range(64)]
SINGLE = ["a single text to rotate"]


async def test_eviction_soak_keeps_answers_correct_and_memory_flat(
        deploy, tiny_models, fourth_tiny_model, reference):
    from ray import serve

    paths = {"tiny-a": tiny_models["tiny-a"], "tiny-b": tiny_models["tiny-b"],
             "tiny-c": tiny_models["tiny-c"], "tiny-d": fourth_tiny_model}
    url = deploy(APP, small_app([{"id": m, "source": str(p)} for m, p in paths.items()],
                                cpu_pool={"max_batch_size": 64}))
    expected = {m: reference(m, p).encode(BATCH if m == "tiny-a" else SINGLE,
                                          normalize_embeddings=True)
                for m, p in paths.items()}
    pool = serve.get_deployment_handle("CPUPool", APP)
    failures: list[str] = []
    answers = {"batch": 0, "single": 0}
    stop = asyncio.Event()

    def verify(r: httpx.Response, model: str, kind: str) -> None:
        if r.status_code != 200:
            failures.append(f"{model}: {r.status_code} {r.text[:200]}")
            return
        got = codecs.unpack(r.content)["embeddings"]
        cosine = np.sum(got * expected[model], axis=1)
        if got.shape != expected[model].shape or cosine.min() < 0.999:
            failures.append(f"{model}: wrong answer (min cosine {cosine.min():.4f})")
        answers[kind] += 1

    async def post(client, model, texts):
        return await client.post("/embed", content=codecs.pack({"texts": texts, "model": model}),
                                 headers={"content-type": "application/msgpack"})

    async def batches(client):
        while not stop.is_set():
            verify(await post(client, "tiny-a", BATCH), "tiny-a", "batch")

    async def rotate(client):
        for model in itertools.cycle(["tiny-b", "tiny-c", "tiny-d"]):
            if stop.is_set():
                return
            verify(await post(client, model, SINGLE), model, "single")

    samples: list[tuple[int, int]] = []  # (evictions, rss bytes)

    async def watch():
        end = time.monotonic() + DEADLINE_S
        while time.monotonic() < end and not failures:
            stats = await pool.stats.remote()
            samples.append((stats["evictions"], stats["rss_bytes"]))
            if stats["evictions"] >= EVICTIONS + WARMUP_EVICTIONS:
                break
            await asyncio.sleep(1)
        stop.set()

    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        await asyncio.gather(batches(client), batches(client), rotate(client), watch())

    warm = next(rss for n, rss in samples if n >= WARMUP_EVICTIONS)
    final_evictions, final = samples[-1]
    drift = (final - warm) / warm
    step = max(100, EVICTIONS // 8)  # the trend tells a leak (steady) from warm-up (early)
    trend = {n // step * step: rss for n, rss in samples if n >= WARMUP_EVICTIONS}
    print(f"\neviction soak: {final_evictions} evictions, {answers} answers, RSS "
          f"{warm / 2**20:.0f} -> {final / 2**20:.0f} MiB ({drift:+.1%}); by evictions: "
          + ", ".join(f"{n}: {rss / 2**20:.0f}" for n, rss in sorted(trend.items())))
    assert not failures, failures[:5]
    assert final_evictions >= EVICTIONS + WARMUP_EVICTIONS
    assert abs(drift) <= 0.10
