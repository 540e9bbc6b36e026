"""An LLM reranker (a tiny random Qwen3 causal LM, ``kind: llm-reranker``) through Ray
Serve: loaded in a CPU pool replica, answering ``/rerank``, Cohere's ``/v1/rerank`` and the
handle's ``rerank`` with the model card's scores, best first."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from blitz.hop_messages import RerankResult
from tests.tiny_llm_rerankers import build_tiny_qwen3_reranker, reference_scores

APP = "it-llm-rerank"
QUERY = "what is the capital of france?"
DOCUMENTS = ["the quick brown fox", "paris is the capital of france.", "yes",
             "a river, a sea and a city in france: one two three four five"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_tiny_qwen3_reranker(tmp_path_factory.mktemp("llm") / "qwen3", seed=5)


@pytest.fixture(scope="module")
def expected(folder):
    scores = reference_scores(folder, "qwen3", QUERY, DOCUMENTS)
    return sorted(enumerate(scores), key=lambda hit: -hit[1])


@pytest.fixture(scope="module")
def llm_app(serve_instance, folder):
    from ray import serve

    from deployments.app import build_app

    args = {"models": [{"id": "llm", "source": str(folder), "kind": "llm-reranker"}],
            "cpu_pool": {"torch_threads": 1, "max_batch_size": 3, "deployment": {
                "ray_actor_options": {"num_cpus": 0.1},
                "autoscaling_config": {"min_replicas": 1, "max_replicas": 1}}},
            "ingress": {"deployment": {"num_replicas": 1,
                                       "ray_actor_options": {"num_cpus": 0.1}}}}
    serve.run(build_app(args), name=APP, route_prefix=f"/{APP}")
    yield serve_instance + f"/{APP}"
    serve.delete(APP)


def same(hits, expected) -> bool:
    return ([i for i, _ in hits] == [i for i, _ in expected]
            and np.allclose([s for _, s in hits], [s for _, s in expected], atol=1e-5))


def test_rerank_routes_give_the_model_cards_scores(llm_app, expected):
    with httpx.Client(base_url=llm_app, timeout=120) as http:
        tei = http.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS})
        assert tei.status_code == 200, tei.text
        assert same([(h["index"], h["score"]) for h in tei.json()], expected)
        v1 = http.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS,
                                           "model": "llm", "top_n": 2}).json()
        assert same([(h["index"], h["relevance_score"]) for h in v1["results"]], expected[:2])


async def test_the_handles_rerank(llm_app, expected):
    from ray import serve

    ranked = await serve.get_app_handle(APP).rerank.remote(QUERY, DOCUMENTS, model="llm")
    assert isinstance(ranked, RerankResult)
    assert same([(h.index, h.relevance_score) for h in ranked.results], expected)
