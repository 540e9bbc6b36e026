"""Hostile input, metric labels, readiness and API keys on the HTTP API (fakes, no Ray)."""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import orjson
import pytest

from blitz import codecs
from blitz.encoders.base import Encoded
from blitz.errors import ModelLoadFailed
from blitz.http.middleware import warn_if_open
from blitz.ingress.service import RequestRecord
from blitz.pool.dispatcher import ReplicaDispatcher
from blitz.settings.config import AuthSettings, BlitzSettings
from tests.api_client import api_client

MSGPACK = {"content-type": "application/msgpack"}
JSON = "application/json"


class CountingDispatcher(ReplicaDispatcher):
    """Counts model calls; ``fail`` makes every call raise it."""

    def __init__(self, settings, fail: Exception | None = None):
        super().__init__(settings)
        self.calls = 0
        self.fail = fail

    async def submit(self, pool, model_id, job):
        self.calls += 1
        if self.fail is not None:
            raise self.fail
        return await super().submit(pool, model_id, job)


def build(extra: dict | None = None, fail: Exception | None = None):
    settings = BlitzSettings.from_args({
        "models": [{"id": "fake", "source": "fake:8"}],
        "limits": {"max_texts_per_request": 16, "max_body_bytes": 64 * 1024 * 1024},
        **(extra or {})})
    observed: list[tuple] = []

    def observer(record: RequestRecord, status: int, seconds: float) -> None:
        observed.append((record.route, record.model, record.pool, status, record.texts))

    dispatcher = CountingDispatcher(settings, fail)
    client = api_client(settings, dispatcher, observer=observer)
    return client, observed, dispatcher


# ---- hostile bodies are refused before they are built or validated --------------------

HOSTILE = [
    ("/v1/embeddings", orjson.dumps({"input": [0.5] * 500_000}), "application/json", 413),
    ("/v1/embeddings", orjson.dumps({"input": [0.5] * 2_000_000}), "application/json", 413),
    ("/embed", codecs.pack({"texts": [{}] * 2_000_000}), "application/msgpack", 413),
    ("/embed", b'{"texts": [' + b"[]," * 3_000_000 + b"[]]}", "application/json", 413),
    ("/v1/embeddings", orjson.dumps({"input": [[True] * 512] * 16}), "application/json", 422),
    ("/v1/embeddings", orjson.dumps({"input": [1] * 2_000_000}), "application/json", 413),
    ("/rerank", orjson.dumps({"query": "q", "documents": [{}] * 100_000}), "application/json",
     413),
    ("/embed", b"[" * 200_000 + b"]" * 200_000, "application/json", 413),
]


@pytest.mark.parametrize(("route", "body", "content_type", "status"), HOSTILE,
                         ids=[f"{r}-{len(b)}-{s}" for r, b, _, s in HOSTILE])
async def test_hostile_bodies_are_refused_with_a_clear_4xx(route, body, content_type, status):
    client, _, dispatcher = build()
    async with client:
        r = await client.post(route, content=body, headers={"content-type": content_type})
    assert r.status_code == status, r.text[:300]
    error = r.json()["error"]
    assert len(error["message"]) < 300 and dispatcher.calls == 0
    if status == 413:
        assert "max_texts_per_request" in error["message"] or "lists and objects" in \
            error["message"] or "max_token_ids_per_request" in error["message"]


@pytest.mark.parametrize("body", [
    {"texts": ["a"], "dimensions": True},
    {"texts": ["a"], "normalize": 1},
    {"texts": ["a"], "truncate": "yes"},
])
async def test_booleans_and_numbers_are_not_interchangeable(body):
    client, _, _ = build()
    async with client:
        r = await client.post("/embed", json=body)
    assert r.status_code == 422, r.text


async def test_openai_boolean_input_is_not_token_ids():
    client, _, dispatcher = build()
    async with client:
        r = await client.post("/v1/embeddings", json={"input": [True, False], "model": "fake"})
    assert r.status_code == 422 and "token ids" in r.json()["error"]["message"]
    assert dispatcher.calls == 0


# ---- metric labels come from bounded sets ----------------------------------------------

async def test_unknown_routes_and_models_get_bounded_metric_labels():
    client, observed, _ = build()
    async with client:
        r = await client.get("/zz" + "z" * 2000)
        assert r.status_code == 404 and len(r.json()["error"]["message"]) < 200
        r = await client.post("/embed", json={"texts": ["a"], "model": "m" * 2000})
        assert r.status_code == 404
        assert len(r.json()["error"]["message"]) < 200  # the id is echoed truncated
        assert (await client.post("/embed", json={"texts": ["a"]})).status_code == 200
        assert (await client.get("/embed")).status_code == 405
    assert observed == [("other", "", "", 404, 0), ("/embed", "other", "", 404, 1),
                        ("/embed", "fake", "cpu", 200, 1), ("/embed", "", "", 405, 0)]


