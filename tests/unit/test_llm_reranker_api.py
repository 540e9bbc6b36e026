"""An LLM reranker (a tiny random Qwen3 causal LM) served in process (no Ray): every
``/rerank`` shape (Blitz's msgpack, Infinity's ``documents``, TEI's ``texts``, Cohere's v1
and v2, TEI's ``POST /``), gRPC ``Rerank`` and the service call behind the handle's
``rerank`` give the model card's scores, best first; ``raw_scores`` is refused as for a
cross-encoder; ``/info`` and ``/models`` call it a reranker."""

from __future__ import annotations

import numpy as np
import pytest

from blitz import codecs
from blitz.grpc_api import tei_pb2 as pb
from blitz.ingress.service import EmbeddingService
from blitz.pool.dispatcher import ReplicaDispatcher
from blitz.settings.config import BlitzSettings
from tests.api_client import api_client, tei_servicer
from tests.tiny_llm_rerankers import build_tiny_qwen3_reranker, reference_scores
from tests.unit.test_grpc_api import call, served

QUERY = "what is the capital of france?"
DOCUMENTS = ["the quick brown fox", "paris is the capital of france.", "yes",
             "a river, a sea and a city in france: one two three four five"]
HEADER = "serve_multiplexed_model_id"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_tiny_qwen3_reranker(tmp_path_factory.mktemp("llm-api") / "qwen3", seed=5)


@pytest.fixture(scope="module")
def expected(folder):
    """The model card's scores as (index, score), best first."""
    scores = reference_scores(folder, "qwen3", QUERY, DOCUMENTS)
    return sorted(enumerate(scores), key=lambda hit: -hit[1])


def make_service(folder) -> EmbeddingService:
    settings = BlitzSettings.from_args({
        "models": [{"id": "emb", "source": "fake:8"},
                   {"id": "llm", "source": str(folder), "kind": "llm-reranker",
                    "reranker_style": "qwen3"}],
        "cpu_pool": {"max_batch_size": 3}})  # four documents: two pool calls
    return EmbeddingService(settings, ReplicaDispatcher(settings))


@pytest.fixture
async def client(folder):
    async with api_client(make_service(folder)) as c:
        yield c


def same(hits: list[tuple[int, float]], expected: list[tuple[int, float]]) -> bool:
    return ([i for i, _ in hits] == [i for i, _ in expected]
            and np.allclose([s for _, s in hits], [s for _, s in expected], atol=1e-5))


async def test_blitz_msgpack_rerank_gives_the_model_cards_scores(client, expected):
    r = await client.post("/rerank", content=codecs.pack({"query": QUERY, "documents": DOCUMENTS,
                                                          "model": "llm"}),
                          headers={"content-type": "application/msgpack",
                                   "accept": "application/msgpack"})
    assert r.status_code == 200, r.text
    body = codecs.unpack(r.content)
    assert body["model"] == "llm" and body["usage"]["total_tokens"] > 0
    assert same([(h["index"], h["relevance_score"]) for h in body["results"]], expected)


async def test_infinitys_documents_and_teis_texts(client, expected):
    r = await client.post("/rerank", json={"query": QUERY, "documents": DOCUMENTS,
                                           "model": "llm", "return_documents": True})
    body = r.json()
    assert body["object"] == "rerank"
    assert same([(h["index"], h["relevance_score"]) for h in body["results"]], expected)
    assert [h["document"] for h in body["results"]] == [DOCUMENTS[i] for i, _ in expected]
    r = await client.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS,
                                           "return_text": True}, headers={HEADER: "llm"})
    ranks = r.json()
    assert same([(h["index"], h["score"]) for h in ranks], expected)
    assert ranks[0]["text"] == DOCUMENTS[expected[0][0]]


async def test_cohere_v1_and_v2_shapes_with_top_n(client, expected):
    v1 = (await client.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS,
                                                "model": "llm", "top_n": 2})).json()
    assert same([(h["index"], h["relevance_score"]) for h in v1["results"]], expected[:2])
    v2 = (await client.post("/v2/rerank", json={
        "model": "llm", "query": QUERY, "documents": [{"text": d} for d in DOCUMENTS]})).json()
    assert same([(h["index"], h["relevance_score"]) for h in v2["results"]], expected)


async def test_teis_root_route_reranks_for_an_llm_reranker(client, expected):
    r = await client.post("/", json={"query": QUERY, "texts": DOCUMENTS},
                          headers={HEADER: "llm"})
    assert r.status_code == 200, r.text
    assert same([(h["index"], h["score"]) for h in r.json()], expected)


async def test_raw_scores_are_refused_as_for_a_cross_encoder(client):
    r = await client.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS,
                                           "raw_scores": True}, headers={HEADER: "llm"})
    assert r.status_code == 422 and "raw_scores" in r.text


async def test_an_llm_reranker_cannot_embed(client):
    r = await client.post("/embed", json={"texts": ["a"], "model": "llm"})
    assert r.status_code == 422 and "/rerank" in r.text


async def test_info_and_models_call_it_a_reranker(client):
    info = (await client.get("/info", headers={HEADER: "llm"})).json()
    assert info["model_type"] == {"reranker": {}}
    listed = (await client.get("/models")).json()["data"]
    entry = next(m for m in listed if m["id"] == "llm")
    assert entry["kind"] == "llm-reranker" and entry["capabilities"] == ["rerank"]


async def test_the_handles_rerank_is_the_services(folder, expected):
    result = await make_service(folder).rerank(QUERY, DOCUMENTS, model="llm", top_n=3,
                                               return_documents=True)
    assert same([(h.index, h.relevance_score) for h in result.results], expected[:3])
    assert result.results[0].document == DOCUMENTS[expected[0][0]]


async def test_grpc_rerank_gives_the_model_cards_scores(folder, expected):
    service = make_service(folder)
    tei = tei_servicer(service)
    async with served(tei) as channel:
        reply = await call(channel, "Rerank")(
            pb.RerankRequest(query=QUERY, texts=DOCUMENTS, return_text=True, truncate=True),
            metadata=(("model", "llm"),))
        assert same([(r.index, r.score) for r in reply.ranks], expected)
        assert reply.ranks[0].text == DOCUMENTS[expected[0][0]]
        info = await call(channel, "Info")(pb.InfoRequest(), metadata=(("model", "llm"),))
        assert info.model_type == pb.MODEL_TYPE_RERANKER
