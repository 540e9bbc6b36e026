"""The Python client against httpx.MockTransport: one implementation, sync and async."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from blitz import codecs
from blitz.client import AsyncClient, BlitzHTTPError, Client

EMB = np.arange(6, dtype=np.float32).reshape(2, 3)


def handler(request: httpx.Request) -> httpx.Response:
    if request.headers.get("authorization") != "Bearer k":
        return httpx.Response(401, json={"error": {"message": "invalid API key",
                                                   "type": "authentication_error",
                                                   "param": None, "code": "invalid_api_key"}})
    if request.url.path == "/embed":
        body = codecs.unpack(request.content)
        assert request.headers["serve_multiplexed_model_id"] == body["model"] == "m"
        assert body["texts"] == ["a", "b"] and body["normalize"] is False
        return httpx.Response(200, content=codecs.pack({"embeddings": EMB}),
                              headers={"content-type": "application/msgpack"})
    if request.url.path == "/models":
        return httpx.Response(200, json={"data": [{"id": "m"}]})
    return httpx.Response(200, content=codecs.pack({"results": [{"index": 0}]}),
                          headers={"content-type": "application/msgpack"})


def test_sync_client():
    with Client("http://x", api_key="k", transport=httpx.MockTransport(handler)) as c:
        emb = c.embed(["a", "b"], model="m", normalize=False)
        assert np.array_equal(emb, EMB) and not emb.flags.writeable
        assert c.models() == [{"id": "m"}]
        assert c.rerank("q", ["d"], model="m")["results"][0]["index"] == 0
    with Client("http://x", api_key="bad", transport=httpx.MockTransport(handler)) as c:
        with pytest.raises(BlitzHTTPError) as info:
            c.embed(["a"], model="m")
        assert info.value.status == 401 and info.value.code == "invalid_api_key"


async def test_async_client():
    async with AsyncClient("http://x", api_key="k",
                           transport=httpx.MockTransport(handler)) as c:
        assert np.array_equal(await c.embed(["a", "b"], model="m", normalize=False), EMB)
        assert await c.models() == [{"id": "m"}]
