"""Embeddings over HTTP and through the handle equal in-process encoding."""

from __future__ import annotations

import numpy as np
import pytest

from blitz import codecs
from blitz.client import AsyncClient, Client

TEXTS = ["The quick brown fox jumps over the lazy dog.",
         "Embedding servers batch requests to use the hardware well.",
         "Où est la bibliothèque ?"]
MSGPACK = {"content-type": "application/msgpack"}


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return (a * b).sum(axis=1)


def test_msgpack_embed_equals_in_process(http, reference):
    r = http.post("/embed", content=codecs.pack({"texts": TEXTS}),
                  headers={**MSGPACK, "serve_multiplexed_model_id": "minilm"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/msgpack"
    assert r.headers["x-request-id"]
    body = codecs.unpack(r.content)
    emb = body["embeddings"]
    assert emb.dtype == np.float32 and emb.shape == (3, 384)
    assert body["model"] == "minilm" and body["usage"]["prompt_tokens"] > 0
    expected = reference("minilm").encode(TEXTS, normalize_embeddings=True)
    assert cosines(emb, expected).min() >= 0.9999


def test_json_and_raw_replies_equal_in_process(http, reference):
    expected = reference("minilm").encode(TEXTS, normalize_embeddings=True)
    r = http.post("/embed", json={"texts": TEXTS, "model": "minilm"},
                  headers={"accept": "application/json"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert cosines(np.array(r.json()["embeddings"], dtype=np.float32), expected).min() >= 0.9999

    r = http.post("/embed", json={"texts": TEXTS}, headers={"accept": "application/octet-stream"})
    assert r.status_code == 200
    assert r.headers["x-blitz-shape"] == "3,384" and r.headers["x-blitz-dtype"] == "float32"
    raw = np.frombuffer(r.content, dtype="<f4").reshape(3, 384)
    assert cosines(raw, expected).min() >= 0.9999


def test_model_from_body_and_default(http, reference, tiny_models):
    expected = reference("tiny-a", tiny_models["tiny-a"]).encode(TEXTS[:1])
    r = http.post("/embed", content=codecs.pack({"texts": TEXTS[:1], "model": "tiny-a"}),
                  headers=MSGPACK)
    assert r.status_code == 200, r.text
    assert codecs.unpack(r.content)["embeddings"].shape == (1, 32)
    assert cosines(codecs.unpack(r.content)["embeddings"], expected).min() >= 0.9999
    r = http.post("/embed", content=codecs.pack({"texts": "one text"}), headers=MSGPACK)
    assert codecs.unpack(r.content)["model"] == "minilm"


def test_python_client(blitz_app, reference):
    with Client(blitz_app) as client:
        emb = client.embed(TEXTS, model="minilm")
        assert not emb.flags.writeable  # a view on the reply bytes, not a copy
        expected = reference("minilm").encode(TEXTS, normalize_embeddings=True)
        assert cosines(emb, expected).min() >= 0.9999
        assert {m["id"] for m in client.models()} >= {"minilm", "tiny-a", "tiny-ce"}


async def test_async_client(blitz_app):
    async with AsyncClient(blitz_app) as client:
        emb = await client.embed(["hello"], model="tiny-b")
        assert emb.shape == (1, 48)
        ranked = await client.rerank("capital of France",
                                     ["Paris is the capital of France.", "Bananas are yellow."],
                                     model="minilm")
        assert ranked["results"][0]["index"] == 0


async def test_handle_api_equals_in_process(blitz_app, reference):
    from ray import serve

    from blitz.hop_messages import EmbedResult, RerankResult

    handle = serve.get_app_handle("it-main")
    result = await handle.embed.remote(TEXTS, model="minilm")
    assert isinstance(result, EmbedResult)
    assert result.embeddings.shape == (3, 384) and result.usage.prompt_tokens > 0
    expected = reference("minilm").encode(TEXTS, normalize_embeddings=True)
    assert cosines(result.embeddings, expected).min() >= 0.9999

    ranked = await handle.rerank.remote(
        "Where is the Eiffel tower?",
        ["Bananas are rich in potassium.", "The Eiffel tower stands in Paris."],
        model="minilm")
    assert isinstance(ranked, RerankResult)
    assert ranked.results[0].index == 1


async def test_handle_api_takes_the_native_options_by_name(blitz_app):
    from ray import serve

    handle = serve.get_app_handle("it-main")
    result = await handle.embed.remote(TEXTS, model="minilm", dimensions=64, dtype="float16",
                                       prompt_name="query")
    assert result.embeddings.shape == (3, 64) and result.embeddings.dtype == np.float16
    ranked = await handle.rerank.remote("fox", TEXTS, model="minilm", top_n=1,
                                        return_documents=True)
    assert len(ranked.results) == 1 and ranked.results[0].document in TEXTS
    with pytest.raises(TypeError, match="normalise"):
        await handle.embed.remote(TEXTS, model="minilm", normalise=False)
    with pytest.raises(TypeError, match="top_k"):
        await handle.rerank.remote("fox", TEXTS, top_k=1)


def test_an_over_long_document_a_pool_raised_is_413_at_its_request_index(http):
    documents = ["short"] * 16 + ["word " * 2000]  # 17 documents: the last opens chunk two
    r = http.post("/rerank", json={"query": "q", "documents": documents, "model": "tiny-ce",
                                   "truncate": False})
    assert r.status_code == 413, r.text
    assert r.json()["error"]["code"] == "input_too_long"
    assert "input 16" in r.json()["error"]["message"]


def test_a_wrong_method_is_405_naming_the_allowed_ones(http):
    r = http.get("/embed")
    assert r.status_code == 405, r.text
    assert r.headers["allow"] == "POST" and r.headers["x-request-id"]
    assert r.json()["error"]["code"] == "method_not_allowed"
    r = http.delete("/models")
    assert r.status_code == 405 and set(r.headers["allow"].split(", ")) == {"GET", "HEAD"}


def test_prompt_name_prefixes_text(http, reference):
    r = http.post("/embed", json={"texts": ["what is a fox"], "prompt_name": "query"},
                  headers={"accept": "application/json"})
    assert r.status_code == 200, r.text
    expected = reference("minilm").encode(["query: what is a fox"], normalize_embeddings=True)
    assert cosines(np.array(r.json()["embeddings"], np.float32), expected).min() >= 0.9999


@pytest.mark.parametrize("route", ["/health", "/ready"])
def test_health_routes(http, route):
    r = http.get(route)
    assert r.status_code == 200, r.text


def test_models_route(http):
    r = http.get("/models")
    assert r.status_code == 200
    models = {m["id"]: m for m in r.json()["data"]}
    assert models["minilm"]["dimension"] == 384 and models["minilm"]["kind"] == "embedding"
    assert models["tiny-ce"]["kind"] == "cross-encoder"


def test_int8_model_is_served_close_to_fp32(http):
    texts = ["How do I reset my password?", "The weather in Lisbon is mild in winter.",
             "Quarterly revenue grew by twelve percent compared with last year.",
             "Embeddings map sentences to vectors that capture their meaning."]
    replies = {}
    for model in ("minilm", "minilm-int8"):
        r = http.post("/embed", content=codecs.pack({"texts": texts}),
                      headers={"content-type": "application/msgpack",
                               "serve_multiplexed_model_id": model})
        assert r.status_code == 200, r.text
        replies[model] = codecs.unpack(r.content)["embeddings"]
    assert replies["minilm-int8"].shape == (4, 384)
    assert cosines(replies["minilm-int8"], replies["minilm"]).min() >= 0.98
