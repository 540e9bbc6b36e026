"""Sparse embeddings in process (no Ray): a tiny random masked-language model's SPLADE
weights (max over tokens of log(1 + relu(logits)), padding masked) equal a direct
transformers computation; only non-zero entries, in vocabulary order, in TEI's JSON shape
and Blitz's msgpack layouts; ``dtype``/``dimensions`` and wrong kinds refused."""

from __future__ import annotations

import numpy as np
import pytest

from blitz import codecs
from blitz.settings.config import BlitzSettings
from tests.api_client import api_client
from tests.error_body import error_body
from tests.tiny_models import build_tiny_splade

TEXTS = ["hybrid search with sparse vectors", "a", "bm25 meets neural retrieval models"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_splade(tmp_path_factory.mktemp("splade") / "m", seed=21)


@pytest.fixture(scope="module")
def reference(tiny):
    """(texts, vocabulary) SPLADE weights from transformers, each text run alone."""
    import torch
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny))
    model = AutoModelForMaskedLM.from_pretrained(str(tiny)).eval()
    rows = []
    with torch.inference_mode():
        for text in TEXTS:
            logits = model(**tokenizer([text], return_tensors="pt")).logits
            rows.append(torch.log1p(torch.relu(logits)).amax(dim=1)[0].numpy())
    return np.stack(rows)


@pytest.fixture
async def client(tiny):
    settings = BlitzSettings.from_args({
        "models": [{"id": "splade", "source": str(tiny), "kind": "sparse"},
                   {"id": "emb", "source": "fake:8"}],
        "cpu_pool": {"max_batch_size": 2}})
    async with api_client(settings) as c:
        yield c


def dense(entries: list[dict], size: int) -> np.ndarray:
    out = np.zeros(size, dtype=np.float32)
    for e in entries:
        out[e["index"]] = e["value"]
    return out


async def test_weights_equal_transformers_non_zero_only_in_vocabulary_order(client, reference):
    r = await client.post("/embed_sparse", json={"inputs": TEXTS, "model": "splade"})
    assert r.status_code == 200, r.text
    rows = r.json()
    assert len(rows) == len(TEXTS)
    for entries, want in zip(rows, reference, strict=True):
        indices = [e["index"] for e in entries]
        assert indices == sorted(indices) and all(e["value"] != 0 for e in entries)
        assert set(indices) == set(np.flatnonzero(want).tolist())
        assert np.allclose(dense(entries, want.size), want, atol=1e-5)


async def test_msgpack_layouts_carry_index_and_value_arrays(client, reference):
    headers = {"content-type": "application/msgpack", "accept": "application/msgpack"}
    r = await client.post("/embed_sparse", content=codecs.pack({"texts": TEXTS[:1],
                                                                "model": "splade"}),
                          headers=headers)
    body = codecs.unpack(r.content)
    assert body["dimension"] == reference.shape[1] and body["usage"]["total_tokens"] > 0
    vector = body["embeddings"][0]
    assert vector["indices"].dtype == np.int32 and vector["values"].dtype == np.float32
    assert np.array_equal(vector["indices"], np.flatnonzero(reference[0]))
    r = await client.post("/embed_sparse", content=codecs.pack(
        {"texts": TEXTS[:1], "model": "splade", "layout": "portable"}), headers=headers)
    item = codecs.unpack(r.content)["embeddings"][0]["values"]
    values = codecs.from_portable(item["data"], item["shape"], item["dtype"])
    assert np.allclose(values, vector["values"])


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"inputs": "x", "model": "splade", "dtype": "int8"}, 422, "dtype"),
    ({"inputs": "x", "model": "splade", "dimensions": 10}, 422, "dimensions"),
    ({"inputs": "x", "model": "emb"}, 422, "model"),
    ({"inputs": [], "model": "splade"}, 422, "texts"),
])
async def test_refusals(client, body, status, param):
    r = await client.post("/embed_sparse", json=body)
    assert r.status_code == status, r.text
    error = error_body(r)
    assert error["param"] == param
    if param in ("dtype", "dimensions"):
        assert "sparse" in error["message"]


async def test_a_sparse_model_cannot_embed_densely(client):
    r = await client.post("/embed", json={"texts": ["x"], "model": "splade"})
    assert r.status_code == 422 and error_body(r)["param"] == "model"


def test_sparse_models_run_on_torch():
    with pytest.raises(ValueError, match="sparse models run on torch"):
        BlitzSettings.from_args({"models": [{"id": "s", "source": "/x", "kind": "sparse",
                                             "cpu_backend": "onnx-int8"}]})
