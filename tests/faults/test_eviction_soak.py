"""Fault: four models on a three-model replica under mixed load, evicting as it serves.

Two clients send 64-text batches to one model while a third rotates single texts over
the other three (wider, two on onnxruntime), so every rotation evicts a model, sometimes
one a batch is using.
Every answer must be a 200 equal to in-process encoding, and the replica's memory must
plateau over the evictions: past warm-up, the RSS and the bytes live in malloc
(``mallinfo2``: in use plus mapped: a leak) grow by at most 5% over the run, by their trend
against the evictions (the Theil-Sen slope: the median of every pair of samples' slopes,
times the run's evictions, over the trend's start), which a steady leak cannot pass and
the moment's mix of resident models and batches in flight does not move (a sample's live
bytes swing by a model's weights, ~31 MiB, with which three are loaded); and it must
plateau where it started: the median RSS of the last quarter of the samples within 10% of
the RSS once every model had loaded (the fault it guards: freed weights' pages kept in
glibc's arenas, so a replica's RSS climbed with every eviction). 200 evictions by default (a few minutes);
500 catch a leak 2.5x smaller per eviction: set BLITZ_SOAK_EVICTIONS=500 or more for that. A long run
with real models: ``python -m loadtest.eviction_soak --minutes 15``.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import statistics
import time

import httpx
import numpy as np

from blitz import codecs
from tests.faults.conftest import small_app
from tests.tiny_models import build_tiny_bi_encoder

APP = "fault-evict"
EVICTIONS = int(os.environ.get("BLITZ_SOAK_EVICTIONS", "200"))
WARMUP_EVICTIONS = 30
PLATEAU = 0.05  # growth over the run by the trend, RSS and live malloc bytes
LEVEL = 0.10  # the last quarter's median RSS over the first rotation's (all four loaded)
DEADLINE_S = 900
BATCH = [f"batch sentence {i} on topic {i % 7}" for i in range(64)]
SINGLE = ["a single text to rotate"]


async def test_eviction_soak_keeps_answers_correct_and_memory_flat(
        deploy, tiny_models, tmp_path, reference):
    from ray import serve

    # the rotating three wider (~31 MiB of weights each; MiniLM's are 87), two on
    # onnxruntime, which copies its weights into malloc: what glibc keeps of freed models
    # shows (without blitz.runtime.malloc: RSS +37% over the first rotation in 230
    # evictions; with the trims alone +33%), as it did not with 6-8 MiB torch models
    paths = {"tiny-a": tiny_models["tiny-a"], **{
        f"wide-{c}": build_tiny_bi_encoder(tmp_path / f"wide-{c}", hidden=hidden, seed=seed)
        for c, hidden, seed in (("b", 256, 6), ("c", 272, 7), ("d", 288, 8))}}
    backends = {"wide-b": "onnx", "wide-c": "onnx"}
    url = deploy(APP, small_app([{"id": m, "source": str(p),
                                  "cpu_backend": backends.get(m, "torch")}
                                 for m, p in paths.items()],
                                cpu_pool={"max_batch_size": 64},
                                # answers and memory are asserted here, not latency: a
                                # load (an ONNX build the first time) behind a batch on a
                                # busy 2-core machine can pass the fault apps' 20 s
                                ingress={"pool_timeout_s": 120}))
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
        for model in itertools.cycle(["wide-b", "wide-c", "wide-d"]):
            if stop.is_set():
                return
            verify(await post(client, model, SINGLE), model, "single")

    samples: list[tuple[int, int, int]] = []  # (evictions, rss bytes, live malloc bytes)

    async def watch():
        end = time.monotonic() + DEADLINE_S
        while time.monotonic() < end and not failures:
            stats = await pool.stats.remote()
            live = stats["malloc"] or {}  # (None without glibc: RSS stands in)
            samples.append((stats["evictions"], stats["rss_bytes"],
                            live.get("in_use", 0) + live.get("mmapped", 0) or stats["rss_bytes"]))
            if stats["evictions"] >= EVICTIONS + WARMUP_EVICTIONS:
                break
            await asyncio.sleep(1)
        stop.set()

    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        await asyncio.gather(batches(client), batches(client), rotate(client), watch())

    warm = [sample for sample in samples if sample[0] >= WARMUP_EVICTIONS]
    rotated = [rss for n, rss, _ in samples if 3 <= n < WARMUP_EVICTIONS]  # all four loaded
    first, last = warm[:len(warm) // 2], warm[-max(1, len(warm) // 4):]
    assert not failures, failures[:5]
    assert len(first) >= 4 and rotated, samples  # enough samples for medians

    def growth(k: int) -> float:  # the trend's rise over the run, over its start
        slope = theil_sen([(s[0], s[k]) for s in warm])
        span = warm[-1][0] - warm[0][0]
        start = statistics.median(s[k] - slope * (s[0] - warm[0][0]) for s in warm)
        return slope * span / start

    def level() -> float:  # the last quarter's median RSS over the first rotation's
        return statistics.median(s[1] for s in last) / statistics.median(rotated) - 1

    final_evictions = samples[-1][0]
    step = max(100, EVICTIONS // 8)  # the trend tells a leak (steady) from warm-up (early)
    trend = {n // step * step: (rss, live) for n, rss, live in warm}
    print(f"\neviction soak: {final_evictions} evictions, {answers} answers, RSS "
          f"{warm[0][1] / 2**20:.0f} -> {warm[-1][1] / 2**20:.0f} MiB, by the trend "
          f"{growth(1):+.1%} over the run, live malloc bytes {growth(2):+.1%}, RSS "
          f"{level():+.1%} over the first rotation's ({statistics.median(rotated) / 2**20:.0f}"
          " MiB); by evictions (RSS, live MiB): " + ", ".join(
              f"{n}: {rss / 2**20:.0f}, {live / 2**20:.0f}"
              for n, (rss, live) in sorted(trend.items())))
    assert final_evictions >= EVICTIONS + WARMUP_EVICTIONS
    assert growth(1) <= PLATEAU, "the replica's RSS still grows under eviction"
    assert growth(2) <= PLATEAU, "live malloc bytes grow under eviction: a leak"
    assert level() <= LEVEL, "freed models' memory stays in the replica (glibc's arenas)"


def theil_sen(points: list[tuple[int, int]]) -> float:
    """The median of the slopes between every two points of different x: a trend that a
    few outlying samples (a load in progress, a batch's buffers) do not move."""
    slopes = [(y2 - y1) / (x2 - x1) for (x1, y1), (x2, y2) in itertools.combinations(points, 2)
              if x2 != x1]
    return statistics.median(slopes) if slopes else 0.0
