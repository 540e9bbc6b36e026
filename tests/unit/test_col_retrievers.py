"""Visual document retrievers (``kind: vl-multi-vector``, ``blitz.vision_language.retriever``):
tiny random ColQwen2 and ColPali folders give the multi-vectors transformers' own
``*ForRetrieval`` classes and processors give (queries and pages, alone and in any batch,
pages resized before the queue), pages pool by the hierarchical formula, and over HTTP
``/embed_multivector`` takes pages, ``/rerank`` with ``images`` scores them by MaxSim, and
what cannot be served is refused before any model work."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import torch

from blitz.encoders.base import MultiVectorReduce
from blitz.settings.config import BlitzSettings
from blitz.vision_language.retriever import ColVisionEncoder, open_col_retriever
from tests.api_client import api_client, api_for
from tests.tiny_colbert import build_pylate_colbert
from tests.tiny_colvision import (
    build_colpali,
    build_colqwen2,
    colpali_reference,
    colqwen2_reference,
    score_reference,
)
from tests.tiny_vision import random_images
from tests.unit.test_multi_vector import hierarchical_pool

QUERIES = ["what is the capital of france?", "a red fox", "one"]
SIZES = [(40, 30), (90, 120), (300, 200), (33, 47)]  # (width, height)
FAMILIES = {"colqwen2": (build_colqwen2, colqwen2_reference),
            "colpali": (build_colpali, colpali_reference)}


@pytest.fixture(scope="module")
def pages():
    return random_images(3, SIZES)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def tiny(request, tmp_path_factory):
    build, reference = FAMILIES[request.param]
    return request.param, build(tmp_path_factory.mktemp(request.param), seed=7), reference


def _open(folder, budget: int = 8192) -> ColVisionEncoder:
    return open_col_retriever("m", folder, device="cpu", dtype=torch.float32,
                              token_budget=budget, max_seq_length=None,
                              trust_remote_code=False)


def _rows(encoded) -> list[np.ndarray]:
    return np.split(encoded.values, np.cumsum(encoded.rows)[:-1])


def _close(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert [len(r) for r in got] == [len(r) for r in want]
    for a, b in zip(got, want, strict=True):
        assert np.abs(a - b).max() < 1e-4


def test_queries_are_the_models_own_alone_and_in_any_batch(tiny):
    _, folder, reference = tiny
    encoder = _open(folder)
    want = reference(folder, QUERIES, None)
    _close(_rows(encoder.embed_multi(QUERIES, query=True)), want)
    _close([_rows(encoder.embed_multi([q], query=True))[0] for q in QUERIES], want)
    _close(_rows(encoder.embed_multi(QUERIES[::-1], query=True))[::-1], want)


def test_pages_are_the_models_own_resized_before_the_queue(tiny, pages):
    _, folder, reference = tiny
    encoder = _open(folder)
    want = reference(folder, None, pages)
    prepared = [encoder.prepare_part(p) for p in pages]
    assert all(p.size == encoder.target(*page.size) for p, page in zip(prepared, pages,
                                                                          strict=True))
    _close(_rows(encoder.embed_multi([], query=False, images=prepared)), want)
    _close(_rows(_open(folder, budget=64).embed_multi([], query=False, images=prepared)),
           want)  # a page a call
    _close(_rows(encoder.embed_multi([], query=False, images=prepared[::-1]))[::-1], want)
    for page, rows in zip(pages, want, strict=True):  # the count the ingress budgets
        assert encoder.page_tokens(*page.size) <= len(rows) <= (
            encoder.page_tokens(*page.size) + 32)


def test_pages_pool_by_the_hierarchical_formula(tiny, pages):
    _, folder, reference = tiny
    encoder = _open(folder)
    prepared = [encoder.prepare_part(p) for p in pages[1:3]]
    got = _rows(encoder.embed_multi([], query=False, images=prepared,
                                    reduce=MultiVectorReduce(pool_factor=2)))
    for pooled, full in zip(got, reference(folder, None, pages[1:3]), strict=True):
        want = hierarchical_pool(full, 2, protected=0)
        assert np.abs(np.sort(pooled, axis=0) - np.sort(want, axis=0)).max() < 1e-4


def test_text_rerank_is_maxsim_of_queries(tiny):
    _, folder, reference = tiny
    encoder = _open(folder)
    got = encoder.score(QUERIES[0], QUERIES[1:]).values
    q, *docs = reference(folder, QUERIES, None)
    assert np.abs(got - score_reference([q], docs)[0]).max() < 1e-4


def _data_url(image) -> str:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    root = tmp_path_factory.mktemp("retrievers")
    settings = BlitzSettings.from_args({"models": [
        {"id": "colqwen", "source": str(build_colqwen2(root / "colqwen", seed=7)),
         "kind": "vl-multi-vector"},
        {"id": "colpali", "source": str(build_colpali(root / "colpali", seed=7)),
         "kind": "vl-multi-vector"},
        {"id": "colbert", "source": str(build_pylate_colbert(root / "colbert")),
         "kind": "multi-vector"}],
        "limits": {"max_token_vectors_per_request": 300}})
    return api_for(settings), root


@pytest.mark.parametrize("model", ["colqwen", "colpali"])
async def test_pages_and_queries_over_http_and_rerank_by_maxsim(api, pages, model):
    app, root = api
    reference = colqwen2_reference if model == "colqwen" else colpali_reference
    folder = root / model
    want_pages = reference(folder, None, pages)
    async with api_client(app) as client:
        reply = await client.post("/embed_multivector", json={
            "model": model, "images": [_data_url(p) for p in pages]})
        assert reply.status_code == 200, reply.text
        body = reply.json()
        _close([np.array(r, np.float32) for r in body["embeddings"]], want_pages)
        query = (await client.post("/embed_multivector", json={
            "model": model, "input": QUERIES[0], "input_type": "query"})).json()
        _close([np.array(query["embeddings"][0], np.float32)],
               reference(folder, QUERIES[:1], None))
        ranked = await client.post("/rerank", json={
            "model": model, "query": QUERIES[0], "images": [_data_url(p) for p in pages]})
        assert ranked.status_code == 200, ranked.text
        scores = score_reference(reference(folder, QUERIES[:1], None), want_pages)[0]
        results = ranked.json()["results"]
        assert [r["index"] for r in results] == np.argsort(-scores, kind="stable").tolist()
        assert np.abs(np.array([r["relevance_score"] for r in results])
                      - np.sort(scores)[::-1]).max() < 1e-4


async def test_what_cannot_be_served_is_refused_before_any_work(api, pages):
    app, _ = api
    async with api_client(app) as client:
        for body, status, param in (
                ({"model": "colbert", "images": [_data_url(pages[0])]}, 422, "images"),
                ({"model": "colqwen", "images": [_data_url(pages[2])] * 10}, 413, "texts"),
                ({"model": "colqwen", "images": ["data:image/png;base64,AAAA"]}, 415,
                 "images[0]"),
                ({"model": "colqwen"}, 422, "texts"),
                ({"model": "colqwen", "input": "q", "images": [_data_url(pages[0])]}, 422,
                 "texts")):
            reply = await client.post("/embed_multivector", json=body)
            assert reply.status_code == status, (body, reply.text)
            assert reply.json()["error"]["param"] == param, reply.json()
        ok = await client.post("/embed_multivector", json={
            "model": "colqwen", "images": [_data_url(pages[0])], "muvera": True})
        assert ok.status_code == 200 and ok.json()["muvera"] is True
