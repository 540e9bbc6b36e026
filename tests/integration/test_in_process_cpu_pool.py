"""``ingress.cpu_pool: in_process``: the CPU pool's models run inside the ingress replica
(one Serve hop and one process less), with the same answers, errors and routing as CPU
pool replicas of their own; the GPU pool is still called over its handle."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest

from blitz import codecs

APP = "it-inproc"
GPU_MIN_BATCH = 6
BUSY_BATCH_S = 2
TEXTS = ["The cat sat on the mat.", "Paris is the capital of France.", "Hello world"]


@pytest.fixture(scope="module")
def inproc_app(serve_instance, tiny_models):
    from ray import serve

    from deployments.app import build_app

    small = {"autoscaling_config": {"min_replicas": 1, "max_replicas": 1}}
    args = {"models": [{"id": "tiny-a", "source": str(tiny_models["tiny-a"])},
                       {"id": "tiny-b", "source": str(tiny_models["tiny-b"])},
                       {"id": "tiny-ce", "source": str(tiny_models["tiny-ce"]),
                        "kind": "cross-encoder"},
                       {"id": "busy", "source": f"fake:8:0:{BUSY_BATCH_S}"}],
            "gpu": "on", "routing": {"gpu_min_batch": GPU_MIN_BATCH,
                                     "cross_encoder_pool": "cpu"},
            "cpu_pool": {"torch_threads": 1, "workers": 2, "preload": ["tiny-a"],
                         "deployment": {"ray_actor_options": {"num_cpus": 0.1}}},
            "gpu_pool": {"torch_threads": 1, "deployment": {
                **small, "ray_actor_options": {"num_cpus": 0.1, "num_gpus": 0.25}}},
            "ingress": {"cpu_pool": "in_process",
                        "deployment": {"ray_actor_options": {"num_cpus": 0.1}}}}
    serve.run(build_app(args), name=APP, route_prefix=f"/{APP}")
    yield serve_instance + f"/{APP}"
    serve.delete(APP)


@pytest.fixture
def http(inproc_app):
    with httpx.Client(base_url=inproc_app, timeout=120) as client:
        yield client


def _embed(http: httpx.Client, texts: list[str], model: str = "tiny-a") -> httpx.Response:
    return http.post("/embed", content=codecs.pack({"texts": texts, "model": model}),
                     headers={"content-type": "application/msgpack",
                              "accept": "application/msgpack"})


def test_the_app_has_no_cpu_pool_replicas(inproc_app):
    from ray import serve

    deployments = serve.status().applications[APP].deployments
    assert set(deployments) == {"Ingress", "GPUPool", "BatchRunner"}


def test_small_requests_are_answered_in_the_ingress_with_the_pools_vectors(
        http, reference, tiny_models):
    r = _embed(http, TEXTS)
    assert r.status_code == 200, r.text
    assert r.headers["x-blitz-pool"] == "cpu"
    assert "model;dur=" in r.headers["server-timing"]
    got = codecs.unpack(r.content)["embeddings"]
    expected = reference("tiny-a", tiny_models["tiny-a"]).encode(TEXTS,
                                                                 normalize_embeddings=True)
    assert got.shape == expected.shape
    assert float((got * expected).sum(axis=1).min()) >= 0.9999


def test_large_requests_still_go_to_the_gpu_pool(http):
    texts = [f"text number {i}" for i in range(GPU_MIN_BATCH)]
    r = _embed(http, texts, model="tiny-b")
    assert r.status_code == 200, r.text
    assert r.headers["x-blitz-pool"] == "gpu"
    small = _embed(http, texts[:2], model="tiny-b")
    assert small.status_code == 200 and small.headers["x-blitz-pool"] == "cpu"
    a = codecs.unpack(r.content)["embeddings"][:2]
    b = codecs.unpack(small.content)["embeddings"]
    assert float((a * b).sum(axis=1).min()) >= 0.9999  # one model, one vector, either pool


def test_rerank_openai_and_errors_answer_as_with_pool_replicas(http):
    ranked = http.post("/rerank", json={
        "model": "tiny-ce", "query": "capital of France",
        "documents": ["Paris is the capital of France.", "Bananas are yellow."]})
    assert ranked.status_code == 200, ranked.text
    assert ranked.headers["x-blitz-pool"] == "cpu"
    assert sorted(r["index"] for r in ranked.json()["results"]) == [0, 1]

    openai = http.post("/v1/embeddings", json={"model": "tiny-b", "input": ["hello"]})
    assert openai.status_code == 200, openai.text
    assert len(openai.json()["data"][0]["embedding"]) == 48

    unknown = http.post("/embed", json={"model": "nope", "texts": ["x"]})
    assert unknown.status_code == 404 and "nope" in unknown.text
    too_long = http.post("/embed", json={"model": "tiny-a", "texts": ["word " * 5000],
                                         "truncate": False})
    assert too_long.status_code == 413, too_long.text


async def test_the_handle_api_embeds_in_the_ingress(inproc_app):
    from ray import serve

    from blitz.hop_messages import EmbedResult

    result = await serve.get_app_handle(APP).embed.remote(TEXTS, model="tiny-b")
    assert isinstance(result, EmbedResult)
    assert result.embeddings.shape == (3, 48)
    assert np.isfinite(result.embeddings).all()


async def test_callers_that_leave_do_not_stall_the_in_process_pool(inproc_app):
    """Clients that give up mid-batch (the model busy for 2 s) leave nothing behind: the
    next requests, to that model and to another, are answered."""
    async with httpx.AsyncClient(base_url=inproc_app, timeout=0.5) as impatient:
        results = await asyncio.gather(
            *(impatient.post("/embed", json={"model": "busy", "texts": [f"t{i}"]})
              for i in range(6)), return_exceptions=True)
    assert all(isinstance(r, httpx.TimeoutException) for r in results), results
    async with httpx.AsyncClient(base_url=inproc_app, timeout=60) as client:
        busy, other = await asyncio.gather(
            client.post("/embed", json={"model": "busy", "texts": ["again"]}),
            client.post("/embed", json={"model": "tiny-a", "texts": ["still here"]}))
    assert busy.status_code == 200, busy.text
    assert other.status_code == 200, other.text