async def test_each_http_request_is_observed_once_with_its_status():
    client, observed, _ = build({"auth": {"api_keys": ["k-123"]}})
    async with client:
        assert (await client.post("/embed", json={"texts": ["a", "b"]})).status_code == 401
        r = await client.post("/v1/embeddings", json={"input": [[1, 2], [3]]},
                              headers={"authorization": "Bearer k-123"})
        assert r.status_code == 200
        r = await client.post("/rerank", json={"query": "q", "documents": ["a"] * 17},
                              headers={"authorization": "Bearer k-123"})
        assert r.status_code == 413
        assert (await client.get("/health")).status_code == 200
    assert observed == [("/embed", "", "", 401, 0), ("/v1/embeddings", "fake", "cpu", 200, 2),
                        ("/rerank", "", "", 413, 0), ("/health", "", "", 200, 0)]


# ---- readiness says nothing internal and calls no model --------------------------------

async def test_ready_follows_the_default_models_load_failures_and_hides_the_cause(caplog):
    secret = "directory '/srv/models/secret-dir/bge' does not exist"
    client, _, dispatcher = build(fail=ModelLoadFailed(secret, model="fake"))
    with caplog.at_level(logging.WARNING, logger="blitz"):
        async with client:
            assert (await client.get("/ready")).status_code == 200
            assert (await client.post("/embed", json={"texts": ["a"]})).status_code == 424
            failed = await client.get("/ready")
            dispatcher.fail = None
            assert (await client.post("/embed", json={"texts": ["a"]})).status_code == 200
            again = await client.get("/ready")
    assert failed.status_code == 503 and failed.headers["retry-after"]
    assert "secret" not in failed.text and "not ready" in failed.json()["error"]["message"]
    assert again.status_code == 200
    assert dispatcher.calls == 2  # the two requests; readiness made no model call
    assert "secret-dir" in caplog.text  # the cause is in the log


async def test_model_load_failures_name_the_model_not_the_cause(caplog):
    client, _, _ = build(fail=ModelLoadFailed("s3://bucket/secret-prefix is missing",
                                              model="fake"))
    with caplog.at_level(logging.ERROR, logger="blitz"):
        async with client:
            r = await client.post("/embed", json={"texts": ["a"]})
    assert r.status_code == 424
    message = r.json()["error"]["message"]
    assert "'fake'" in message and r.headers["x-request-id"] in message
    assert "secret" not in r.text and "secret-prefix" in caplog.text


# ---- API keys ------------------------------------------------------------------------

def test_required_auth_refuses_to_start_without_keys(monkeypatch):
    monkeypatch.delenv("BLITZ_API_KEYS", raising=False)
    with pytest.raises(ValueError, match="auth.required"):
        build({"auth": {"required": True}})


async def test_keys_are_checked_and_startup_says_whether_they_are_on(caplog, monkeypatch):
    monkeypatch.delenv("BLITZ_API_KEYS", raising=False)
    with caplog.at_level(logging.INFO, logger="blitz"):
        client, _, _ = build({"auth": {"api_keys": ["k-123"], "required": True}})
    assert "API keys on" in caplog.text
    async with client:
        assert (await client.post("/embed", json={"texts": ["a"]})).status_code == 401
        wrong = {"authorization": "Bearer k-12"}  # a prefix of the key
        assert (await client.post("/embed", json={"texts": ["a"]},
                                  headers=wrong)).status_code == 401
        right = {"authorization": "Bearer k-123"}
        assert (await client.post("/embed", json={"texts": ["a"]},
                                  headers=right)).status_code == 200
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="blitz"):
        build()
    assert "API keys off" in caplog.text


@pytest.mark.parametrize("host, keys, warned", [
    ("0.0.0.0", [], True), ("::", [], True), ("10.1.2.3", [], True),
    ("127.0.0.1", [], False), ("localhost", [], False), ("::1", [], False),
    ("0.0.0.0", ["k-1"], False), (None, [], False)])
def test_listening_beyond_loopback_without_keys_is_a_warning(caplog, monkeypatch, host, keys,
                                                             warned):
    monkeypatch.delenv("BLITZ_API_KEYS", raising=False)
    with caplog.at_level(logging.WARNING, logger="blitz"):
        assert warn_if_open(host, AuthSettings(api_keys=keys)) is warned
    assert ("with API keys off" in caplog.text) is warned


