"""The peers' APIs on the same app, in process (no Ray): Hugging Face TEI's, Infinity's and
Cohere's request and reply shapes, their error bodies, and which request gets which
(docs/compatibility.md). The real client libraries run against a live app in
tests/integration/test_peer_clients.py."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from blitz import codecs
from blitz.settings.config import BlitzSettings
from tests.api_client import api_client

TEXTS = ["a small text", "another, longer text than that"]


def make_client(models: list[dict] | None = None, keys: list[str] | None = None):
    settings = BlitzSettings.from_args({
        "models": models or [{"id": "fake", "source": "fake:16",
                              "prompts": {"query": "q: ", "passage": "p: "}}],
        "limits": {"max_texts_per_request": 8, "max_top_n": 4},
        **({"auth": {"api_keys": keys}} if keys else {}),
    })
    return api_client(settings)


@pytest.fixture
async def client():
    async with make_client() as c:
        yield c


async def native(client, texts, **options) -> np.ndarray:
    r = await client.post("/embed", content=codecs.pack({"texts": texts, **options}),
                          headers={"content-type": "application/msgpack"})
    assert r.status_code == 200, r.text
    return codecs.unpack(r.content)["embeddings"]


# ---- Hugging Face TEI ------------------------------------------------------------------

async def test_tei_embed_answers_a_bare_list_of_vectors_for_a_json_body(client):
    r = await client.post("/embed", json={"inputs": TEXTS, "truncate": True})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert np.allclose(r.json(), await native(client, TEXTS), atol=1e-6)
    one = await client.post("/embed", json={"inputs": TEXTS[0]})
    assert np.asarray(one.json()).shape == (1, 16)


async def test_post_root_is_the_model_kinds_route_as_tei_serves_it(client):
    r = await client.post("/", json={"inputs": TEXTS[0]})
    assert np.allclose(r.json(), await native(client, TEXTS[:1]), atol=1e-6)
    sim = await client.post("/", json={"inputs": {"source_sentence": TEXTS[0],
                                                  "sentences": TEXTS}})
    assert sim.status_code == 200 and len(sim.json()) == 2
    assert sim.json()[0] == pytest.approx(1.0, abs=1e-5)
    assert (await client.post("/invocations", json={"inputs": "x"})).status_code == 200


async def test_get_root_and_ping_are_public_health_checks_while_post_root_takes_a_key():
    async with make_client(keys=["k1"]) as c:
        assert (await c.get("/")).status_code == 200
        assert (await c.get("/ping")).status_code == 200
        assert (await c.post("/", json={"inputs": "x"})).status_code == 401
        r = await c.post("/", json={"inputs": "x"}, headers={"authorization": "Bearer k1"})
        assert r.status_code == 200


async def test_tei_embed_takes_token_ids_like_tei(client):
    r = await client.post("/embed", json={"inputs": [[5, 6, 7], [8]]})
    assert r.status_code == 200 and np.asarray(r.json()).shape == (2, 16)


async def test_tei_errors_have_teis_body_and_name_the_field(client):
    r = await client.post("/embed", json={"inputs": TEXTS, "dimensions": 99})
    body = r.json()
    assert r.status_code == 422 and body["error_type"] == "validation"
    assert "99" in body["error"] and body["param"] == "dimensions"
    r = await client.post("/embed", json={"inputs": TEXTS, "truncation_direction": "up"})
    assert r.status_code == 422 and "right" in r.json()["error"]
    r = await client.post("/tokenize", json={"inputs": "x", "model": "nope"})
    assert r.status_code == 404 and r.json()["error_type"] == "validation"


async def test_native_requests_keep_blitz_shapes_and_errors(client):
    r = await client.post("/embed", json={"texts": TEXTS}, headers={"accept": "application/json"})
    assert r.json()["shape"] == [2, 16] and r.json()["usage"]["total_tokens"] > 0
    r = await client.post("/embed", json={"inputs": TEXTS},
                          headers={"accept": "application/msgpack"})  # msgpack: Blitz's shape
    assert codecs.unpack(r.content)["embeddings"].shape == (2, 16)
    r = await client.post("/embed", json={"texts": TEXTS, "dimensions": 99})
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}


async def test_tei_rerank_answers_index_score_and_text_best_first(client):
    r = await client.post("/rerank", json={"query": TEXTS[0], "texts": TEXTS[::-1],
                                           "return_text": True})
    ranks = r.json()
    assert [set(rank) for rank in ranks] == [{"index", "text", "score"}] * 2
    assert ranks[0]["index"] == 1 and ranks[0]["text"] == TEXTS[0]
    assert ranks[0]["score"] >= ranks[1]["score"]
    plain = await client.post("/rerank", json={"query": TEXTS[0], "texts": TEXTS})
    assert [set(rank) for rank in plain.json()] == [{"index", "score"}] * 2


# ---- Infinity --------------------------------------------------------------------------

async def test_infinity_rerank_answers_its_object_with_documents_as_strings(client):
    r = await client.post("/rerank", json={"query": TEXTS[0], "documents": TEXTS,
                                           "return_documents": True, "top_n": 1})
    body = r.json()
    assert body["object"] == "rerank" and body["model"] == "fake" and body["id"]
    assert body["results"] == [{"relevance_score": pytest.approx(1.0, abs=1e-5), "index": 0,
                                "document": TEXTS[0]}]
    assert body["usage"]["total_tokens"] > 0 and isinstance(body["created"], int)


async def test_infinity_embeddings_and_models(client):
    r = await client.post("/embeddings", json={"input": TEXTS, "model": "fake"})
    data = r.json()["data"]
    assert np.allclose([d["embedding"] for d in data], await native(client, TEXTS), atol=1e-6)
    r = await client.post("/embeddings", json={"input": TEXTS, "modality": "audio"})
    assert r.status_code == 422 and "modality" in r.json()["error"]["message"]
    r = await client.post("/embeddings", json={"input": TEXTS, "modality": "image"})
    assert r.status_code == 422 and "dual-encoder" in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "model"  # images need a CLIP-like model
    models = (await client.get("/models")).json()["data"]
    assert models[0]["id"] == "fake" and models[0]["object"] == "model"
    assert models[0]["capabilities"] == ["embed"] and models[0]["stats"] == {}


# ---- Cohere ----------------------------------------------------------------------------

async def test_cohere_v2_embed_answers_every_asked_type_from_one_call(client):
    r = await client.post("/v2/embed", json={
        "model": "fake", "texts": TEXTS, "input_type": "search_query",
        "embedding_types": ["float", "int8", "uint8", "binary", "ubinary", "base64"]})
    body = r.json()
    assert r.status_code == 200 and body["response_type"] == "embeddings_by_type"
    floats = np.asarray(body["embeddings"]["float"])
    assert np.allclose(floats, await native(client, TEXTS, prompt_name="query"), atol=1e-6)
    for kind in ("int8", "uint8", "binary", "ubinary"):
        expected = await native(client, TEXTS, prompt_name="query", dtype=kind)
        assert np.array_equal(np.asarray(body["embeddings"][kind]), expected)
    decoded = np.frombuffer(base64.b64decode(body["embeddings"]["base64"][0]), "<f4")
    assert np.allclose(decoded, floats[0], atol=1e-6)
    assert body["texts"] == TEXTS and body["meta"]["api_version"]["version"] == "2"
    assert body["meta"]["billed_units"]["input_tokens"] > 0


async def test_cohere_input_types_pick_the_models_prompts(client):
    doc = await client.post("/v2/embed", json={"texts": TEXTS, "input_type": "search_document"})
    assert np.allclose(doc.json()["embeddings"]["float"],
                       await native(client, TEXTS, prompt_name="passage"), atol=1e-6)
    plain = await client.post("/v2/embed", json={"texts": TEXTS, "input_type": "clustering"})
    assert np.allclose(plain.json()["embeddings"]["float"], await native(client, TEXTS),
                       atol=1e-6)


async def test_cohere_v1_embed_without_types_answers_bare_floats(client):
    body = (await client.post("/v1/embed", json={"texts": TEXTS})).json()
    assert body["response_type"] == "embeddings_floats"
    assert np.asarray(body["embeddings"]).shape == (2, 16)


async def test_cohere_truncate_none_refuses_and_start_is_refused_clearly():
    async with make_client([{"id": "fake", "source": "fake:16", "max_seq_length": 4}]) as c:
        r = await c.post("/v2/embed", json={"texts": ["w " * 20], "truncate": "NONE"})
        assert r.status_code == 413 and "input 0" in r.json()["message"]
        r = await c.post("/v2/embed", json={"texts": ["w"], "truncate": "START"})
        assert r.status_code == 422 and "START" in r.json()["message"]
        assert (await c.post("/v2/embed", json={"texts": ["w " * 20]})).status_code == 200


async def test_cohere_v2_rerank_and_v1_rerank_shapes(client):
    r = await client.post("/v2/rerank", json={"model": "fake", "query": TEXTS[0],
                                              "documents": TEXTS[::-1], "top_n": 2})
    body = r.json()
    assert [h["index"] for h in body["results"]] == [1, 0] and body["id"]
    assert set(body["results"][0]) == {"index", "relevance_score"}
    assert body["meta"]["api_version"]["version"] == "2"
    v1 = (await client.post("/v1/rerank", json={"query": TEXTS[0], "documents": TEXTS,
                                                 "return_documents": True})).json()
    assert v1["results"][0]["document"] == {"text": TEXTS[0]} and v1["id"]
