"""The load generator's reply parsers, one per API (loadtest.apis)."""

from __future__ import annotations

import base64

import numpy as np
import orjson
import pytest

from blitz import codecs
from loadtest.apis import NativeJson, NativeMsgpack, OpenAIBase64, OpenAIFloat, Raw
from loadtest.verify import VerificationError
from tests.loadtest_fakes import DIM, fake_vectors


def test_parsers_read_each_api_and_reject_garbage():
    a = fake_vectors(["x", "y"])
    native = {"model": "m", "embeddings": a, "shape": [2, DIM], "dtype": "float32",
              "usage": {"prompt_tokens": 5, "total_tokens": 5}}
    reply = NativeMsgpack().parse(codecs.pack(native), {})
    assert np.array_equal(reply.embeddings, a) and reply.tokens == 5
    assert np.array_equal(NativeJson().parse(codecs.dumps_json(native), {}).embeddings, a)
    raw_headers = {"x-blitz-shape": f"2,{DIM}", "x-blitz-dtype": "float32"}
    assert np.array_equal(Raw().parse(bytes(codecs.to_raw(a)), raw_headers).embeddings, a)
    items = [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(a)]
    body = codecs.dumps_json({"data": items[::-1], "usage": {"total_tokens": 4}})
    assert np.array_equal(OpenAIFloat().parse(body, {}).embeddings, a)  # sorted by index
    b64 = [{**item, "embedding": codecs.to_base64(item["embedding"])} for item in items]
    assert np.array_equal(OpenAIBase64().parse(codecs.dumps_json({"data": b64}), {}).embeddings,
                          a)

    garbage = [
        (NativeMsgpack(), b"\xc1", {}),
        (NativeMsgpack(), codecs.pack({"vectors": a}), {}),
        (NativeJson(), b"{not json", {}),
        (NativeJson(), orjson.dumps({"embeddings": [[1.0, 2.0], [3.0]]}), {}),
        (Raw(), bytes(codecs.to_raw(a))[:-4], raw_headers),
        (Raw(), bytes(codecs.to_raw(a)), {"x-blitz-shape": "two,16"}),
        (OpenAIFloat(), orjson.dumps({"data": [{"index": 1, "embedding": [1.0]}]}), {}),
        (OpenAIFloat(), orjson.dumps({"object": "list"}), {}),
        (OpenAIBase64(), orjson.dumps({"data": [{"index": 0, "embedding": "@@@"}]}), {}),
        (OpenAIBase64(), orjson.dumps(
            {"data": [{"index": 0, "embedding": base64.b64encode(b"abc").decode()}]}), {}),
    ]
    ragged = orjson.dumps({"data": [{"index": 0, "embedding": [1.0, 2.0]},
                                    {"index": 1, "embedding": [1.0]}]})
    with pytest.raises(VerificationError, match="dimension"):
        OpenAIFloat().parse(ragged, {})
    for api, content, headers in garbage:
        with pytest.raises(VerificationError) as info:
            api.parse(content, headers)
        assert info.value.reason == "malformed", (api.name, content[:40])


def test_grpc_vs_http_table_pairs_each_round():
    from loadtest.grpc_vs_http import table

    rounds = [{"round": 1, "profile": "single", "api": "http-msgpack", "texts_per_s": 100.0,
               "p50_ms": 10.0, "errors": 0},
              {"round": 1, "profile": "single", "api": "grpc", "texts_per_s": 150.0,
               "p50_ms": 8.0, "errors": 1},
              {"round": 2, "profile": "single", "api": "grpc", "texts_per_s": 1.0,
               "p50_ms": 1.0, "errors": 0}]  # no HTTP side: left out
    lines = table(rounds).splitlines()
    assert lines[2] == "| single | 1 | 100.0 | 150.0 | 1.50x | 10.0 | 8.0 | 1 |"
    assert len(lines) == 3
