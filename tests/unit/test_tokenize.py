"""``/tokenize`` and ``/decode`` in process (no Ray): the model's own tokenizer on the
ingress, Hugging Face TEI's shapes, offsets in characters or UTF-8 bytes, limits and
errors."""

from __future__ import annotations

import asyncio

import pytest

from blitz import codecs
from blitz.http.api import HttpApi
from blitz.ingress import tokenizers, tokenizing
from blitz.settings.config import BlitzSettings
from tests.api_client import api_client, api_for
from tests.error_body import error_body
from tests.tiny_models import minilm_dir

TEXTS = ["Hello, world!", "naïve café — 東京 tokens"]


def make_api(limits: dict | None = None) -> HttpApi:
    settings = BlitzSettings.from_args({
        "models": [{"id": "minilm", "source": str(minilm_dir()),
                    "prompts": {"query": "query: "}},
                   {"id": "fake", "source": "fake:8"}],
        "limits": {"max_texts_per_request": 4, "max_chars_per_text": 200,
                   "max_token_ids_per_request": 50, **(limits or {})},
    })
    return api_for(settings)


@pytest.fixture
async def client():
    async with api_client(make_api()) as c:
        yield c


@pytest.fixture(scope="module")
def reference():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(minilm_dir()))


async def test_tokens_match_transformers_with_offsets_into_the_text(client, reference):
    r = await client.post("/tokenize", json={"inputs": TEXTS})
    assert r.status_code == 200, r.text
    rows = r.json()
    assert len(rows) == len(TEXTS)
    for text, row in zip(TEXTS, rows, strict=True):
        assert [t["id"] for t in row] == reference(text)["input_ids"]
        assert set(row[0]) == {"id", "text", "special", "start", "stop"}
        assert row[0] == {"id": reference.cls_token_id, "text": "[CLS]", "special": True,
                          "start": None, "stop": None}
        assert row[-1]["special"] and row[-1]["text"] == "[SEP]"
        for token in row[1:-1]:
            assert not token["special"]
            assert text[token["start"]:token["stop"]] == token["text"]


async def test_byte_offsets_count_utf8_as_tei_does(client):
    text = TEXTS[1]
    chars = (await client.post("/tokenize", json={"inputs": text})).json()[0]
    raw = (await client.post("/tokenize", json={"inputs": text, "offsets": "bytes"})).json()[0]
    data = text.encode()
    assert [t["id"] for t in chars] == [t["id"] for t in raw]
    for c, b in zip(chars[1:-1], raw[1:-1], strict=True):
        assert data[b["start"]:b["stop"]].decode() == c["text"] == b["text"]
    assert any(b["start"] != c["start"] for c, b in zip(chars[1:-1], raw[1:-1], strict=True))


async def test_options_specials_prompt_and_no_offsets(client, reference):
    bare = (await client.post("/tokenize", json={"inputs": "Hello", "add_special_tokens": False,
                                                 "return_offsets": False})).json()
    assert [t["id"] for t in bare[0]] == reference("Hello", add_special_tokens=False)["input_ids"]
    assert all(t["start"] is None and t["stop"] is None for t in bare[0])
    prompted = (await client.post("/tokenize", json={"inputs": "Hello",
                                                     "prompt_name": "query"})).json()[0]
    assert [t["id"] for t in prompted] == reference("query: Hello")["input_ids"]
    r = await client.post("/tokenize", json={"inputs": "Hello", "prompt_name": "nope"})
    assert r.status_code == 422 and error_body(r)["param"] == "prompt_name"