# ---- model sources are for operators --------------------------------------------------

async def test_models_shows_sources_only_to_operators(monkeypatch):
    monkeypatch.delenv("BLITZ_API_KEYS", raising=False)
    for extra, key, shown in [({}, None, False),
                              ({"auth": {"show_model_sources": True}}, None, True),
                              ({"auth": {"api_keys": ["k-1"]}}, "k-1", True)]:
        client, _, _ = build(extra)
        headers = {"authorization": f"Bearer {key}"} if key else {}
        async with client:
            models = (await client.get("/models", headers=headers)).json()["data"]
            listed = (await client.get("/v1/models", headers=headers)).text
        assert [("source" in m) for m in models] == [shown], extra
        assert "fake:8" not in listed
        if shown:
            assert models[0]["source"] == "fake:8"


# ---- refused before the model runs ---------------------------------------------------

class RemoteModelDispatcher(CountingDispatcher):
    """A model whose files are elsewhere (hf:), so its dimension is unknown until it answers."""

    async def submit(self, pool, model_id, job):
        self.calls += 1
        n = len(job)
        return Encoded(np.ones((n, 8), np.float32), np.ones(n, np.int64), n)


async def test_a_bad_accept_layout_and_too_many_dimensions_are_refused_before_the_model():
    settings = BlitzSettings.from_args({"models": [{"id": "remote", "source": "hf:org/remote"}]})
    dispatcher = RemoteModelDispatcher(settings)
    async with api_client(settings, dispatcher) as client:
        r = await client.post("/embed", json={"texts": ["a"]},
                              headers={"accept": "application/msgpack; layout=nope"})
        assert r.status_code == 400 and dispatcher.calls == 0
        assert (await client.post("/embed", json={"texts": ["a"]})).status_code == 200
        assert dispatcher.calls == 1  # the model's dimension (8) is known from here on
        r = await client.post("/embed", json={"texts": ["a"], "dimensions": 16})
        assert r.status_code == 422 and "dimension 8" in r.text
        assert dispatcher.calls == 1


async def test_bodies_read_at_once_share_one_bound_and_give_it_back():
    """Two bodies that each fit ``max_body_bytes`` but not together in
    ``max_buffered_bytes``: the second is a 503 while the first is still arriving, and every
    byte is given back once the first ends (here: its client leaves mid-body)."""
    client, _, dispatcher = build({"limits": {"max_body_bytes": 64 * 1024,
                                              "max_buffered_bytes": 96 * 1024}})
    api = client._transport.app  # type: ignore[attr-defined]
    arrived = asyncio.Event()
    leave = asyncio.Event()

    async def slow_body():
        yield b'{"texts": ["' + b"a" * 60_000
        arrived.set()
        await leave.wait()
        raise ConnectionResetError("the client left")

    async with client:
        first = asyncio.ensure_future(client.post("/embed", content=slow_body(),
                                                  headers={"content-type": JSON}))
        await arrived.wait()
        r = await client.post("/embed", json={"texts": ["b" * 50_000]})
        assert r.status_code == 503 and r.headers["retry-after"]
        leave.set()
        assert (await first).status_code >= 400  # nobody reads it: the client has gone
        assert api._buffered == 0
        assert (await client.post("/embed", json={"texts": ["b" * 50_000]})).status_code == 200
    assert dispatcher.calls == 1


async def test_a_body_that_stops_arriving_is_answered_408_and_gives_its_bytes_back():
    """The ingress reads a body under a deadline of its own: one that does
    not arrive within ``limits.body_timeout_s`` is a 408 closing the connection."""
    client, _, dispatcher = build({"limits": {"body_timeout_s": 0.2}})
    api = client._transport.app  # type: ignore[attr-defined]
    stalled = asyncio.Event()

    async def stalled_body():
        yield b'{"texts": ["' + b"a" * 1000
        await stalled.wait()  # never set: the client sends nothing more
        yield b'"]}'

    async with client:
        r = await asyncio.wait_for(client.post("/embed", content=stalled_body(),
                                               headers={"content-type": JSON}), 10)
        assert r.status_code == 408 and r.headers["connection"] == "close"
        assert r.json()["error"]["code"] == "request_timeout"
        assert "limits.body_timeout_s" in r.json()["error"]["message"]
        assert api._buffered == 0
        assert (await client.post("/embed", json={"texts": ["fine"]})).status_code == 200
    assert dispatcher.calls == 1
