"""``/similarity`` in process (no Ray): Hugging Face TEI's shape, the cosine of the source
to each sentence from one embedding call, limits and wrong kinds refused."""

from __future__ import annotations

import numpy as np
import pytest

from blitz.settings.config import BlitzSettings
from tests.api_client import api_client
from tests.error_body import error_body

SENTENCES = ["what is deep learning", "a recipe for soup", "neural networks"]


@pytest.fixture
async def client():
    settings = BlitzSettings.from_args({
        "models": [{"id": "emb", "source": "fake:16", "prompts": {"query": "q: "}},
                   {"id": "ce", "source": "fake:4", "kind": "cross-encoder"}],
        "limits": {"max_texts_per_request": 4}})
    async with api_client(settings) as c:
        yield c


async def embed(client, texts: list[str]) -> np.ndarray:
    r = await client.post("/embed", json={"texts": texts, "model": "emb"},
                          headers={"accept": "application/json"})
    return np.array(r.json()["embeddings"], dtype=np.float32)


async def test_one_cosine_per_sentence_in_order(client):
    body = {"inputs": {"source_sentence": "deep learning", "sentences": SENTENCES},
            "model": "emb"}
    r = await client.post("/similarity", json=body)
    assert r.status_code == 200, r.text
    rows = await embed(client, ["deep learning", *SENTENCES])
    assert np.allclose(r.json(), rows[1:] @ rows[0], atol=1e-6)
    prompted = await client.post("/similarity", json={**body, "parameters": {
        "prompt_name": "query", "truncate": None}})
    rows = await embed(client, ["q: deep learning", *[f"q: {s}" for s in SENTENCES]])
    assert np.allclose(prompted.json(), rows[1:] @ rows[0], atol=1e-6)


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"inputs": {"source_sentence": "a", "sentences": []}, "model": "emb"}, 422, "sentences"),
    ({"inputs": {"source_sentence": "a", "sentences": ["b"] * 4}, "model": "emb"}, 413,
     "inputs.sentences"),
    ({"inputs": {"source_sentence": "a"}, "model": "emb"}, 422, "inputs"),
    ({"inputs": "a", "model": "emb"}, 422, "inputs"),
    ({"inputs": {"source_sentence": "a", "sentences": ["b"]}, "model": "ce"}, 422, "model"),
])
async def test_refusals(client, body, status, param):
    r = await client.post("/similarity", json=body)
    assert r.status_code == status, r.text
    assert error_body(r)["param"].startswith(param)
