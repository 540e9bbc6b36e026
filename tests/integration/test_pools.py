"""Routing between the pools, chunking, and LRU eviction of multiplexed models."""

from __future__ import annotations

import numpy as np

from blitz import codecs, timing
from tests.integration.conftest import APP, CPU_BATCH, CPU_WORKERS, GPU_BATCH

MSGPACK = {"content-type": "application/msgpack"}


def _embed(http, texts, model):
    r = http.post("/embed", content=codecs.pack({"texts": texts, "model": model}),
                  headers=MSGPACK)
    assert r.status_code == 200, r.text
    return r, codecs.unpack(r.content)["embeddings"]


def test_small_batches_go_to_cpu_and_large_to_gpu(http):
    r, emb = _embed(http, ["a short one"] * 3, "tiny-a")
    assert r.headers["x-blitz-pool"] == "cpu" and emb.shape == (3, 32)
    r, emb = _embed(http, [f"text number {i}" for i in range(12)], "tiny-a")
    assert r.headers["x-blitz-pool"] == "gpu" and emb.shape == (12, 32)


def test_cross_encoder_rerank_goes_to_gpu(http):
    r = http.post("/rerank", json={"query": "q", "documents": ["a", "b"], "model": "tiny-ce"})
    assert r.status_code == 200, r.text
    assert r.headers["x-blitz-pool"] == "gpu"
    results = r.json()["results"]
    assert sorted(x["index"] for x in results) == [0, 1]
    scores = [x["relevance_score"] for x in results]
    assert scores == sorted(scores, reverse=True)


async def test_pools_run_on_their_devices(blitz_app):
    from ray import serve

    from blitz.loading.load import resolve_device

    cpu = await serve.get_deployment_handle("CPUPool", APP).stats.remote()
    gpu = await serve.get_deployment_handle("GPUPool", APP).stats.remote()
    assert (cpu["pool"], cpu["device"]) == ("cpu", "cpu")
    # CUDA where this host has it (the session's Ray has one GPU for the GPU pool), else CPU
    assert (gpu["pool"], gpu["device"]) == ("gpu", resolve_device("cuda"))


def test_requests_larger_than_the_batch_limit_come_back_in_order(http, reference, tiny_models):
    model = reference("tiny-a", tiny_models["tiny-a"])
    for n in (CPU_BATCH + 1, 3 * GPU_BATCH + 5):  # chunked on the CPU pool, then the GPU pool
        texts = [f"sentence {i} about topic {i * 7 % 13}" for i in range(n)]
        _, emb = _embed(http, texts, "tiny-a")
        expected = model.encode(texts, normalize_embeddings=True)
        assert emb.shape == expected.shape
        assert np.allclose(emb, expected, atol=1e-4)  # row i is text i


async def test_fourth_model_evicts_the_least_recently_used(http):
    from ray import serve

    pool = serve.get_deployment_handle("CPUPool", APP)
    for model in ("tiny-a", "tiny-b", "tiny-c"):
        _embed(http, ["load me"], model)
    _embed(http, ["touch a again"], "tiny-a")  # now tiny-b is the least recently used
    before = await pool.stats.remote()
    assert sorted(before["loaded"]) == ["tiny-a", "tiny-b", "tiny-c"]

    _embed(http, ["a fourth model"], "minilm")
    after = await pool.stats.remote()
    assert sorted(after["loaded"]) == ["minilm", "tiny-a", "tiny-c"]
    assert after["evicted"][-1] == "tiny-b"
    _, emb = _embed(http, ["back again"], "tiny-b")  # an evicted model loads again
    assert emb.shape == (1, 48)


async def test_concurrent_small_requests_are_answered_each_with_its_own_rows(
        blitz_app, reference, tiny_models):
    import asyncio

    import httpx

    model = reference("tiny-a", tiny_models["tiny-a"])
    texts = [f"concurrent request number {i}" for i in range(24)]
    async with httpx.AsyncClient(base_url=blitz_app, timeout=120) as client:
        async def one(i):
            body = {"texts": [texts[i]], "model": "tiny-a", "truncate": False}
            if i == 5:  # one bad request among them fails alone
                body["texts"] = ["word " * 400]
            return await client.post("/embed", content=codecs.pack(body), headers=MSGPACK)

        replies = await asyncio.gather(*(one(i) for i in range(len(texts))))
    assert replies[5].status_code == 413 and "input 0" in replies[5].json()["error"]["message"]
    expected = model.encode(texts, normalize_embeddings=True)
    for i, r in enumerate(replies):
        if i != 5:
            assert r.status_code == 200, r.text
            assert np.allclose(codecs.unpack(r.content)["embeddings"][0], expected[i], atol=1e-4)


