"""Late-interaction (multi-vector) models (``kind: multi-vector``, ``blitz.encoders.colbert``):
tiny random ColBERT folders in the formats real checkpoints ship in (sentence-transformers
6's, BERT and ModernBERT; PyLate's) give the vectors their references give (PyLate's encode
written out, ST6's own), alone and in any batch; ``/rerank`` scores by MaxSim; token pooling
and MUVERA follow the formulas written here; ``/embed_multivector`` answers every dtype and
layout, and counts its vectors before any model work."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from blitz import codecs
from blitz.encoders.base import MultiVectorReduce
from blitz.encoders.colbert import ColbertEncoder, open_colbert
from blitz.errors import InvalidValue
from blitz.multivector import muvera
from blitz.settings.config import BlitzSettings
from tests.api_client import api_client, api_for
from tests.tiny_colbert import (
    build_plain_bert,
    build_pylate_colbert,
    build_st6_colbert,
    maxsim,
    pylate_reference,
    st6_reference,
)

TEXTS = ["the cat sat on the mat.", "a longer text, with punctuation! and more words here",
         "paris is the capital of france", "one"]
QUERY = "where does the cat sit?"


def _open(path: Path, budget: int = 8192) -> ColbertEncoder:
    return open_colbert("m", path, device="cpu", dtype=torch.float32, token_budget=budget,
                        max_seq_length=None, trust_remote_code=False)


def _rows(encoded) -> list[np.ndarray]:
    return np.split(encoded.values, np.cumsum(encoded.rows)[:-1])


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("colbert")
    return {"st6-bert": build_st6_colbert(root / "st6-bert", "bert"),
            "st6-modernbert": build_st6_colbert(root / "st6-modernbert", "modernbert"),
            "pylate-bert": build_pylate_colbert(root / "pylate-bert", "bert")}


@pytest.mark.parametrize("name", ["st6-bert", "st6-modernbert", "pylate-bert"])
@pytest.mark.parametrize("query", [True, False])
def test_vectors_are_the_references_alone_and_in_any_batch(folders, name, query):
    path = folders[name]
    encoder = _open(path)
    want = st6_reference(path, TEXTS, query)
    if name.startswith("pylate"):  # PyLate's own encode, written out, agrees with ST6's
        for a, b in zip(pylate_reference(path, TEXTS, query), want, strict=True):
            assert np.abs(a - b).max() < 1e-5
    together = _rows(encoder.embed_multi(TEXTS, query=query))
    alone = [_rows(encoder.embed_multi([t], query=query))[0] for t in TEXTS]
    reverse = _rows(encoder.embed_multi(TEXTS[::-1], query=query))[::-1]
    small = _rows(_open(path, budget=64).embed_multi(TEXTS, query=query))  # batches of one
    for got in (together, alone, reverse, small):
        assert [len(r) for r in got] == [len(r) for r in want]
        for a, b in zip(got, want, strict=True):
            assert np.abs(a - b).max() < 1e-5
    if query:  # expanded with [MASK] to the query length
        assert {len(r) for r in together} == {32}


def test_documents_drop_the_skiplist_and_queries_keep_it(folders):
    encoder = _open(folders["st6-bert"])
    plain = encoder.embed_multi(["the cat sat"], query=False).rows[0]
    punctuated = encoder.embed_multi(["the , cat . sat !"], query=False).rows[0]
    assert plain == punctuated


def test_rerank_scores_are_maxsim(folders):
    path = folders["pylate-bert"]
    encoder = _open(path)
    got = encoder.score(QUERY, TEXTS)
    q = pylate_reference(path, [QUERY], True)[0]
    want = [maxsim(q, d) for d in pylate_reference(path, TEXTS, False)]
    assert np.abs(got.values - np.array(want)).max() < 1e-4
    assert got.token_counts.tolist() == (encoder.counts(TEXTS, False, True)
                                         + encoder.counts([QUERY], True, True)[0]).tolist()


def hierarchical_pool(vectors: np.ndarray, pool_factor: float, protected: int = 1
                      ) -> np.ndarray:
    """Hierarchical token pooling (PyLate's ``pool_embeddings_hierarchical`` after its
    condensed-Ward fix, as sentence-transformers 6 ships it): the first ``protected`` tokens
    kept; the rest clustered by Ward linkage on cosine distance into
    ``len // pool_factor`` clusters; each cluster's mean; every row L2-normalized."""
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    keep, rest = vectors[:protected], vectors[protected:]
    clusters = max(int(len(rest) // pool_factor), 1)
    if clusters < len(rest):
        distance = np.clip(1 - rest @ rest.T, 0, 2)
        labels = fcluster(linkage(squareform(distance, checks=False), method="ward"),
                          t=clusters, criterion="maxclust")
        rest = np.stack([rest[labels == c].mean(0) for c in np.unique(labels)])
    out = np.concatenate([keep, rest])
    return out / np.linalg.norm(out, axis=1, keepdims=True)


@pytest.mark.parametrize("pool_factor", [1.5, 2, 3])
def test_token_pooling_is_the_hierarchical_formula(folders, pool_factor):
    path = folders["st6-bert"]
    encoder = _open(path)
    texts = [" ".join(["the quick brown fox jumps over the lazy dog"] * 3), TEXTS[1]]
    got = _rows(encoder.embed_multi(texts, query=False,
                                    reduce=MultiVectorReduce(pool_factor=pool_factor)))
    for pooled, full in zip(got, st6_reference(path, texts, False), strict=True):
        want = hierarchical_pool(full, pool_factor)
        assert len(pooled) == len(want) < len(full)
        # cluster order is fcluster's in both: compare as sets of rows
        assert np.abs(np.sort(pooled, axis=0) - np.sort(want, axis=0)).max() < 1e-5


def test_a_query_is_not_pooled(folders):
    encoder = _open(folders["st6-bert"])
    with pytest.raises(InvalidValue) as caught:
        encoder.embed_multi([QUERY], query=True, reduce=MultiVectorReduce(pool_factor=2))
    assert caught.value.param == "pool_factor"


@pytest.mark.parametrize("query", [True, False])
def test_muvera_is_one_fixed_vector_of_the_multi_vectors(folders, query):
    path = folders["st6-bert"]
    encoder = _open(path)
    options = {"k_sim": 3, "dim_proj": 8, "r_reps": 4, "seed": 7}
    got = encoder.embed_multi(TEXTS, query=query, reduce=MultiVectorReduce(muvera=options))
    assert got.rows is None and got.values.shape == (len(TEXTS), 4 * 8 * 8)
    params = muvera.MuveraParams(**options)
    encode = muvera.encode_query if query else muvera.encode_document
    want = np.stack([encode(r, params) for r in st6_reference(path, TEXTS, query)])
    assert np.abs(got.values - want).max() < 1e-4


def test_a_folder_with_no_late_interaction_head_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a late-interaction model"):
        _open(build_plain_bert(tmp_path / "plain"))


def test_truncate_false_refuses_an_over_long_document(folders):
    encoder = _open(folders["st6-bert"])
    long = " ".join(["word"] * 100)
    assert encoder.counts([long], False, True).tolist() == [64]
    from blitz.errors import InputTooLong

    with pytest.raises(InputTooLong):
        encoder.embed_multi([long], query=False, truncate=False)


# ---- the routes ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def api(folders):
    settings = BlitzSettings.from_args({"models": [
        {"id": "colbert", "source": str(folders["pylate-bert"]), "kind": "multi-vector"},
        {"id": "minilm", "source": "fake:8"}],
        "limits": {"max_token_vectors_per_request": 200}})
    return api_for(settings)


async def test_embed_multivector_json_and_msgpack(api, folders):
    path = folders["pylate-bert"]
    want = pylate_reference(path, TEXTS[:2], False)
    async with api_client(api) as client:
        reply = await client.post("/embed_multivector", json={"model": "colbert",
                                                               "input": TEXTS[:2]})
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert body["dimension"] == 16 and body["muvera"] is False
        for rows, ref in zip(body["embeddings"], want, strict=True):
            assert np.abs(np.array(rows, np.float32) - ref).max() < 1e-5
        assert body["usage"]["total_tokens"] > 0
        packed = await client.post("/embed_multivector", content=codecs.pack({
            "model": "colbert", "texts": TEXTS[:2], "dtype": "ubinary",
            "input_type": "query"}), headers={"content-type": "application/msgpack",
                                              "accept": "application/msgpack"})
        rows = codecs.unpack(packed.content)["embeddings"]
        queries = pylate_reference(path, TEXTS[:2], True)
        assert [r.shape for r in rows] == [(32, 2), (32, 2)]
        assert all((r == np.packbits(q > 0, axis=1)).all()
                   for r, q in zip(rows, queries, strict=True))


async def test_muvera_and_pooling_over_http(api):
    async with api_client(api) as client:
        one = (await client.post("/embed_multivector", json={
            "model": "colbert", "input": TEXTS, "muvera": {"k_sim": 2, "dim_proj": 4,
                                                           "r_reps": 2}})).json()
        assert one["muvera"] is True
        assert [len(r) for r in one["embeddings"]] == [4 * 4 * 2] * len(TEXTS)
        pooled = (await client.post("/embed_multivector", json={
            "model": "colbert", "input": TEXTS[1], "pool_factor": 2})).json()
        full = (await client.post("/embed_multivector", json={
            "model": "colbert", "input": TEXTS[1]})).json()
        assert len(pooled["embeddings"][0]) < len(full["embeddings"][0])


async def test_rerank_by_maxsim_on_every_rerank_route(api, folders):
    path = folders["pylate-bert"]
    q = pylate_reference(path, [QUERY], True)[0]
    want = np.array([maxsim(q, d) for d in pylate_reference(path, TEXTS, False)])
    order = np.argsort(-want, kind="stable").tolist()
    async with api_client(api) as client:
        for url, scores_of in (
                ("/rerank", lambda b: b["results"]), ("/v1/rerank", lambda b: b["results"]),
                ("/v2/rerank", lambda b: b["results"])):
            reply = await client.post(url, json={"model": "colbert", "query": QUERY,
                                                  "documents": TEXTS})
            assert reply.status_code == 200, (url, reply.text)
            results = scores_of(reply.json())
            assert [r["index"] for r in results] == order
            assert np.abs(np.array([r["relevance_score"] for r in results])
                          - want[order]).max() < 1e-4


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"model": "minilm", "input": ["a"]}, 422, "model"),
    ({"model": "colbert", "input": ["a"], "input_type": "query", "pool_factor": 2}, 422,
     "pool_factor"),
    ({"model": "colbert", "input": ["a"], "pool_factor": 0.5}, 422, "pool_factor"),
    ({"model": "colbert", "input": ["a"], "muvera": {"k": 3}}, 422, "muvera"),
    ({"model": "colbert", "input": ["a"], "muvera": {"k_sim": 11}}, 422, "muvera"),
    ({"model": "colbert", "input": ["a"], "muvera": {"k_sim": 10, "r_reps": 64}}, 422,
     "muvera"),
    ({"model": "colbert", "input": ["a"] * 7, "input_type": "query"}, 413, "texts"),
    ({"model": "colbert", "input": [" ".join(["word"] * 70)] * 4}, 413, "texts"),
    ({"model": "colbert", "input": ["a"] * 40, "muvera": True}, 413, "input"),
    ({"model": "colbert", "input": ["a"], "dtype": "float64"}, 422, "dtype"),
])
async def test_refusals_name_the_field_and_come_before_any_work(api, body, status, param):
    async with api_client(api) as client:
        reply = await client.post("/embed_multivector", json=body)
        assert reply.status_code == status, reply.text
        assert reply.json()["error"]["param"] == param
        ok = await client.post("/embed_multivector", json={"model": "colbert", "input": "a"})
        assert ok.status_code == 200
