"""``/tokenize``, ``/decode`` and ``/info`` on the real app, over HTTP and the handle:
the ids ``/tokenize`` gives are the ids ``/v1/embeddings`` takes for the same vector."""

from __future__ import annotations

import numpy as np

from tests.integration.test_embed_http import cosines

TEXTS = ["A man is eating food.", "Vectors power search, fast."]


def test_tokenize_ids_embed_as_the_text_does(http, reference):
    rows = http.post("/tokenize", json={"inputs": TEXTS, "model": "minilm",
                                        "add_special_tokens": False}).json()
    ids = [[t["id"] for t in row] for row in rows]
    assert all(not t["special"] for row in rows for t in row)
    by_ids = http.post("/v1/embeddings", json={"input": ids, "model": "minilm",
                                              "encoding_format": "float"}).json()
    by_text = http.post("/v1/embeddings", json={"input": TEXTS, "model": "minilm",
                                               "encoding_format": "float"}).json()
    a = np.array([d["embedding"] for d in by_ids["data"]], dtype=np.float32)
    b = np.array([d["embedding"] for d in by_text["data"]], dtype=np.float32)
    assert cosines(a, b).min() >= 0.99999
    assert by_ids["usage"] == by_text["usage"]
    decoded = http.post("/decode", json={"ids": ids, "model": "minilm"}).json()
    tokenizer = reference("minilm").tokenizer
    assert decoded == [tokenizer.decode(row, skip_special_tokens=True) for row in ids]


def test_tokenize_per_model_and_metrics_route(http):
    a = http.post("/tokenize", json={"inputs": "hello"},
                  headers={"serve_multiplexed_model_id": "tiny-a"})
    assert a.status_code == 200 and a.json()[0][0]["special"]
    assert http.post("/tokenize", json={"inputs": "hello", "model": "slow"}).status_code == 422


def test_info_over_http(http):
    info = http.get("/info").json()
    assert info["model_id"] == "minilm" and info["max_input_length"] == 256
    assert {m["id"] for m in info["models"]} >= {"minilm", "tiny-ce"}
    assert info["pools"]["cpu"]["max_batch_size"] == 8


async def test_handle_api(blitz_app):
    from ray import serve

    handle = serve.get_app_handle("it-main")
    tokens = await handle.tokenize.remote(TEXTS, model="minilm")
    assert tokens.model == "minilm" and len(tokens.tokens) == 2
    assert tokens.tokens[0][1].text == "A" and tokens.tokens[0][1].start == 0  # its own text
    decoded = await handle.decode.remote([[t.id for t in row] for row in tokens.tokens],
                                         model="minilm")
    assert decoded.texts == [t.lower() for t in TEXTS]
    info = await handle.info.remote("tiny-ce")
    assert info["model_type"] == {"reranker": {}}
