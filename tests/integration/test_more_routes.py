"""The routes beside embeddings and rerank on a real app, over HTTP and the handle:
per-token and sparse embeddings, classification, and the vector cache
(``ingress.vector_cache_mb``) with its hits in ``server-timing`` and the metrics.

The app (``it-more``) has an embedding model, a classifier and a sparse model, all tiny
and random, and a CPU pool only; it is removed at the end of the module.
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from blitz import codecs, timing
from tests.metrics_scrape import metrics_url, scrape_until, total
from tests.tiny_models import CLASSIFIER_LABELS, build_tiny_classifier, build_tiny_splade

APP = "it-more"
MSGPACK = {"content-type": "application/msgpack"}
TEXTS = ["a first text", "the second one is longer than the first", "third"]


@pytest.fixture(scope="module")
def more_app(serve_instance, tiny_models, tmp_path_factory):
    from ray import serve

    from deployments.app import build_app

    root = tmp_path_factory.mktemp("more")
    small = {"ray_actor_options": {"num_cpus": 0.1},
             "autoscaling_config": {"min_replicas": 1, "max_replicas": 1}}
    serve.run(build_app({
        "models": [{"id": "tiny-a", "source": str(tiny_models["tiny-a"])},
                   {"id": "cls", "source": str(build_tiny_classifier(root / "cls", seed=3)),
                    "kind": "classifier"},
                   {"id": "splade", "source": str(build_tiny_splade(root / "sp", seed=4)),
                    "kind": "sparse"}],
        "gpu": "off", "ingress": {"vector_cache_mb": 4,
                                  "deployment": {"num_replicas": 1,
                                                 "ray_actor_options": {"num_cpus": 0.1}}},
        "cpu_pool": {"deployment": small, "torch_threads": 1, "max_batch_size": 8}}),
        name=APP, route_prefix=f"/{APP}")
    yield f"{serve_instance}/{APP}"
    serve.delete(APP)


@pytest.fixture
def http(more_app):
    with httpx.Client(base_url=more_app, timeout=60) as client:
        yield client


def embed(client: httpx.Client, texts: list[str], **options) -> tuple[bytes, str]:
    r = client.post("/embed", content=codecs.pack({"texts": texts, **options}), headers=MSGPACK)
    assert r.status_code == 200, r.text
    return codecs.unpack(r.content)["embeddings"].tobytes(), r.headers[timing.HEADER]


def test_embed_all_sparse_and_predict_over_http(http):
    rows = http.post("/embed_all", json={"inputs": TEXTS, "model": "tiny-a"}).json()
    assert [np.array(r).shape[1] for r in rows] == [32, 32, 32]
    emb = http.post("/embed", json={"texts": TEXTS[1:2], "model": "tiny-a", "normalize": False},
                    headers={"accept": "application/json"}).json()["embeddings"][0]
    assert np.allclose(np.mean(rows[1], axis=0), emb, atol=1e-5)  # a mean-pooled model
    sparse = http.post("/embed_sparse", json={"inputs": TEXTS, "model": "splade"}).json()
    assert len(sparse) == 3 and all(row and row[0]["value"] > 0 for row in sparse)
    assert http.post("/embed_sparse", json={"inputs": "x", "model": "splade",
                                            "dtype": "int8"}).status_code == 422
    scores = http.post("/predict", json={"inputs": TEXTS[0], "model": "cls"}).json()
    assert {p["label"] for p in scores} == set(CLASSIFIER_LABELS)
    assert abs(sum(p["score"] for p in scores) - 1) < 1e-5
    body = http.post("/classify", json={"input": TEXTS, "model": "cls", "top_k": 1}).json()
    assert body["object"] == "classify" and [len(r) for r in body["data"]] == [1, 1, 1]
    assert http.post("/predict", json={"inputs": "x", "model": "tiny-a"}).status_code == 422
    cosines = http.post("/similarity", json={"model": "tiny-a", "inputs": {
        "source_sentence": TEXTS[0], "sentences": TEXTS}}).json()
    assert len(cosines) == 3 and abs(cosines[0] - 1) < 1e-5
    info = http.get("/info", params={"model": "cls"}).json()
    assert info["model_type"]["classifier"]["id2label"] == {
        str(i): label for i, label in enumerate(CLASSIFIER_LABELS)}


def test_huggingface_inference_client_text_classification(more_app, http, hub_client_online):
    """TEI's documented client on a classifier: POST / answers /predict's labels (the model
    named in the header, as a Blitz serving several models needs)."""
    from huggingface_hub import InferenceClient

    client = InferenceClient(model=more_app, timeout=60,
                             headers={"serve_multiplexed_model_id": "cls"})
    expected = http.post("/predict", json={"inputs": TEXTS[0], "model": "cls"}).json()
    got = client.text_classification(TEXTS[0])
    assert [(p.label, round(p.score, 5)) for p in got] == [
        (p["label"], round(p["score"], 5)) for p in expected]
    best = client.text_classification(TEXTS[0], top_k=1)
    assert [p.label for p in best] == [expected[0]["label"]]
    sparse = http.post("/", json={"inputs": ["hybrid"]},
                       headers={"serve_multiplexed_model_id": "splade"})
    assert sparse.json() == http.post("/embed_sparse", json={"inputs": ["hybrid"],
                                                             "model": "splade"}).json()


async def test_the_same_over_the_handle(more_app):
    from ray import serve

    handle = serve.get_app_handle(APP)
    tokens = await handle.embed_all.remote(TEXTS, model="tiny-a")
    assert [rows.shape[1] for rows in tokens.embeddings] == [32, 32, 32]
    sparse = await handle.embed_sparse.remote(TEXTS, model="splade")
    assert sparse.dimension == 30522 and sparse.embeddings[0].indices.dtype == np.int32
    ranked = await handle.classify.remote(TEXTS, model="cls", raw_scores=True)
    assert len(ranked.predictions) == 3 and ranked.model == "cls"
    similar = await handle.similarity.remote(TEXTS[0], TEXTS, model="tiny-a")
    assert len(similar.scores) == 3 and abs(similar.scores[0] - 1) < 1e-5


def test_repeated_texts_are_hits_equal_bit_for_bit_and_counted(http):
    texts = [f"cached text {i}" for i in range(12)]  # more than one pool batch
    first, header = embed(http, texts)
    assert 'desc="hit 0 of 12"' in header
    again, header = embed(http, texts)
    assert 'desc="hit 12 of 12"' in header and again == first
    assert "model" not in timing.parse_header(header)  # no pool call at all
    mixed, header = embed(http, [texts[3], "a new one", texts[3]])
    assert 'desc="hit 2 of 3"' in header
    row = len(first) // 12
    assert mixed[:row] == first[3 * row:4 * row] == mixed[2 * row:]
    sliced, _ = embed(http, texts[:2], dimensions=8, dtype="int8")
    assert len(sliced) == 2 * 8
    r = http.post("/v1/embeddings", json={"input": texts[:2], "encoding_format": "float",
                                          "model": "tiny-a"})
    assert r.status_code == 200 and 'desc="hit 2 of 2"' in r.headers[timing.HEADER]

    def counted(samples) -> bool:
        ours = [s for s in samples if s.labels.get("application") == APP]
        return (total(ours, "ray_blitz_vector_cache_texts_total", model="tiny-a",
                      outcome="hit") >= 12 + 2 + 2
                and total(ours, "ray_blitz_vector_cache_texts_total", model="tiny-a",
                          outcome="miss") >= 12 + 1
                and total(ours, "ray_blitz_vector_cache_bytes") > 0
                and total(ours, "ray_blitz_requests_total", route="/embed_sparse",
                          status="200") >= 1)

    scrape_until(metrics_url(), counted)
