"""The peers' own client libraries, unchanged but for the base URL, against the live app:
Hugging Face's ``InferenceClient`` (TEI's documented client), llama-index's TEI embedding
class, the ``cohere`` SDK (v2 and v1 clients) and Infinity's generated client. Each call's
answer equals the reference computation in process. (The ``openai`` SDK:
test_openai_compat.py; ``text_classification``: test_more_routes.py, whose app has a
classifier. The table of client x call x test: docs/compatibility.md.)"""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest

from tests.integration.test_embed_http import cosines

TEXTS = ["A man is eating food.", "A monkey is playing drums.", "Vectors power search."]
QUERY = "What is the man eating?"


@pytest.fixture(scope="module")
def cross_encoder(tiny_models):
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(tiny_models["tiny-ce"]), device="cpu")


@pytest.fixture
def http_session():
    """An HTTP session handed to a client that takes one, closed after the test."""
    with httpx.Client(timeout=60) as session:
        yield session


def scores_of(cross_encoder, query: str, documents: list[str]) -> np.ndarray:
    return np.asarray(cross_encoder.predict([(query, d) for d in documents]), np.float32)


# ---- Hugging Face TEI's clients ---------------------------------------------------------

def test_huggingface_inference_client_feature_extraction(blitz_app, reference,
                                                         hub_client_online):
    from huggingface_hub import InferenceClient

    client = InferenceClient(model=blitz_app, timeout=60)
    got = client.feature_extraction(TEXTS[0])
    expected = reference("minilm").encode([TEXTS[0]], normalize_embeddings=True)
    assert got.shape == (1, 384) and cosines(got, expected).min() >= 0.9999
    long = client.feature_extraction(TEXTS[1] * 100, normalize=True, truncate=True)
    assert long.shape == (1, 384)  # cut at max_seq_length, as truncate asks


def test_huggingface_inference_client_sentence_similarity(blitz_app, reference,
                                                          hub_client_online):
    from huggingface_hub import InferenceClient

    got = InferenceClient(model=blitz_app, timeout=60).sentence_similarity(QUERY, TEXTS)
    vectors = reference("minilm").encode([QUERY, *TEXTS], normalize_embeddings=True)
    assert np.allclose(got, vectors[1:] @ vectors[0], atol=1e-4)


def test_huggingface_inference_client_sees_teis_error_message(blitz_app, hub_client_online):
    from huggingface_hub import InferenceClient
    from huggingface_hub.errors import HfHubHTTPError

    client = InferenceClient(model=blitz_app, timeout=60,
                             headers={"serve_multiplexed_model_id": "no-such-model"})
    with pytest.raises(HfHubHTTPError) as info:
        client.feature_extraction("x")
    assert "no-such-model" in str(info.value)


def test_llama_index_tei_embedding_sync_and_async(blitz_app, reference):
    from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference

    model = TextEmbeddingsInference(model_name="minilm", base_url=blitz_app, timeout=60,
                                    embed_batch_size=2)
    expected = reference("minilm").encode([QUERY, *TEXTS], normalize_embeddings=True)
    assert cosines(np.asarray([model.get_query_embedding(QUERY)]), expected[:1]).min() >= 0.9999
    batch = np.asarray(model.get_text_embedding_batch(TEXTS))
    assert cosines(batch, expected[1:]).min() >= 0.9999
    again = np.asarray(asyncio.run(model.aget_text_embedding(TEXTS[2])))
    assert cosines(again[None], expected[3:]).min() >= 0.9999


def test_tei_rerank_shape_over_http(http, cross_encoder):
    ranks = http.post("/rerank", json={"query": QUERY, "texts": TEXTS, "return_text": True,
                                       "model": "tiny-ce"}).json()
    expected = scores_of(cross_encoder, QUERY, TEXTS)
    assert [r["index"] for r in ranks] == list(np.argsort(-expected, kind="stable"))
    assert np.allclose([r["score"] for r in ranks], np.sort(expected)[::-1], atol=1e-5)
    assert [r["text"] for r in ranks] == [TEXTS[r["index"]] for r in ranks]


