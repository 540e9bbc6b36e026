"""``POST /embed_hybrid`` in process (no Ray): a tiny random bge-m3's dense, sparse and
ColBERT outputs, any subset, in one reply equal to the encoder's own (the formulas are
checked in ``test_hybrid.py``): JSON lists (sparse as TEI's entries), msgpack arrays in the
numpy and portable layouts; wrong models and empty ``outputs`` refused."""

from __future__ import annotations

import numpy as np
import pytest

from blitz import codecs
from blitz.loading.load import load_encoder
from blitz.settings.config import BlitzSettings
from blitz.settings.registry import ModelSpec
from tests.api_client import api_client
from tests.error_body import error_body
from tests.tiny_hybrid import build_tiny_hybrid

TEXTS = ["the quick brown fox", "a", "paris is the capital of france and a city"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_hybrid(tmp_path_factory.mktemp("bge-m3") / "m", seed=7)


@pytest.fixture(scope="module")
def expected(tiny):
    return load_encoder(ModelSpec(id="m3", source=str(tiny), kind="hybrid")).hybrid(TEXTS)


@pytest.fixture
async def client(tiny):
    settings = BlitzSettings.from_args({
        "models": [{"id": "m3", "source": str(tiny), "kind": "hybrid"},
                   {"id": "emb", "source": "fake:8"}],
        "cpu_pool": {"max_batch_size": 2}})
    async with api_client(settings) as c:
        yield c


def colbert_rows(expected) -> list[np.ndarray]:
    part = expected.colbert
    return np.split(part.values, np.cumsum(part.token_counts)[:-1])


async def test_json_reply_holds_all_three_outputs_equal_to_the_encoders(client, expected):
    r = await client.post("/embed_hybrid", json={"inputs": TEXTS, "model": "m3"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) >= {"dense", "sparse", "colbert", "usage"} and body["model"] == "m3"
    np.testing.assert_allclose(body["dense"], expected.dense.values, atol=1e-6)
    ends = np.cumsum(expected.sparse.rows)[:-1]
    for entries, indices, values in zip(body["sparse"], np.split(expected.sparse.indices, ends),
                                        np.split(expected.sparse.values, ends), strict=True):
        assert [e["index"] for e in entries] == indices.tolist()
        np.testing.assert_allclose([e["value"] for e in entries], values, atol=1e-6)
    for got, want in zip(body["colbert"], colbert_rows(expected), strict=True):
        np.testing.assert_allclose(np.asarray(got).reshape(want.shape), want, atol=1e-6)
    assert body["usage"]["total_tokens"] == int(expected.dense.token_counts.sum())


async def test_a_subset_of_outputs_gets_only_those(client, expected):
    r = await client.post("/embed_hybrid", json={"inputs": TEXTS, "model": "m3",
                                                 "outputs": ["colbert"]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert "dense" not in body and "sparse" not in body and len(body["colbert"]) == len(TEXTS)


async def test_msgpack_carries_native_and_portable_arrays(client, expected):
    headers = {"content-type": "application/msgpack", "accept": "application/msgpack"}
    r = await client.post("/embed_hybrid", content=codecs.pack(
        {"texts": TEXTS, "model": "m3"}), headers=headers)
    assert r.status_code == 200, r.content
    body = codecs.unpack(r.content)
    dense = np.stack(body["dense"])
    assert dense.dtype == np.float32
    np.testing.assert_allclose(dense, expected.dense.values, atol=1e-6)
    assert body["sparse"][0]["indices"].dtype == np.int32
    for got, want in zip(body["colbert"], colbert_rows(expected), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)
    r = await client.post("/embed_hybrid", content=codecs.pack(
        {"texts": TEXTS[:1], "model": "m3", "outputs": ["colbert"], "layout": "portable"}),
        headers=headers)
    item = codecs.unpack(r.content)["colbert"][0]
    np.testing.assert_allclose(codecs.from_portable(item["data"], item["shape"], item["dtype"]),
                               colbert_rows(expected)[0], atol=1e-6)


@pytest.mark.parametrize(("body", "param"), [
    ({"inputs": "x", "model": "emb"}, "model"),
    ({"inputs": "x", "model": "m3", "outputs": []}, "outputs"),
    ({"inputs": "x", "model": "m3", "outputs": ["bm25"]}, "outputs[0]"),
])
async def test_refusals_name_the_field(client, body, param):
    r = await client.post("/embed_hybrid", json=body)
    assert r.status_code == 422, r.text
    assert error_body(r)["param"] == param


async def test_the_other_routes_give_dense_sparse_colbert_and_maxsim(client, expected):
    r = await client.post("/embed", json={"texts": TEXTS, "model": "m3"})
    assert r.status_code == 200, r.text
    got = np.array(r.json()["embeddings"])
    np.testing.assert_allclose(got, expected.dense.values, atol=1e-6)
    r = await client.post("/embed_sparse", json={"inputs": TEXTS, "model": "m3"})
    assert r.status_code == 200, r.text
    assert [e["index"] for e in r.json()[0]] == expected.sparse.indices[
        :expected.sparse.rows[0]].tolist()
    r = await client.post("/embed_all", json={"inputs": TEXTS, "model": "m3"})
    assert r.status_code == 200, r.text
    for got_rows, want in zip(r.json(), colbert_rows(expected), strict=True):
        np.testing.assert_allclose(np.asarray(got_rows), want, atol=1e-6)
    r = await client.post("/rerank", json={"query": TEXTS[0], "texts": TEXTS[1:],
                                           "model": "m3"})
    assert r.status_code == 200, r.text
    rows = colbert_rows(expected)
    want = {i: float((rows[0] @ d.T).max(axis=1).mean()) for i, d in enumerate(rows[1:])}
    for hit in r.json():
        assert hit["score"] == pytest.approx(want[hit["index"]], abs=1e-5)


async def test_info_describes_a_hybrid_model_as_a_cls_pooled_embedder(client):
    r = await client.get("/info", headers={"serve_multiplexed_model_id": "m3"})
    assert r.status_code == 200, r.text
    assert r.json()["model_type"] == {"embedding": {"pooling": "cls"}}
