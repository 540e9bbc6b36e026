"""The official `openai` package works unchanged against Blitz; rerank in Cohere's shape."""

from __future__ import annotations

import numpy as np
import pytest
from openai import OpenAI

from tests.integration.test_embed_http import cosines

TEXTS = ["A man is eating food.", "A monkey is playing drums.", "Vectors power search."]


@pytest.fixture
def openai_client(blitz_app):
    return OpenAI(base_url=blitz_app + "/v1", api_key="not-checked-here", max_retries=0)


@pytest.mark.parametrize("encoding_format", [None, "float"])  # None: the client's base64
@pytest.mark.parametrize("batched", [False, True])
def test_embeddings_create_equals_in_process(openai_client, reference, encoding_format,
                                             batched):
    kwargs = {"encoding_format": encoding_format} if encoding_format else {}
    texts = TEXTS if batched else TEXTS[0]
    reply = openai_client.embeddings.create(model="minilm", input=texts, **kwargs)
    got = np.array([d.embedding for d in reply.data], dtype=np.float32)
    expected = reference("minilm").encode(TEXTS if batched else [TEXTS[0]],
                                          normalize_embeddings=True)
    assert [d.index for d in reply.data] == list(range(len(expected)))
    assert reply.model == "minilm" and reply.usage.prompt_tokens > 0
    assert cosines(got, expected).min() >= 0.9999


def test_embeddings_create_with_dimensions(openai_client, reference):
    reply = openai_client.embeddings.create(model="minilm", input=TEXTS, dimensions=128)
    got = np.array([d.embedding for d in reply.data], dtype=np.float32)
    assert got.shape == (3, 128)
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    full = reference("minilm").encode(TEXTS, normalize_embeddings=True)[:, :128]
    assert cosines(got, full).min() >= 0.9999


def test_token_id_input(openai_client, reference):
    tokenizer = reference("minilm").tokenizer
    ids = tokenizer(TEXTS, add_special_tokens=False)["input_ids"]
    reply = openai_client.embeddings.create(model="minilm", input=ids, encoding_format="float")
    got = np.array([d.embedding for d in reply.data], dtype=np.float32)
    expected = reference("minilm").encode(TEXTS, normalize_embeddings=True)
    assert cosines(got, expected).min() >= 0.9999


def test_unknown_model_raises_not_found_in_the_openai_client(openai_client):
    import openai

    with pytest.raises(openai.NotFoundError) as info:
        openai_client.embeddings.create(model="gpt-nope", input="x")
    assert "gpt-nope" in str(info.value)


def test_v1_models_list(http):
    body = http.get("/v1/models").json()
    assert body["object"] == "list"
    ids = {m["id"] for m in body["data"]}
    assert {"minilm", "tiny-ce"} <= ids
    assert all(m["object"] == "model" and m["owned_by"] for m in body["data"])


def test_v1_rerank_ranks_relevant_document_first(http):
    documents = ["The stock market fell today.", "Paris is the capital of France.",
                 "Bananas are rich in potassium."]
    r = http.post("/v1/rerank", json={"model": "minilm", "query": "What is France's capital?",
                                      "documents": documents, "top_n": 2,
                                      "return_documents": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "minilm" and len(body["results"]) == 2
    assert body["results"][0]["index"] == 1
    assert body["results"][0]["document"]["text"] == documents[1]
    assert body["usage"]["total_tokens"] > 0
