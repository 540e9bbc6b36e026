"""Bad input gets a clear error with the right status, in OpenAI's error shape."""

from __future__ import annotations

import pytest

from blitz import codecs
from tests.integration.conftest import MAX_TEXTS

MSGPACK = {"content-type": "application/msgpack"}


def _error(r, status):
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert r.headers["x-request-id"]
    return error


def test_malformed_msgpack_is_400(http):
    error = _error(http.post("/embed", content=b"\xc1\x00\x00", headers=MSGPACK), 400)
    assert "msgpack" in error["message"]


def test_unknown_model_is_404(http):
    r = http.post("/embed", content=codecs.pack({"texts": ["x"]}),
                  headers={**MSGPACK, "serve_multiplexed_model_id": "no-such-model"})
    error = _error(r, 404)
    assert "no-such-model" in error["message"] and error["code"] == "model_not_found"


@pytest.mark.parametrize("texts", [[], [""], "   "])
def test_empty_input_is_422(http, texts):
    error = _error(http.post("/embed", json={"texts": texts}), 422)
    assert "texts" in error["message"]


def test_too_many_texts_is_413_naming_the_limit(http):
    r = http.post("/embed", json={"texts": ["x"] * (MAX_TEXTS + 1)})
    error = _error(r, 413)
    assert "max_texts_per_request" in error["message"] and str(MAX_TEXTS) in error["message"]


def test_over_long_input_without_truncation_is_413_naming_its_index(http):
    texts = ["short"] * 12 + ["word " * 400]  # 13 texts: goes to the GPU pool, second chunk
    r = http.post("/embed", json={"texts": texts, "truncate": False, "model": "tiny-a"})
    error = _error(r, 413)
    assert "input 12" in error["message"]
    r = http.post("/embed", json={"texts": texts, "model": "tiny-a"})  # truncation is default
    assert r.status_code == 200


def test_model_that_fails_to_load_is_424_naming_it_without_its_path(http):
    r = http.post("/embed", json={"texts": ["x"], "model": "broken"})
    error = _error(r, 424)
    assert "'broken'" in error["message"]
    assert r.headers["x-request-id"].split(",")[0] in error["message"]
    assert "/nonexistent" not in r.text  # the cause is in the server log, not the reply
    again = http.post("/embed", json={"texts": ["x"], "model": "broken"})  # remembered
    assert again.status_code == 424 and "/nonexistent" not in again.text
    assert http.post("/embed", json={"texts": ["x"]}).status_code == 200  # others still serve


def test_cross_encoder_cannot_embed(http):
    error = _error(http.post("/embed", json={"texts": ["x"], "model": "tiny-ce"}), 422)
    assert "rerank" in error["message"]


def test_unknown_route_is_404(http):
    _error(http.get("/nope"), 404)
