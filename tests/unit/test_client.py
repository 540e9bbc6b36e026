"""The Python client against the real HTTP API (``HttpApi`` on fake encoders, in process):
one implementation, sync and async, with the request bodies' options as keywords."""

from __future__ import annotations

import anyio.from_thread
import httpx
import numpy as np
import pytest

from blitz.client import AsyncClient, BlitzHTTPError, Client
from blitz.http.api import HttpApi
from blitz.settings.config import BlitzSettings
from tests.api_client import api_for, api_transport

KEY = "sk-client-test"


@pytest.fixture
def api() -> HttpApi:
    settings = BlitzSettings.from_args({
        "models": [{"id": "fake", "source": "fake:16", "max_seq_length": 8,
                    "prompts": {"query": "query: "},
                    "instruction_template": "Instruct: {instruction}\nQuery:"},
                   {"id": "fake8", "source": "fake:8"}],
        "auth": {"api_keys": [KEY]},
    })
    return api_for(settings)


class BlockingASGITransport(httpx.BaseTransport):
    """httpx's ASGITransport for a blocking client: each request runs on a portal's loop."""

    def __init__(self, app: HttpApi, portal: anyio.from_thread.BlockingPortal):
        self._transport = api_transport(app)
        self._portal = portal

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return self._portal.call(self._send, request)

    async def _send(self, request: httpx.Request) -> httpx.Response:
        response = await self._transport.handle_async_request(request)
        return httpx.Response(response.status_code, headers=response.headers,
                              content=await response.aread())


@pytest.fixture
def client(api):
    with anyio.from_thread.start_blocking_portal() as portal, \
            Client("http://blitz", api_key=KEY,
                   transport=BlockingASGITransport(api, portal)) as c:
        yield c


@pytest.fixture
async def async_client(api):
    async with AsyncClient("http://blitz", api_key=KEY,
                           transport=api_transport(api)) as c:
        yield c


def test_sync_embed_reads_the_reply_without_a_copy(client):
    emb = client.embed(["a", "b c"], model="fake")
    assert emb.shape == (2, 16) and emb.dtype == np.float32 and not emb.flags.writeable
    assert np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    assert client.embed("a", model="fake8").shape == (1, 8)  # the model header is sent
    assert client.embed("a").shape == (1, 16)  # no model: the server's default


def test_sync_embed_options_reach_the_server(client):
    raw = client.embed(["a b"], model="fake", normalize=False)
    assert not np.isclose(np.linalg.norm(raw), 1.0)
    assert client.embed(["a"], model="fake", dimensions=4).shape == (1, 4)
    assert client.embed(["a"], model="fake", dtype="ubinary").dtype == np.uint8
    assert not np.allclose(client.embed(["a"], model="fake", prompt_name="query"),
                           client.embed(["a"], model="fake"))
    assert np.allclose(client.embed(["a"], model="fake", instruction="find"),
                       client.embed(["Instruct: find\nQuery:a"], model="fake"))
    with pytest.raises(BlitzHTTPError) as info:
        client.embed(["w " * 20], model="fake", truncate=False)
    assert info.value.status == 413 and info.value.code == "input_too_long"


def test_sync_rerank_and_models(client):
    ranked = client.rerank("q", ["a", "b", "c"], model="fake", top_n=2, return_documents=True)
    assert len(ranked["results"]) == 2 and {"index", "relevance_score", "document"} == set(
        ranked["results"][0])
    assert {m["id"] for m in client.models()} == {"fake", "fake8"}


def test_errors_carry_status_code_and_request_id(api):
    with anyio.from_thread.start_blocking_portal() as portal, \
            Client("http://blitz", api_key="wrong",
                   transport=BlockingASGITransport(api, portal)) as c:
        with pytest.raises(BlitzHTTPError) as info:
            c.embed(["a"], model="fake")
    assert info.value.status == 401 and info.value.code == "invalid_api_key"
    assert info.value.message == "invalid API key" and info.value.request_id


def test_a_misspelt_option_is_a_type_error_before_any_request(client):
    with pytest.raises(TypeError, match="normalise"):
        client.embed(["a"], model="fake", normalise=False)
    with pytest.raises(TypeError, match="top_k"):
        client.rerank("q", ["a"], top_k=1)


async def test_async_client(async_client):
    emb = await async_client.embed(["a", "b"], model="fake", dimensions=8)
    assert emb.shape == (2, 8) and not emb.flags.writeable
    ranked = await async_client.rerank("q", ["a", "b"], model="fake8", top_n=1)
    assert len(ranked["results"]) == 1 and ranked["model"] == "fake8"
    assert len(await async_client.models()) == 2
    with pytest.raises(TypeError, match="normalise"):
        await async_client.embed(["a"], normalise=False)
    with pytest.raises(BlitzHTTPError) as info:
        await async_client.embed(["a"], model="nope")
    assert info.value.status == 404 and info.value.code == "model_not_found"
