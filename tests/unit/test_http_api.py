"""The HTTP API on fake encoders, in process (no Ray): shapes, options, errors, auth, limits."""

from __future__ import annotations

import base64
import logging

import httpx
import numpy as np
import pytest

from blitz import codecs, timing
from blitz.http.api import HttpApi
from blitz.pool.dispatcher import ReplicaDispatcher
from blitz.settings.config import BlitzSettings
from tests.api_client import api_client, api_for
from tests.error_body import error_body

KEY = "sk-test-123"


class PoolRecordingDispatcher(ReplicaDispatcher):
    """Runs every job on the replica in process and records which pool each was sent to."""

    def __init__(self, settings, pools):
        super().__init__(settings, pools=pools)
        self.pools_asked: list[str] = []

    async def submit(self, pool, model_id, job):
        self.pools_asked.append(pool)
        return await super().submit(pool, model_id, job)


def make_api(extra: dict | None = None, pools=frozenset({"cpu"})) -> HttpApi:
    settings = BlitzSettings.from_args({
        "models": [{"id": "fake", "source": "fake:16", "max_seq_length": 8},
                   {"id": "fake8", "source": "fake:8"}],
        "limits": {"max_texts_per_request": 5, "max_chars_per_text": 100,
                   "max_body_bytes": 2048, "max_top_n": 3},
        **(extra or {}),
    })
    return api_for(settings, PoolRecordingDispatcher(settings, pools))


def make_client(extra: dict | None = None, pools=frozenset({"cpu"}),
                root_path: str = "") -> httpx.AsyncClient:
    return api_client(make_api(extra, pools), root_path=root_path)


@pytest.fixture
async def client():
    async with make_client() as c:
        yield c


def error_of(r: httpx.Response, status: int) -> dict:
    """The error's fields; Blitz's own shape unless the request spoke TEI's API."""
    assert r.status_code == status, r.text
    assert r.headers["x-request-id"]
    body = r.json()
    if isinstance(body["error"], dict):
        assert set(body["error"]) == {"message", "type", "param", "code"}
    return error_body(r)


async def test_native_embed_in_each_format(client):
    r = await client.post("/embed", content=codecs.pack({"texts": ["a", "b c"]}),
                          headers={"content-type": "application/msgpack"})
    msg = codecs.unpack(r.content)
    assert msg["shape"] == [2, 16] and msg["dtype"] == "float32"
    assert msg["usage"] == {"prompt_tokens": 7, "total_tokens": 7}
    assert r.headers["x-blitz-pool"] == "cpu" and float(r.headers["x-compute-time"]) >= 0
    r = await client.post("/embed", json={"texts": "a"}, headers={"accept": "application/json"})
    assert np.allclose(r.json()["embeddings"], msg["embeddings"][:1], atol=1e-6)
    r = await client.post("/embed", json={"inputs": "a"})  # TEI's body: TEI's [[float]]
    assert np.allclose(r.json(), msg["embeddings"][:1], atol=1e-6)
    r = await client.post("/embed", json={"texts": ["a"]},
                          headers={"accept": "application/octet-stream"})
    assert r.headers["x-blitz-shape"] == "1,16"
    assert np.allclose(np.frombuffer(r.content, "<f4"), msg["embeddings"][0])


async def test_dimensions_truncate_and_renormalize(client):
    r = await client.post("/embed", json={"texts": ["a"], "dimensions": 4},
                          headers={"accept": "application/json"})
    emb = np.array(r.json()["embeddings"])
    assert emb.shape == (1, 4) and np.isclose(np.linalg.norm(emb), 1.0, atol=1e-5)
    error = error_of(await client.post("/embed", json={"texts": ["a"], "dimensions": 17}), 422)
    assert "17" in error["message"] and "16" in error["message"]


@pytest.mark.parametrize(("dtype", "np_dtype", "width"), [
    ("float16", np.float16, 16), ("int8", np.int8, 16), ("uint8", np.uint8, 16),
    ("binary", np.int8, 2), ("ubinary", np.uint8, 2)])
async def test_output_dtypes(client, dtype, np_dtype, width):
    r = await client.post("/embed", content=codecs.pack({"texts": ["a", "b"], "dtype": dtype}),
                          headers={"content-type": "application/msgpack"})
    emb = codecs.unpack(r.content)["embeddings"]
    assert emb.dtype == np_dtype and emb.shape == (2, width)


async def test_openai_embeddings_shape_float_and_base64(client):
    r = await client.post("/v1/embeddings", json={"input": ["a", "b"], "model": "fake",
                                                  "user": "u1"})
    body = r.json()
    assert body["object"] == "list" and body["model"] == "fake"
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert body["data"][0]["object"] == "embedding" and len(body["data"][0]["embedding"]) == 16
    assert body["usage"] == {"prompt_tokens": 6, "total_tokens": 6}
    r = await client.post("/v1/embeddings", json={"input": "a", "model": "fake",
                                                  "encoding_format": "base64",
                                                  "dimensions": 8})
    vec = np.frombuffer(base64.b64decode(r.json()["data"][0]["embedding"]), "<f4")
    assert vec.shape == (8,)
    r = await client.post("/v1/embeddings", json={"input": [[1, 2, 3], [4]], "model": "fake"})
    assert len(r.json()["data"]) == 2
    error = error_of(await client.post("/v1/embeddings", json={"input": ["a", [1]]}), 422)
    assert "input" in error["message"]