# ---- Cohere's SDK ----------------------------------------------------------------------

def test_cohere_v2_client_embed_every_type_and_rerank(blitz_app, reference, cross_encoder,
                                                      http_session):
    import cohere

    client = cohere.ClientV2(api_key="unused-here", base_url=blitz_app,
                             httpx_client=http_session)
    reply = client.embed(texts=TEXTS, model="minilm", input_type="search_document",
                         embedding_types=["float", "int8", "ubinary"])
    floats = np.asarray(reply.embeddings.float_, np.float32)
    expected = reference("minilm").encode(TEXTS, normalize_embeddings=True)
    assert cosines(floats, expected).min() >= 0.9999
    assert np.abs(np.asarray(reply.embeddings.int8) - np.round(expected * 127)).max() <= 1
    assert np.asarray(reply.embeddings.ubinary).shape == (3, 48)
    assert reply.meta.billed_units.input_tokens > 0

    ranked = client.rerank(model="tiny-ce", query=QUERY, documents=TEXTS, top_n=2)
    scores = scores_of(cross_encoder, QUERY, TEXTS)
    assert [r.index for r in ranked.results] == list(np.argsort(-scores, kind="stable")[:2])
    assert np.allclose([r.relevance_score for r in ranked.results],
                       np.sort(scores)[::-1][:2], atol=1e-5)


def test_cohere_v1_client_embed_and_rerank(blitz_app, reference, http_session):
    import cohere

    client = cohere.Client(api_key="unused-here", base_url=blitz_app, httpx_client=http_session)
    reply = client.embed(texts=TEXTS, model="minilm", input_type="search_query")
    # search_query picks the model's "query" prompt (the app's config: "query: ")
    expected = reference("minilm").encode(["query: " + t for t in TEXTS],
                                          normalize_embeddings=True)
    assert cosines(np.asarray(reply.embeddings, np.float32), expected).min() >= 0.9999
    ranked = client.rerank(model="minilm", query=TEXTS[1], documents=TEXTS,
                           return_documents=True)
    assert ranked.results[0].index == 1 and ranked.results[0].document.text == TEXTS[1]


def test_cohere_sdk_raises_its_own_error_with_blitzs_message(blitz_app, http_session):
    import cohere
    from cohere.core.api_error import ApiError

    client = cohere.ClientV2(api_key="unused-here", base_url=blitz_app,
                             httpx_client=http_session)
    with pytest.raises(ApiError) as info:
        client.embed(texts=["x"], model="no-such-model", input_type="search_query",
                     embedding_types=["float"])
    assert info.value.status_code == 404 and "no-such-model" in str(info.value.body)


# ---- Infinity's client -----------------------------------------------------------------

@pytest.fixture
def infinity(blitz_app):
    from infinity_client import Client

    with Client(base_url=blitz_app, timeout=60, raise_on_unexpected_status=True) as client:
        yield client


def test_infinity_client_embeddings_rerank_and_models(infinity, reference, cross_encoder):
    from infinity_client.api.default import embeddings, models, rerank
    from infinity_client.models import OpenAIEmbeddingInputText, RerankInput

    reply = embeddings.sync(client=infinity,
                            body=OpenAIEmbeddingInputText(input_=TEXTS, model="minilm"))
    got = np.asarray([d.embedding for d in reply.data], np.float32)
    expected = reference("minilm").encode(TEXTS, normalize_embeddings=True)
    assert cosines(got, expected).min() >= 0.9999

    ranked = rerank.sync(client=infinity, body=RerankInput(
        query=QUERY, documents=TEXTS, model="tiny-ce", return_documents=True))
    scores = scores_of(cross_encoder, QUERY, TEXTS)
    best = int(np.argmax(scores))
    assert ranked.results[0].index == best and ranked.results[0].document == TEXTS[best]
    assert np.isclose(ranked.results[0].relevance_score, scores.max(), atol=1e-5)

    listed = models.sync(client=infinity)
    assert {"minilm", "tiny-ce"} <= {m.id for m in listed.data}
