"""``/embed_all`` in process (no Ray): per-token vectors from an embedding model, padding
left out per text, equal to sentence-transformers' token embeddings; TEI's JSON shape and
Blitz's msgpack layouts; models without them refused."""

from __future__ import annotations

import numpy as np
import pytest

from blitz import codecs
from blitz.settings.config import BlitzSettings
from tests.api_client import api_client
from tests.error_body import error_body
from tests.tiny_models import build_tiny_bi_encoder

TEXTS = ["short", "a somewhat longer text with more tokens in it", "mid length one"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_bi_encoder(tmp_path_factory.mktemp("tiny") / "m", hidden=32, seed=3)


@pytest.fixture(scope="module")
def reference(tiny):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(tiny), device="cpu")


@pytest.fixture
async def client(tiny):
    settings = BlitzSettings.from_args({
        "models": [{"id": "tiny", "source": str(tiny), "cpu_backend": "torch"},
                   {"id": "fake", "source": "fake:8"}],
        "cpu_pool": {"max_batch_size": 2}})  # three texts: two pool calls
    async with api_client(settings) as c:
        yield c


async def test_token_vectors_equal_sentence_transformers_without_padding(client, reference):
    r = await client.post("/embed_all", json={"inputs": TEXTS, "model": "tiny"})
    assert r.status_code == 200, r.text
    got = r.json()
    expected = reference.encode(TEXTS, output_value="token_embeddings")
    assert len(got) == len(TEXTS)
    for rows, want, text in zip(got, expected, TEXTS, strict=True):
        rows = np.array(rows, dtype=np.float32)
        n = len(reference.tokenizer(text)["input_ids"])
        assert rows.shape == (n, 32)  # special tokens in, padding out
        assert np.allclose(rows, want.numpy()[:n], atol=1e-5)
    usage_tokens = sum(len(reference.tokenizer(t)["input_ids"]) for t in TEXTS)
    r = await client.post("/embed_all", content=codecs.pack({"texts": TEXTS, "model": "tiny"}),
                          headers={"content-type": "application/msgpack",
                                   "accept": "application/msgpack"})
    body = codecs.unpack(r.content)
    assert body["usage"]["total_tokens"] == usage_tokens
    assert [a.shape[0] for a in body["embeddings"]] == [len(g) for g in got]


async def test_the_mean_of_a_texts_token_vectors_is_its_embedding(client):
    rows = (await client.post("/embed_all", json={"inputs": TEXTS[1], "model": "tiny"})).json()
    emb = (await client.post("/embed", json={"texts": [TEXTS[1]], "model": "tiny",
                                             "normalize": False},
                             headers={"accept": "application/json"})).json()["embeddings"]
    assert np.allclose(np.mean(np.array(rows[0]), axis=0), emb[0], atol=1e-5)


async def test_portable_layout(client):
    r = await client.post("/embed_all", content=codecs.pack({"texts": TEXTS[:1], "model": "tiny",
                                                             "layout": "portable"}),
                          headers={"content-type": "application/msgpack",
                                   "accept": "application/msgpack"})
    item = codecs.unpack(r.content)["embeddings"][0]
    rows = codecs.from_portable(item["data"], item["shape"], item["dtype"])
    assert rows.shape[1] == 32


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"inputs": "x", "model": "fake"}, 422, "model"),
    ({"inputs": [], "model": "tiny"}, 422, "texts"),
    ({"inputs": "x", "model": "nope"}, 404, "model"),
    ({"inputs": "word " * 300, "model": "tiny", "truncate": False}, 413, "input"),
])
async def test_refusals(client, body, status, param):
    r = await client.post("/embed_all", json=body)
    assert r.status_code == status, r.text
    assert error_body(r)["param"] == param