async def test_rerank_shapes_and_top_n(client):
    r = await client.post("/v1/rerank", json={"query": "q", "documents": ["a", {"text": "b"},
                                                                          "c"],
                                              "top_n": 2, "return_documents": True})
    body = r.json()
    assert [set(x) for x in body["results"]] == [{"index", "relevance_score", "document"}] * 2
    scores = [x["relevance_score"] for x in body["results"]]
    assert scores == sorted(scores, reverse=True) and body["usage"]["total_tokens"] > 0
    error = error_of(await client.post("/rerank", json={"query": "q", "documents": ["a"],
                                                        "top_n": 4}), 413)
    assert "max_top_n" in error["message"]
    error_of(await client.post("/rerank", json={"query": "q", "documents": ["a"],
                                                "top_n": 0}), 422)
    error_of(await client.post("/rerank", json={"query": "", "documents": ["a"]}), 422)


async def test_models_routes(client):
    native = (await client.get("/models")).json()["data"]
    assert {m["id"]: m["dimension"] for m in native} == {"fake": 16, "fake8": 8}
    assert all({"kind", "max_seq_length"} <= set(m) for m in native)
    openai = (await client.get("/v1/models")).json()
    assert openai["object"] == "list"
    assert {"id", "object", "created", "owned_by"} <= set(openai["data"][0])


@pytest.mark.parametrize(("body", "status", "needle"), [
    ({"texts": ["x"] * 6}, 413, "max_texts_per_request"),
    ({"texts": ["x" * 101]}, 413, "max_chars_per_text"),
    ({"texts": ["a"] * 3 + ["w " * 20]}, None, None),
    ({"texts": ["w " * 20], "truncate": False}, 413, "input 0"),
    ({"texts": ["a"], "model": "nope"}, 404, "nope"),
    ({"texts": ["a"], "dtype": "int4"}, 422, "dtype"),
    ({"texts": ["a"], "prompt_name": "query"}, 422, "prompt_name"),
    ({"nothing": 1}, 422, "texts"),  # TEI's dialect (no "texts"): TEI's error body
    ([1, 2], 400, "object"),
])
async def test_errors_name_what_to_fix(client, body, status, needle):
    r = await client.post("/embed", json=body)
    if status is None:
        assert r.status_code == 200
        return
    assert needle in error_of(r, status)["message"]


async def test_body_limit_is_checked_before_decoding(client):
    r = await client.post("/embed", content=b"{" + b" " * 4000 + b"}",
                          headers={"content-type": "application/json"})
    assert "max_body_bytes" in error_of(r, 413)["message"]


async def test_malformed_bodies_are_400(client):
    error_of(await client.post("/embed", content=b"\xc1",
                               headers={"content-type": "application/msgpack"}), 400)
    error_of(await client.post("/embed", content=b"{bad json",
                               headers={"content-type": "application/json"}), 400)


@pytest.mark.parametrize(("method", "path", "allowed"), [
    ("GET", "/embed", {"POST"}), ("PUT", "/v1/embeddings", {"POST"}),
    ("DELETE", "/rerank", {"POST"}), ("POST", "/models", {"GET", "HEAD"}),
    ("POST", "/health", {"GET", "HEAD"}),
])
async def test_a_wrong_method_is_405_naming_the_allowed_ones(client, method, path, allowed):
    r = await client.request(method, path)
    error = error_of(r, 405)
    assert error["code"] == "method_not_allowed" and error["type"] == "invalid_request_error"
    assert set(r.headers["allow"].split(", ")) == allowed
    assert path in error["message"] and method in error["message"]


async def test_an_unknown_path_is_404(client):
    error = error_of(await client.post("/embeddingz", json={"texts": ["a"]}), 404)
    assert error["code"] == "not_found" and "/embeddingz" in error["message"]


async def test_routes_are_found_below_the_root_path():
    """Serve mounts the app under its route prefix: the prefix arrives as ``root_path``
    and the path still holds it (ASGI)."""
    async with make_client(root_path="/blitz") as c:
        r = await c.post("/embed", json={"texts": ["a"]}, headers={"accept": "application/json"})
        assert r.status_code == 200 and np.array(r.json()["embeddings"]).shape == (1, 16)
        assert (await c.get("/health")).status_code == 200
        assert error_of(await c.get("/embed"), 405)
        error = error_of(await c.get("/blitz"), 404)  # a path the prefix alone does not serve
        assert error["code"] == "not_found"
        r = await c.post("/embed/", json={"texts": ["a"]})  # Starlette's slash redirect
        assert r.status_code == 307 and r.headers["location"] == "http://blitz/blitz/embed"