async def test_every_job_kind_shares_one_queue_and_gets_its_own_answer(
        blitz_app, reference, tiny_models):
    """Texts, token ids and reranks for one model, sent at once: they share the ingress's
    and the pool's queues (and batches), and each gets what it gets alone."""
    import asyncio

    import httpx

    model = reference("tiny-a", tiny_models["tiny-a"])
    texts = [f"mixed job number {i} about rivers" for i in range(12)]
    ids = model.tokenizer(texts, add_special_tokens=False)["input_ids"]
    expected = model.encode(texts, normalize_embeddings=True)
    async with httpx.AsyncClient(base_url=blitz_app, timeout=120) as client:
        async def one(i):
            if i % 3 == 0:
                body = {"texts": [texts[i]], "model": "tiny-a"}
                return await client.post("/embed", content=codecs.pack(body), headers=MSGPACK)
            if i % 3 == 1:
                return await client.post("/v1/embeddings", json={
                    "model": "tiny-a", "input": [ids[i]], "encoding_format": "float"})
            return await client.post("/rerank", json={
                "model": "tiny-a", "query": texts[i], "documents": texts[:4]})

        replies = await asyncio.gather(*(one(i) for i in range(len(texts))))
    for i, r in enumerate(replies):
        assert r.status_code == 200, r.text
        if i % 3 == 0:
            got = codecs.unpack(r.content)["embeddings"][0]
        elif i % 3 == 1:
            got = np.array(r.json()["data"][0]["embedding"], np.float32)
        else:
            scores = {hit["index"]: hit["relevance_score"] for hit in r.json()["results"]}
            got = [scores[k] for k in range(4)]
            assert np.allclose(got, expected[:4] @ expected[i], atol=1e-4), i
            continue
        assert np.allclose(got, expected[i], atol=1e-4), i


async def test_a_pool_replica_runs_as_many_model_calls_at_once_as_it_has_workers(blitz_app):
    """``workers: 2``: two requests for one model, each its own pool call, run their
    batches side by side on the replica (a batch of the fake model "busy" holds a worker
    thread 3 s), and a third waits for a free worker."""
    import asyncio

    import httpx
    from ray import serve

    pool = serve.get_deployment_handle("CPUPool", APP)
    most = 0
    async with httpx.AsyncClient(base_url=blitz_app, timeout=120) as client:
        async def one(i):
            body = {"texts": [f"busy request {i}"], "model": "busy"}
            return await client.post("/embed", content=codecs.pack(body), headers=MSGPACK)

        requests = [asyncio.ensure_future(one(i)) for i in range(CPU_WORKERS + 1)]
        while not all(r.done() for r in requests):
            running = (await pool.stats.remote())["running_batches"].get("busy", 0)
            assert running <= CPU_WORKERS
            most = max(most, running)
            await asyncio.sleep(0.1)
        replies = await asyncio.gather(*requests)
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
    assert most == CPU_WORKERS
    assert (await pool.stats.remote())["workers"] == CPU_WORKERS


def test_replies_say_where_their_time_went_through_the_real_hops(http):
    """Every hop's stamp crosses Serve's handle (plain pickle both ways) into the header."""
    for texts, pool in ((["a short one"], "cpu"), ([f"text {i}" for i in range(12)], "gpu")):
        r, _ = _embed(http, texts, "tiny-a")
        hops = timing.parse_header(r.headers["server-timing"])
        assert r.headers["x-blitz-pool"] == pool
        # every hop measured, in order (no vector cache in this app: no cache entry)
        assert list(hops) == [e for e in timing.ENTRIES if e != "cache"], hops
        assert hops["model"] > 0 and hops["total"] >= hops["model"]
        inside = sum(hops[k] for k in ("ingress", "ingress-queue", "handle", "pool-queue",
                                       "worker-wait", "model", "pool-other"))
        assert abs(inside - hops["total"]) < 0.05 * hops["total"] + 0.05  # they add up
