"""The portable msgpack layout (string keys, array bytes + shape + dtype): its reply shape
through the HTTP API on fake encoders, and a real JavaScript decoder reading it.

The Node test serves ``HttpApi`` with uvicorn on 127.0.0.1 and runs
``tests/js/portable_check.mjs``, which calls the API through the example client
``examples/js/blitz.mjs`` with ``@msgpack/msgpack`` (installed by ``scripts/install.sh dev``
into ``examples/js/node_modules``)."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import httpx
import msgpack
import numpy as np
import pytest

from blitz import codecs
from blitz.http.api import HttpApi
from blitz.settings.config import BlitzSettings
from tests.api_client import api_client, api_for
from tests.served import served

ROOT = Path(__file__).resolve().parents[2]
TEXTS = ["a", "b c", "d e f"]
PORTABLE = "application/msgpack; layout=portable"
# output dtype -> (numpy's dtype.str on the wire, columns for the 16-wide fake model)
DTYPES = {"float32": ("<f4", 16), "float16": ("<f2", 16), "int8": ("|i1", 16),
          "uint8": ("|u1", 16), "binary": ("|i1", 2), "ubinary": ("|u1", 2)}


def make_api() -> HttpApi:
    settings = BlitzSettings.from_args({"models": [{"id": "fake", "source": "fake:16"}]})
    return api_for(settings)


@pytest.fixture
async def client():
    async with api_client(make_api()) as c:
        yield c


async def numpy_layout(client: httpx.AsyncClient, dtype: str) -> np.ndarray:
    r = await client.post("/embed", json={"texts": TEXTS, "dtype": dtype},
                          headers={"accept": "application/msgpack"})
    return codecs.unpack(r.content)["embeddings"]


def plain_unpack(data: bytes) -> dict:
    """What a decoder without numpy hooks sees."""
    return msgpack.unpackb(data, raw=False)


def map_key_types(obj: object) -> set[type]:
    """The types of every map key in ``obj``, at any depth."""
    if isinstance(obj, dict):
        return {type(k) for k in obj}.union(*map(map_key_types, obj.values()))
    if isinstance(obj, list):
        return set().union(*map(map_key_types, obj))
    return set()


@pytest.mark.parametrize("dtype", list(DTYPES))
async def test_portable_reply_has_string_keys_and_rebuilds_the_array(client, dtype):
    expected = await numpy_layout(client, dtype)
    r = await client.post("/embed", json={"texts": TEXTS, "dtype": dtype},
                          headers={"accept": PORTABLE})
    assert r.headers["content-type"] == "application/msgpack"
    reply = plain_unpack(r.content)
    assert map_key_types(reply) == {str}
    assert set(reply) == {"model", "embeddings", "shape", "dtype", "usage"}
    wire_dtype, width = DTYPES[dtype]
    assert reply["shape"] == [3, width] and reply["dtype"] == wire_dtype
    assert isinstance(reply["embeddings"], bytes)
    array = codecs.from_portable(reply["embeddings"], reply["shape"], reply["dtype"])
    assert array.dtype == expected.dtype and np.array_equal(array, expected)


async def test_the_default_numpy_layout_has_bin_keys(client):
    r = await client.post("/embed", content=codecs.pack({"texts": TEXTS}),
                          headers={"content-type": "application/msgpack"})
    assert map_key_types(plain_unpack(r.content)) == {str, bytes}


async def test_the_body_field_selects_the_layout_and_wins_over_accept(client):
    r = await client.post("/embed", json={"texts": TEXTS, "layout": "portable"},
                          headers={"accept": "application/msgpack"})
    assert plain_unpack(r.content)["dtype"] == "<f4"
    r = await client.post("/embed", json={"texts": TEXTS, "layout": "numpy"},
                          headers={"accept": PORTABLE})
    assert codecs.unpack(r.content)["embeddings"].shape == (3, 16)
    r = await client.post("/embed", content=codecs.pack({"texts": TEXTS}),
                          headers={"accept": "*/*", "content-type": "application/msgpack"})
    assert codecs.unpack(r.content)["dtype"] == "float32"  # the default stays msgpack-numpy
    r = await client.post("/embed", json={"texts": TEXTS}, headers={"accept": "*/*"})
    assert r.json()["dtype"] == "float32"  # a JSON body names no format: JSON back


async def test_json_and_raw_replies_ignore_the_layout(client):
    r = await client.post("/embed", json={"texts": TEXTS, "layout": "portable"},
                          headers={"accept": "application/json"})
    assert np.array(r.json()["embeddings"]).shape == (3, 16) and r.json()["dtype"] == "float32"
    r = await client.post("/embed", json={"texts": TEXTS, "layout": "portable"},
                          headers={"accept": "application/octet-stream"})
    assert r.headers["x-blitz-shape"] == "3,16" and len(r.content) == 3 * 16 * 4


async def test_an_unknown_layout_names_the_known_ones(client):
    r = await client.post("/embed", json={"texts": TEXTS},
                          headers={"accept": "application/msgpack; layout=portabel"})
    assert r.status_code == 400
    assert "numpy, portable" in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "accept"
    r = await client.post("/embed", json={"texts": TEXTS, "layout": "js"})
    assert r.status_code == 422 and r.json()["error"]["param"] == "layout"


async def test_rerank_msgpack_replies_are_portable_already(client):
    r = await client.post("/rerank", json={"query": "a", "documents": ["a", "b"],
                                            "return_documents": True},
                          headers={"accept": "application/msgpack"})
    reply = plain_unpack(r.content)
    assert map_key_types(reply) == {str} and len(reply["results"]) == 2


# ---- a real JavaScript decoder -------------------------------------------------------------

def node_and_package() -> str:
    """Node's path; fails (never skips) when Node or the installed package is missing."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not on PATH: the portable layout is tested with a JavaScript "
                    "decoder (install Node 18+, then bash scripts/install.sh dev)")
    if not (ROOT / "examples/js/node_modules/@msgpack/msgpack/package.json").is_file():
        pytest.fail("examples/js/node_modules lacks @msgpack/msgpack: run bash "
                    "scripts/install.sh dev (it runs npm ci in examples/js)")
    return node


async def run_node_against(api: HttpApi, node: str) -> dict:
    """Serve ``api`` on 127.0.0.1 and run the JavaScript check against it."""
    async with served(api) as base:
        proc = await asyncio.create_subprocess_exec(
            node, str(ROOT / "tests/js/portable_check.mjs"), base,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        stdout, stderr = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, stderr.decode()
        return json.loads(stdout)


async def test_javascript_decodes_the_portable_layout_to_numpys_values(client):
    node = node_and_package()
    out = await run_node_against(make_api(), node)
    for dtype, (wire_dtype, width) in DTYPES.items():
        expected = (await numpy_layout(client, dtype)).astype(np.float64)
        for selector in ("accept", "body"):
            got = out[selector][dtype]
            assert got["shape"] == [3, width] and got["dtype"] == wire_dtype
            assert np.array_equal(np.array(got["rows"], dtype=np.float64), expected), \
                (selector, dtype)
    # the default layout is what JavaScript cannot read without a key converter
    assert "The type of key must be string or number" in out["numpyLayoutError"]
    hits = out["rerank"]["results"]
    assert len(hits) == 2 and hits[0]["index"] == 0
    assert hits[0]["relevance_score"] >= hits[1]["relevance_score"]