async def test_decode_round_trip_one_row_or_many_and_msgpack(client, reference):
    ids = [reference(t)["input_ids"] for t in TEXTS]
    r = await client.post("/decode", json={"ids": ids[0]})
    assert r.status_code == 200 and r.json() == [reference.decode(ids[0],
                                                                  skip_special_tokens=True)]
    r = await client.post("/decode", json={"ids": ids, "skip_special_tokens": False})
    assert r.json() == [reference.decode(row) for row in ids]
    assert r.json()[0].startswith("[CLS]")
    r = await client.post("/decode", content=codecs.pack({"ids": ids}),
                          headers={"content-type": "application/msgpack",
                                   "accept": "application/msgpack"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/msgpack"
    assert codecs.unpack(r.content) == [reference.decode(row, skip_special_tokens=True)
                                        for row in ids]


@pytest.mark.parametrize(("route", "body", "status", "param"), [
    ("/tokenize", {"inputs": []}, 422, "texts"),
    ("/tokenize", {"inputs": ["a"] * 5}, 413, "inputs"),
    ("/tokenize", {"inputs": "x" * 201}, 413, "texts"),
    ("/tokenize", {"inputs": "   "}, 422, "texts"),
    ("/tokenize", {"inputs": "a", "offsets": "words"}, 422, "offsets"),
    ("/tokenize", {"inputs": "a", "model": "nope"}, 404, "model"),
    ("/tokenize", {"inputs": "a", "model": "fake"}, 422, "model"),
    ("/decode", {"ids": []}, 422, "ids"),
    ("/decode", {"ids": [[]]}, 422, "ids"),
    ("/decode", {"ids": [1, True]}, 422, "ids"),
    ("/decode", {"ids": [1, 2.5]}, 422, "ids"),
    ("/decode", {"ids": [[1, 2], 3]}, 422, "ids"),
    ("/decode", {"ids": [0, 10**9]}, 422, "ids"),
    ("/decode", {"ids": [-1]}, 422, "ids"),
    ("/decode", {"ids": list(range(51))}, 413, "ids"),
    ("/decode", {"ids": [[1]] * 5}, 413, "ids"),
    ("/decode", {"ids": [[1] * 30, [1] * 30]}, 413, "ids"),
])
async def test_bad_requests_get_a_clear_4xx(client, route, body, status, param):
    r = await client.post(route, json=body)
    assert r.status_code == status, r.text
    error = error_body(r)
    assert error["param"] == param, error
    assert error["message"]


@pytest.mark.parametrize("bad", [2**63, 2**64 - 1])
async def test_an_id_past_int64_is_a_422_naming_the_id_and_the_range(client, bad):
    # an id in [2^63, 2^64) overflows numpy's int64: it must be a 422, not a 500
    for body, where in (({"ids": [1, bad]}, "ids[0][1]"),
                        ({"ids": [[1], [2, 3, bad]]}, "ids[1][2]")):
        for content, kind in ((codecs.dumps_json(body), "application/json"),
                              (codecs.pack(body), "application/msgpack")):
            r = await client.post("/decode", content=content, headers={"content-type": kind})
            assert r.status_code == 422, r.text
            error = error_body(r)  # TEI's shape (a string) or Blitz's (an object)
            message = error if isinstance(error, str) else error["message"]
            assert message.startswith(f"{where} = {bad} is not a token id of this model (0 to ")


async def test_the_tokenizer_opens_once_for_concurrent_callers(monkeypatch):
    opened = []
    real = tokenizers.open_tokenizer

    def counting(folder):
        opened.append(folder)
        return real(folder)

    monkeypatch.setattr(tokenizers, "open_tokenizer", counting)
    api = make_api()
    results = await asyncio.gather(*(api.tokens.tokenize("Hello", model="minilm")
                                     for _ in range(8)))
    assert len(opened) == 1
    assert len({tuple(t.id for t in r.tokens[0]) for r in results}) == 1


async def test_large_inputs_are_tokenized_off_the_loop(monkeypatch):
    threads = []
    real = tokenizing.tokenize

    def where(*args, **kwargs):
        import threading

        threads.append(threading.current_thread() is threading.main_thread())
        return real(*args, **kwargs)

    monkeypatch.setattr(tokenizing, "tokenize", where)
    api = make_api({"max_chars_per_text": 100_000})
    await api.tokens.tokenize("short", model="minilm")
    await api.tokens.tokenize("word " * 2000, model="minilm")
    assert threads == [True, False]


async def test_info_has_tei_fields_and_every_model(client):
    r = await client.get("/info")
    assert r.status_code == 200
    info = r.json()
    for key in ("model_id", "model_dtype", "model_type", "max_input_length",
                "max_client_batch_size", "max_batch_requests", "version"):
        assert key in info
    assert info["model_id"] == "minilm" and info["max_input_length"] == 256
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_client_batch_size"] == 4
    assert [m["id"] for m in info["models"]] == ["minilm", "fake"]
    # TEI's max_batch_tokens: the model's effective budget (a CPU pool's: 512)
    assert info["max_batch_tokens"] == 512 == info["pools"]["cpu"]["max_batch_tokens"]
    other = (await client.get("/info", params={"model": "fake"})).json()
    assert other["model_id"] == "fake"
    assert (await client.get("/info", params={"model": "nope"})).status_code == 404
