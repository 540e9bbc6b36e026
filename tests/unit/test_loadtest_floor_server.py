"""loadtest.floor_server: the least HTTP server answers Blitz's native msgpack request with
the encoder's rows, and refuses what is not that request."""

from __future__ import annotations

import httpx
import numpy as np

from blitz import codecs
from loadtest.apis import get_api
from loadtest.floor_server import create_app


def fake_embed(texts: list[str]) -> np.ndarray:
    return np.array([[len(t), 1.0, 2.0] for t in texts], dtype=np.float32)


def client() -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(create_app(fake_embed)),
                             base_url="http://floor")


async def test_it_answers_the_native_msgpack_request_the_load_generator_sends():
    api = get_api("native-msgpack", None)
    request = api.request(["abc", "hello"], "minilm-int8")
    async with client() as c:
        r = await c.post(request.path, content=request.body, headers=dict(request.headers))
    assert r.status_code == 200 and r.headers["content-type"] == "application/msgpack"
    reply = api.parse(r.content, r.headers)
    assert np.array_equal(reply.embeddings, fake_embed(["abc", "hello"]))
    assert codecs.unpack(r.content)["model"] == "minilm-int8"


async def test_it_refuses_other_bodies_and_routes():
    async with client() as c:
        assert (await c.get("/health")).status_code == 200
        assert (await c.post("/embed", content=b"\x81\xa1x\x01")).status_code == 400  # {"x": 1}
        assert (await c.post("/embed", content=codecs.pack({"texts": []}))).status_code == 400
        assert (await c.post("/embed", content=codecs.pack({"texts": [1]}))).status_code == 400
        assert (await c.post("/embed", content=b"\xc1")).status_code == 400  # not msgpack
        assert (await c.get("/embed")).status_code == 404
        assert (await c.post("/other", content=b"")).status_code == 404
