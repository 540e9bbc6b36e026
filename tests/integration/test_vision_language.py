"""Vision-language models end to end on the live app: a tiny random Qwen3-VL in the config
serves as an embedder (``tiny-vl``) and a reranker (``tiny-vl-rerank``); the clients that
exist for each request shape (openai's, cohere's, voyageai's, Blitz's own) and the handle
get the model card's vectors and scores (``tests.tiny_vl``), and a bad part is a 4xx."""

from __future__ import annotations

import base64
import io

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.error_body import error_body
from tests.tiny_vision import random_images
from tests.tiny_vl import reference_embedding, reference_qwen3vl_rerank

CAPTION = "a red cat"


def png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def files() -> list[bytes]:
    return [png(p) for p in random_images(31, [(40, 28), (96, 64), (64, 64)])]


@pytest.fixture
def http_session():
    """An HTTP session handed to the clients that take one, closed after the test."""
    with httpx.Client(timeout=120) as session:
        yield session


def decoded(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")


def cosine(a, b) -> float:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_openai_cohere_and_voyage_clients_get_the_model_card_vectors(
        blitz_app, tiny_vl, files, http_session, voyage_session):
    import cohere
    import voyageai
    from openai import OpenAI
    from openai.types import CreateEmbeddingResponse

    want = reference_embedding(tiny_vl, [CAPTION, decoded(files[0])])
    url = data_url(files[0])
    with OpenAI(base_url=blitz_app + "/v1", api_key="-", max_retries=0) as client:
        # vLLM's documented way: the chat embeddings body posted whole
        reply = client.post("/embeddings", cast_to=CreateEmbeddingResponse, body={
            "model": "tiny-vl", "messages": [{"role": "user", "content": [
                {"type": "text", "text": CAPTION},
                {"type": "image_url", "image_url": {"url": url}}]}]})
        assert cosine(reply.data[0].embedding, want) >= 0.9999
        # and through embeddings.create, which sends input "" and base64 beside it
        reply = client.embeddings.create(input="", model="tiny-vl", extra_body={
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": CAPTION},
                {"type": "image_url", "image_url": {"url": url}}]}]})
        assert cosine(reply.data[0].embedding, want) >= 0.9999
    co = cohere.ClientV2(api_key="-", base_url=blitz_app, httpx_client=http_session)
    reply = co.embed(model="tiny-vl", input_type="search_document", embedding_types=["float"],
                     inputs=[{"content": [{"type": "text", "text": CAPTION},
                                          {"type": "image_url", "image_url": {"url": url}}]}])
    assert cosine(reply.embeddings.float_[0], want) >= 0.9999
    reply = co.embed(model="tiny-vl", input_type="image", embedding_types=["float"],
                     images=[url])
    assert cosine(reply.embeddings.float_[0],
                  reference_embedding(tiny_vl, [decoded(files[0])])) >= 0.9999
    vo = voyageai.Client(api_key="-", base_url=blitz_app + "/v1", max_retries=0)
    picture = decoded(files[1])  # sent as lossless WEBP: the same pixels
    result = vo.multimodal_embed([[CAPTION, picture]], model="tiny-vl", input_type="query")
    want_query = reference_embedding(tiny_vl, [CAPTION, picture],
                                     instruction="Find the picture")
    assert cosine(result.embeddings[0], want_query) >= 0.9999
    assert result.image_pixels == picture.size[0] * picture.size[1]
    assert 0 < result.text_tokens < result.total_tokens


def test_blitz_client_and_rerank_routes(blitz_app, tiny_vl, files, http_session):
    import cohere

    from blitz.client import Client

    docs = [[CAPTION], [decoded(files[0])], ["a dog", decoded(files[1])]]
    want = np.stack([reference_embedding(tiny_vl, d) for d in docs])
    sent = [[CAPTION], [{"image": files[0]}], ["a dog", {"image": files[1]}]]
    with Client(blitz_app, timeout=120) as client:
        got = client.embed_parts(sent, model="tiny-vl")
        assert min(cosine(g, w) for g, w in zip(got, want, strict=True)) >= 0.9999
        ranked = client.rerank_parts("paris", sent, model="tiny-vl-rerank")
    scores = [reference_qwen3vl_rerank(tiny_vl, ["paris"], d, images_first=False) for d in docs]
    order = list(np.argsort(-np.asarray(scores), kind="stable"))
    assert [h["index"] for h in ranked["results"]] == order
    np.testing.assert_allclose([h["relevance_score"] for h in ranked["results"]],
                               np.asarray(scores)[order], atol=2e-5)
    co = cohere.ClientV2(api_key="-", base_url=blitz_app, httpx_client=http_session)
    reply = co.rerank(model="tiny-vl-rerank", query="paris", documents=[
        {"text": CAPTION}, {"image": data_url(files[0])},
        {"content": [{"type": "text", "text": "a dog"},
                     {"type": "image_url", "image_url": {"url": data_url(files[1])}}]}])
    assert [r.index for r in reply.results] == order


async def test_the_handle_embeds_and_reranks_parts(blitz_app, tiny_vl, files):
    from ray import serve

    handle = serve.get_app_handle("it-main")
    docs = [[CAPTION, {"image": files[2]}], [{"image": f} for f in files[:1]]]
    want = [reference_embedding(tiny_vl, [CAPTION, decoded(files[2])]),
            reference_embedding(tiny_vl, [decoded(files[0])])]
    result = await handle.embed_parts.remote(docs, model="tiny-vl", dimensions=8)
    assert result.embeddings.shape == (2, 8)
    assert result.usage.image_tokens > 0
    for row, full in zip(result.embeddings, want, strict=True):
        assert cosine(row, full[:8]) >= 0.9999
    ranked = await handle.rerank_parts.remote({"image": files[0]}, ["paris", CAPTION],
                                              model="tiny-vl-rerank", top_n=1)
    assert len(ranked.results) == 1


def test_bad_parts_are_refused_and_the_app_goes_on(http, files):
    for body, status, says in (
            ({"parts": [[{"image": "%%%"}]], "model": "tiny-vl"}, 422, "input[0][0]"),
            ({"parts": [["a"]], "model": "tiny-a"}, 422, "vl-embedding"),
            ({"parts": [[{"image": data_url(files[1])}]] * 100, "model": "tiny-vl"}, 413,
             "max_texts_per_request")):
        reply = http.post("/embed", json=body)
        assert reply.status_code == status, reply.text
        error = error_body(reply)
        assert says in error["message"] + str(error.get("param")), reply.text
    reply = http.post("/embed", json={"parts": [[CAPTION]], "model": "tiny-vl"})
    assert reply.status_code == 200, reply.text
