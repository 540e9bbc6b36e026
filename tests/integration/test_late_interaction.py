"""Late interaction and late chunking end to end on the live app: a tiny random ColBERT in
PyLate's layout (``tiny-colbert``) and a tiny random ColQwen2 (``tiny-colqwen``) in the
config, and all-MiniLM-L6-v2 (``minilm``) late-chunking. The clients that exist for each
request shape (openai's with Jina's ``late_chunking``, voyageai's ``contextualized_embed``,
cohere's rerank, Blitz's own) and the handle get the references' vectors and MaxSim
scores (``tests.tiny_colbert``, ``tests.tiny_colvision``, the span computation of
``tests.unit.test_late_chunking``), and what cannot be served is a 4xx."""

from __future__ import annotations

import io

import httpx
import numpy as np
import pytest

from tests.error_body import error_body
from tests.tiny_colbert import maxsim, pylate_reference
from tests.tiny_colvision import colqwen2_reference, score_reference
from tests.tiny_models import minilm_dir
from tests.tiny_vision import random_images
from tests.unit.test_late_chunking import reference

DOC = ["Berlin is a city.", " It is the capital of Germany.", " Its population is large."]
TEXTS = ["the cat sat on the mat.", "paris is the capital of france", "a dog, a cat!"]
QUERY = "where is the cat?"


@pytest.fixture(scope="module")
def minilm():
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_dir()), device="cpu")


@pytest.fixture(scope="module")
def pages():
    return random_images(37, [(56, 84), (120, 90)])


def png(image) -> bytes:
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def test_openai_and_voyage_clients_late_chunk(blitz_app, minilm, voyage_session):
    import voyageai
    from openai import OpenAI

    want = reference(minilm, DOC)
    with OpenAI(base_url=blitz_app + "/v1", api_key="-", max_retries=0) as client:
        reply = client.embeddings.create(input=DOC, model="minilm",
                                         extra_body={"late_chunking": True})
        got = np.array([d.embedding for d in reply.data], np.float32)  # base64, decoded
    assert np.abs(got - want).max() < 1e-5
    vo = voyageai.Client(api_key="-", base_url=blitz_app + "/v1", max_retries=0)
    result = vo.contextualized_embed(inputs=[DOC, DOC[:2]], model="minilm",
                                     input_type="document")
    assert np.abs(np.array(result.results[0].embeddings) - want).max() < 1e-5
    assert np.abs(np.array(result.results[1].embeddings)
                  - reference(minilm, DOC[:2])).max() < 1e-5
    assert result.total_tokens > 0
    packed = vo.contextualized_embed(inputs=[DOC], model="minilm", input_type="document",
                                     output_dtype="ubinary")
    assert np.array(packed.results[0].embeddings).tolist() == np.packbits(
        want > 0, axis=1).tolist()


def test_colbert_rerank_by_maxsim_with_cohere_and_blitz_clients(blitz_app, tiny_colbert):
    import cohere

    from blitz.client import Client

    q = pylate_reference(tiny_colbert, [QUERY], True)[0]
    docs = pylate_reference(tiny_colbert, TEXTS, False)
    scores = np.array([maxsim(q, d) for d in docs])
    order = np.argsort(-scores, kind="stable").tolist()
    with httpx.Client(timeout=120) as session:
        co = cohere.ClientV2(api_key="-", base_url=blitz_app, httpx_client=session)
        reply = co.rerank(model="tiny-colbert", query=QUERY, documents=TEXTS)
    assert [r.index for r in reply.results] == order
    assert np.abs(np.array([r.relevance_score for r in reply.results])
                  - scores[order]).max() < 1e-4
    with Client(blitz_app, timeout=120) as client:
        rows = client.embed_multivector(TEXTS, model="tiny-colbert")
        for got, want in zip(rows, docs, strict=True):
            assert np.abs(np.asarray(got) - want).max() < 1e-5
        pooled = client.embed_multivector(TEXTS[:1], model="tiny-colbert", pool_factor=2)
        assert len(pooled[0]) < len(docs[0])
        one = client.embed_multivector(TEXTS, model="tiny-colbert", muvera=True,
                                       input_type="query")
        assert len({len(r) for r in one}) == 1


def test_pages_and_their_rerank(blitz_app, tiny_colqwen, pages):
    from blitz.client import Client

    want = colqwen2_reference(tiny_colqwen, None, pages)
    with Client(blitz_app, timeout=120) as client:
        rows = client.embed_multivector(images=[png(p) for p in pages], model="tiny-colqwen")
    for got, ref in zip(rows, want, strict=True):
        assert np.abs(np.asarray(got) - ref).max() < 1e-4
    with httpx.Client(base_url=blitz_app, timeout=120) as http:
        import base64

        urls = ["data:image/png;base64," + base64.b64encode(png(p)).decode() for p in pages]
        ranked = http.post("/rerank", json={"model": "tiny-colqwen", "query": QUERY,
                                            "images": urls}).json()
    scores = score_reference(colqwen2_reference(tiny_colqwen, [QUERY], None), want)[0]
    assert [r["index"] for r in ranked["results"]] == np.argsort(-scores,
                                                                 kind="stable").tolist()


async def test_the_handle_offers_the_calls(blitz_app, tiny_colbert, minilm, pages):
    from ray import serve

    handle = serve.get_app_handle("it-main")
    multi = await handle.embed_multi.remote(TEXTS, model="tiny-colbert", input_type="query",
                                            dtype="float16")
    assert [r.shape for r in multi.embeddings] == [(32, 16)] * len(TEXTS)
    assert multi.embeddings[0].dtype == np.float16
    chunks = await handle.embed_late_chunks.remote([DOC], model="minilm")
    assert np.abs(chunks.embeddings[0] - reference(minilm, DOC)).max() < 1e-5
    ranked = await handle.rerank_pages.remote(QUERY, [png(p) for p in pages],
                                              model="tiny-colqwen", top_n=1)
    assert len(ranked.results) == 1


def test_what_cannot_be_served_is_refused_and_the_app_goes_on(http):
    for url, body, status, param in (
            ("/embed_multivector", {"texts": ["a"], "model": "minilm"}, 422, "model"),
            ("/embed_multivector", {"images": ["data:,x"], "model": "tiny-colbert"}, 422,
             "images"),
            ("/embed_multivector", {"texts": ["a"], "model": "tiny-colbert",
                                    "muvera": {"k_sim": 12}}, 422, "muvera"),
            ("/v1/embeddings", {"input": ["a"], "late_chunking": True,
                                "model": "tiny-colbert"}, 422, "model"),
            ("/v1/contextualizedembeddings", {"inputs": [["a"]], "model": "tiny-ce"}, 422,
             "model")):
        reply = http.post(url, json=body)
        assert reply.status_code == status, reply.text
        assert error_body(reply).get("param") == param, reply.text
    assert http.post("/embed_multivector", json={"texts": "a", "model": "tiny-colbert"}
                     ).status_code == 200