async def test_unexpected_errors_are_500_with_request_id_and_no_internal_text(client, caplog,
                                                                              monkeypatch):
    from blitz.encoders.fake import FakeEncoder

    def explode(*args, **kwargs):
        raise RuntimeError("secret internal detail")

    assert (await client.post("/embed", json={"texts": ["a"]})).status_code == 200  # loaded
    monkeypatch.setattr(FakeEncoder, "embed", explode)  # then its model call fails
    with caplog.at_level(logging.ERROR, logger="blitz.http"):
        r = await client.post("/embed", json={"texts": ["a"]}, headers={"x-request-id": "req-42"})
    error = error_of(r, 500)
    assert "req-42" in error["message"] and "secret" not in r.text
    assert r.headers["x-request-id"] == "req-42"
    assert "req-42" in caplog.text and "secret internal detail" in caplog.text


async def test_api_keys(monkeypatch):
    monkeypatch.setenv("BLITZ_API_KEYS", "env-key")
    async with make_client({"auth": {"api_keys": [KEY]}}) as c:
        assert (await c.get("/health")).status_code == 200
        assert "missing" in error_of(await c.post("/embed", json={"texts": ["a"]}), 401)[
            "message"]
        r = await c.post("/embed", json={"texts": ["a"]}, headers={"authorization": "Bearer x"})
        assert error_of(r, 401)["code"] == "invalid_api_key"
        for key in (KEY, "env-key"):
            r = await c.post("/embed", json={"texts": ["a"]},
                             headers={"authorization": f"Bearer {key}"})
            assert r.status_code == 200


async def test_model_header_wins_over_body(client):
    r = await client.post("/embed", json={"texts": ["a"], "model": "fake"},
                          headers={"serve-multiplexed-model-id": "fake8"})
    assert r.json()["shape"] == [1, 8]


async def test_routes_to_gpu_pool_when_present():
    api = make_api({"routing": {"gpu_min_batch": 3}}, pools=frozenset({"cpu", "gpu"}))
    asked = api.service.dispatcher.pools_asked
    async with api_client(api) as c:
        r = await c.post("/embed", json={"texts": ["a", "b"]})
        assert r.headers["x-blitz-pool"] == "cpu" and asked == ["cpu"]
        r = await c.post("/v1/embeddings", json={"input": [[1]] * 4, "model": "fake"})
        assert r.headers["x-blitz-pool"] == "gpu" and asked == ["cpu", "gpu"]
        r = await c.post("/rerank", json={"query": "q", "documents": ["a"]})
        assert r.headers["x-blitz-pool"] == "cpu" and asked == ["cpu", "gpu", "cpu"]


async def test_jobs_of_every_kind_are_routed_and_sent_alike(tiny_dir):
    """/embed_all and /classify send jobs of their own kinds through the dispatcher's one
    call (``submit``), routed by the same rules as /embed."""
    api = make_api({"models": [{"id": "tiny", "source": str(tiny_dir), "cpu_backend": "torch"},
                               {"id": "cls", "source": "fake:3", "kind": "classifier"}],
                    "routing": {"gpu_min_batch": 3}}, pools=frozenset({"cpu", "gpu"}))
    asked = api.service.dispatcher.pools_asked
    async with api_client(api) as c:
        r = await c.post("/embed_all", json={"inputs": ["a b"], "model": "tiny"})
        assert r.status_code == 200, r.text
        assert r.headers["x-blitz-pool"] == "cpu" and asked == ["cpu"]
        r = await c.post("/classify", json={"input": ["a", "b", "c"], "model": "cls"})
        assert r.status_code == 200, r.text
        assert r.headers["x-blitz-pool"] == "gpu" and asked == ["cpu", "gpu"]


class TimedDispatcher(ReplicaDispatcher):
    """Stamps what the Serve dispatcher and a pool replica would measure."""

    async def submit(self, pool, model_id, job):
        result = await super().submit(pool, model_id, job)
        timing.record([result], ingress_queue=0.0001, call=0.002, pool=0.0015,
                      pool_queue=0.0001, worker_wait=0.0002, model=0.001)
        return result


async def test_every_reply_says_where_its_time_went():
    settings = BlitzSettings.from_args({"models": [{"id": "fake", "source": "fake:16"}]})
    async with api_client(settings, TimedDispatcher(settings)) as c:
        r = await c.post("/embed", json={"texts": ["a", "b"]})
        hops = timing.parse_header(r.headers["server-timing"])
        assert list(hops) == [e for e in timing.ENTRIES if e != "cache"]  # no cache here
        assert (hops["model"], hops["handle"], hops["pool-other"]) == (1.0, 0.5, 0.2)
        assert hops["total"] >= hops["ingress"] and hops["total"] == pytest.approx(
            float(r.headers["x-compute-time"]) * 1000, abs=0.01)
        r = await c.get("/health")  # no model work: the total alone
        assert list(timing.parse_header(r.headers["server-timing"])) == ["total"]


async def test_server_timing_can_be_turned_off():
    async with make_client({"ingress": {"server_timing": False}}) as c:
        r = await c.post("/embed", json={"texts": ["a"]})
        assert r.status_code == 200 and "server-timing" not in r.headers
