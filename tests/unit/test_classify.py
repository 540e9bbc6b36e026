"""Classifiers in process (no Ray): a tiny random sequence classifier's labels from its
config, scores equal to transformers' (softmax, or raw logits), TEI's ``/predict`` shapes
(one input, a pair, a batch) and Infinity's ``/classify``; the int8 ONNX build passes the
accuracy guard; wrong kinds and bad inputs refused."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from blitz.ingress.other_outputs import probabilities
from blitz.settings.config import BlitzSettings
from tests.api_client import api_client
from tests.error_body import error_body
from tests.tiny_models import CLASSIFIER_LABELS, build_tiny_classifier

TEXTS = ["I like this a lot", "terrible, never again", "it is a chair"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_classifier(tmp_path_factory.mktemp("cls") / "m", seed=11)


@pytest.fixture(scope="module")
def reference(tiny):
    """transformers' own logits for the texts and for one pair."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny))
    model = AutoModelForSequenceClassification.from_pretrained(str(tiny)).eval()
    with torch.inference_mode():
        texts = model(**tokenizer(TEXTS, padding=True, return_tensors="pt")).logits.numpy()
        pair = model(**tokenizer([TEXTS[0]], [TEXTS[1]], return_tensors="pt")).logits.numpy()
    return texts, pair


def make_client(tiny, backend: str = "torch", cache_dir=None) -> httpx.AsyncClient:
    settings = BlitzSettings.from_args({
        "models": [{"id": "cls", "source": str(tiny), "kind": "classifier",
                    "cpu_backend": backend},
                   {"id": "emb", "source": "fake:8"}],
        **({"cache_dir": str(cache_dir)} if cache_dir else {}),
        "cpu_pool": {"max_batch_size": 2}})  # three inputs: two pool calls
    return api_client(settings)


@pytest.fixture
async def client(tiny):
    async with make_client(tiny) as c:
        yield c


def as_matrix(rows: list[list[dict]]) -> np.ndarray:
    """Scores in label order, whatever order each row came in."""
    return np.array([[next(p["score"] for p in row if p["label"] == label)
                      for label in CLASSIFIER_LABELS] for row in rows], dtype=np.float32)


async def test_predict_batch_scores_equal_transformers_best_first(client, reference):
    logits, _ = reference
    r = await client.post("/predict", json={"inputs": [[t] for t in TEXTS], "model": "cls"})
    assert r.status_code == 200, r.text
    rows = r.json()
    assert len(rows) == 3 and all(len(row) == 3 for row in rows)
    for row in rows:
        scores = [p["score"] for p in row]
        assert scores == sorted(scores, reverse=True)
        assert {p["label"] for p in row} == set(CLASSIFIER_LABELS)
    assert np.allclose(as_matrix(rows), probabilities(logits), atol=1e-5)
    raw = (await client.post("/predict", json={"inputs": [[t] for t in TEXTS], "model": "cls",
                                               "raw_scores": True})).json()
    assert np.allclose(as_matrix(raw), logits, atol=1e-4)


async def test_predict_single_text_and_pair_give_a_flat_list(client, reference):
    logits, pair = reference
    one = (await client.post("/predict", json={"inputs": TEXTS[0], "model": "cls"})).json()
    assert isinstance(one[0], dict)
    assert np.allclose(as_matrix([one]), probabilities(logits[:1]), atol=1e-5)
    both = (await client.post("/predict", json={"inputs": TEXTS[:2], "model": "cls",
                                                "raw_scores": True})).json()
    assert np.allclose(as_matrix([both]), pair, atol=1e-4)  # ["a", "b"] is one pair (TEI)
    top = (await client.post("/predict", json={"inputs": TEXTS[0], "model": "cls",
                                               "top_k": 1})).json()
    assert len(top) == 1 and top[0] == one[0]


async def test_classify_in_infinitys_shape(client, reference):
    logits, _ = reference
    r = await client.post("/classify", json={"input": TEXTS, "model": "cls"})
    body = r.json()
    assert body["object"] == "classify" and body["model"] == "cls"
    assert body["id"].startswith("blitz-") and isinstance(body["created"], int)
    assert body["usage"]["total_tokens"] > 0
    assert np.allclose(as_matrix(body["data"]), probabilities(logits), atol=1e-5)


@pytest.mark.parametrize(("route", "body", "status", "param"), [
    ("/predict", {"inputs": "x", "model": "emb"}, 422, "model"),
    ("/predict", {"inputs": ["a", "b", "c"], "model": "cls"}, 422, "inputs"),
    ("/predict", {"inputs": [], "model": "cls"}, 422, "inputs"),
    ("/predict", {"inputs": [["a", "b", "c"]], "model": "cls"}, 422, "inputs"),
    ("/predict", {"inputs": "   ", "model": "cls"}, 422, "inputs"),
    ("/predict", {"inputs": "x", "model": "cls", "top_k": 0}, 422, "top_k"),
    ("/classify", {"input": [1, 2], "model": "cls"}, 422, "input"),
    ("/classify", {"input": ["x"], "model": "nope"}, 404, "model"),
])
async def test_refusals(client, route, body, status, param):
    r = await client.post(route, json=body)
    assert r.status_code == status, r.text
    assert error_body(r)["param"].startswith(param)


async def test_a_classifier_cannot_embed_or_rerank(client):
    r = await client.post("/embed", json={"texts": ["x"], "model": "cls"})
    assert r.status_code == 422 and error_body(r)["param"] == "model"
    r = await client.post("/rerank", json={"query": "q", "documents": ["x"], "model": "cls"})
    assert r.status_code == 422


@pytest.mark.slow
async def test_onnx_builds_agree_and_the_int8_guard_refuses_a_poor_one(tiny, reference,
                                                                        tmp_path):
    """fp32 ONNX serves the same logits; this random tiny model's int8 build strays too far
    from fp32 (the guard's Pearson over the probe set), so it is refused with a 424."""
    logits, _ = reference
    body = {"inputs": [[t] for t in TEXTS], "model": "cls", "raw_scores": True}
    async with make_client(tiny, "onnx", tmp_path) as client:
        r = await client.post("/predict", json=body)
    assert r.status_code == 200, r.text
    assert np.abs(as_matrix(r.json()) - logits).max() < 1e-3
    async with make_client(tiny, "onnx-int8", tmp_path) as client:
        r = await client.post("/predict", json=body)
    assert r.status_code == 424, r.text
    assert "cls" in error_body(r)["message"]
