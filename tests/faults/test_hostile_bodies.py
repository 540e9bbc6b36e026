"""Fault: hostile bodies within the size limit, while /health is polled.

Each body is refused with a 4xx in under a second, and /health keeps answering
meanwhile (no body freezes the ingress's event loop).
"""

from __future__ import annotations

import asyncio
import time

import httpx
import msgpack
import orjson
import pytest

from blitz import codecs
from tests.faults.conftest import small_app

APP = "fault-hostile"
JSON, MSGPACK = "application/json", "application/msgpack"
BODIES = {
    "500k floats (1.9 MiB JSON)": ("/v1/embeddings", orjson.dumps({"input": [0.5] * 500_000}),
                                   JSON),
    "2M floats (10 MB JSON)": ("/v1/embeddings", orjson.dumps({"input": [0.5] * 2_000_000}),
                               JSON),
    "2M empty maps (msgpack)": ("/embed", codecs.pack({"texts": [{}] * 2_000_000}), MSGPACK),
    "4M empty lists (12 MB JSON)": ("/embed", b'{"texts":[' + b"[]," * 4_000_000 + b"[]]}",
                                    JSON),
    "boolean token ids": ("/v1/embeddings", orjson.dumps({"input": [[True] * 500] * 2000}),
                          JSON),
    "deep nesting": ("/embed", b"[" * 100_000 + b"]" * 100_000, JSON),
    # an open string of escaped quotes after the brackets: quadratic for a backtracking
    # pre-scan of strings (25 minutes for 1 MB); the second just over the container limit
    "escaped quotes after 5000 [ (395 KiB)": (
        "/embed", b"[" * 5000 + b'"' + b'\\"' * 200_000, JSON),
    "escaped quotes after 4200 [ (297 KiB)": (
        "/v1/embeddings", b"[" * 4200 + b'"' + b'\\"' * 150_000, JSON),
    # the linear-cost families of tests/unit/test_fuzz_codecs.py, a few MiB each
    "escape-heavy string (2.9 MiB)": (
        "/embed", b'{"texts":["' + b'[\\"' * 1_000_000 + b'"]}', JSON),
    "unterminated escape-heavy string (4.8 MiB)": (
        "/embed", b'{"texts":["' + b'{\\\\\\"' * 1_000_000, JSON),
    "strings holding brackets (3.8 MiB)": (
        "/embed", b'{"texts":[' + b'"[{",' * 800_000 + b'""]}', JSON),
    "many keys (4.3 MiB)": (
        "/embed", b"{" + b",".join(b'"key-%07d":0' % i for i in range(280_000)) + b"}", JSON),
    "deep maps (4 MiB)": ("/embed", b'{"a":' * 700_000 + b"1" + b"}" * 700_000, JSON),
    "msgpack array of 500k dimensions (4.3 MiB)": (
        "/embed", msgpack.packb({"texts": ["a"], "x": {
            b"nd": True, b"type": "<f4", b"kind": b"", b"shape": [2**63] * 500_000,
            b"data": b""}}), MSGPACK),
}


@pytest.fixture(scope="module")
def hostile_app(deploy):
    return deploy(APP, small_app([{"id": "fake", "source": "fake:8"}]))


@pytest.mark.parametrize("name", list(BODIES))
async def test_hostile_body_is_refused_fast_while_health_answers(hostile_app, name):
    route, body, content_type = BODIES[name]
    health: list[float] = []
    done = asyncio.Event()
    async with httpx.AsyncClient(base_url=hostile_app, timeout=30) as client:
        assert (await client.get("/health")).status_code == 200

        async def poll_health() -> None:
            while not done.is_set():
                started = time.monotonic()
                r = await client.get("/health")
                assert r.status_code == 200
                health.append(time.monotonic() - started)
                await asyncio.sleep(0.02)

        poller = asyncio.ensure_future(poll_health())
        started = time.monotonic()
        r = await client.post(route, content=body, headers={"content-type": content_type})
        seconds = time.monotonic() - started
        done.set()
        await poller
    print(f"\n{name}: {r.status_code} in {seconds:.3f} s; slowest /health "
          f"{max(health):.3f} s of {len(health)}")
    assert 400 <= r.status_code < 500, r.text[:300]
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert seconds < 1.0
    assert health and max(health) < 1.0
