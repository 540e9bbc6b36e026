"""Long inputs per request on tiny models (max_seq_length 16), no Ray: ``long_inputs``
(truncate | error | chunk) and ``return_chunks`` on /embed, /v1/embeddings, /embed_sparse
and /embed_all, the Python client and gRPC's ``truncation_direction: LEFT``. Every vector
is checked against one computed directly from the windows cut by hand, each window
embedded alone."""

from __future__ import annotations

import numpy as np
import pytest

from blitz import codecs
from blitz.client import AsyncClient
from blitz.encoders.bi_encoder import TextJob
from blitz.grpc_api import tei_pb2 as pb
from blitz.ingress.service import EmbeddingService
from blitz.loading.load import load_encoder
from blitz.pool.dispatcher import ReplicaDispatcher
from blitz.settings.config import BlitzSettings
from blitz.settings.registry import ModelSpec
from tests.api_client import api_client, tei_servicer
from tests.error_body import error_body
from tests.tiny_hybrid import build_tiny_hybrid
from tests.tiny_models import build_tiny_bi_encoder, build_tiny_splade
from tests.unit.test_grpc_api import call, served

MAX = 16
# every word one token of the MiniLM vocabulary: a window's text re-tokenizes to its ids
LONG = ("the cat sat on the mat and the dog ran to the park while seven birds sang in the "
        "old tree near the river bank under a blue sky")
SHORT = "a short text"
OTHER = "seven birds sang in the old tree near the river " * 3


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_bi_encoder(tmp_path_factory.mktemp("tiny") / "m", hidden=16,
                                 max_seq_length=MAX, seed=7)


@pytest.fixture(scope="module")
def enc(tiny):
    """The tiny model as its spec says: long_inputs truncate, chunk_overlap 3."""
    return load_encoder(ModelSpec(id="tiny", source=str(tiny), cpu_backend="torch",
                                  chunk_overlap=3))


def settings_of(tiny, **spec) -> BlitzSettings:
    return BlitzSettings.from_args({"models": [
        {"id": "tiny", "source": str(tiny), "cpu_backend": "torch", "chunk_overlap": 3,
         "request_chunking": True,
         "prompts": {"q": "query: "}, **spec}]})


@pytest.fixture
async def client(tiny):
    settings = settings_of(tiny)
    async with api_client(settings) as http:
        yield http


def content_ids(enc, text):
    return enc.tokens.tokenizer(text, add_special_tokens=False)["input_ids"]


def windows_by_hand(enc, text, overlap=3):
    """The text's own ids in windows of MAX - specials, each ``overlap`` into the last."""
    ids, room = content_ids(enc, text), MAX - enc.tokens.specials
    out, start = [], 0
    while True:
        out.append(ids[start:start + room])
        if start + room >= len(ids):
            return out
        start += room - overlap


def mean_by_hand(enc, text, normalize=True):
    """The token-weighted mean of the text's windows, each embedded alone."""
    windows = windows_by_hand(enc, text)
    rows = np.concatenate([enc.embed_tokens([w], normalize=False).values for w in windows])
    weights = np.array([len(w) + enc.tokens.specials for w in windows], dtype=np.float32)
    mean = (rows * weights[:, None]).sum(axis=0) / weights.sum()
    return mean / np.linalg.norm(mean) if normalize else mean, int(weights.sum())


# ---- the encoder ---------------------------------------------------------------------

def test_a_request_chunks_on_a_model_that_truncates_and_equals_its_windows_mean(enc):
    assert len(windows_by_hand(enc, LONG)) >= 3
    for normalize in (True, False):
        got = enc.embed_many_sided([TextJob([LONG, SHORT], normalize, True, None, "chunk"),
                                    TextJob([LONG], normalize, True)])
        want, tokens = mean_by_hand(enc, LONG, normalize)
        assert np.allclose(got[0].values[0], want, atol=1e-5)
        assert got[0].token_counts.tolist() == [tokens, len(content_ids(enc, SHORT)) + 2]
        truncated = enc.embed([LONG], normalize=normalize).values[0]
        assert np.allclose(got[1].values[0], truncated, atol=1e-5)  # its neighbour: cut


def test_each_window_is_its_own_vector_and_its_offsets_slice_the_text_to_its_ids(enc):
    got = enc.embed_many_sided([TextJob([LONG, SHORT], True, True, each=True)])[0]
    chunks = got.outputs["chunks"]
    windows = windows_by_hand(enc, LONG)
    assert chunks.rows.tolist() == [len(windows), 1]
    alone = enc.embed_tokens(windows + [content_ids(enc, SHORT)], normalize=True).values
    assert np.allclose(chunks.values, alone, atol=1e-5)
    texts = [LONG] * len(windows) + [SHORT]
    for (start, end), text, ids in zip(chunks.offsets.tolist(), texts,
                                       windows + [content_ids(enc, SHORT)], strict=True):
        assert content_ids(enc, text[start:end]) == ids
        assert enc.tokens.tokenizer.decode(ids) == text[start:end]
    assert chunks.offsets[0, 0] == 0 and chunks.offsets[len(windows) - 1, 1] == len(LONG)
    assert np.allclose(got.values[0], mean_by_hand(enc, LONG)[0], atol=1e-5)


def test_a_request_error_refuses_what_the_model_would_truncate(enc):
    result = enc.embed_many_sided([TextJob([SHORT, LONG], True, True, None, "error"),
                                   TextJob([SHORT], True, True, None, "error")])
    assert "max_seq_length" in str(result[0]) and result[1].values.shape == (1, 16)


def test_a_sparse_text_chunked_keeps_each_weights_largest_over_its_windows(tmp_path):
    splade = build_tiny_splade(tmp_path / "s", max_seq_length=MAX, seed=3)
    sparse = load_encoder(ModelSpec(id="s", source=str(splade), kind="sparse",
                                    max_seq_length=MAX, chunk_overlap=3))
    windows = windows_by_hand(sparse, LONG)
    want = np.max([sparse.embed_tokens([w], normalize=False).values[0] for w in windows],
                  axis=0)
    got = sparse.embed_sparse([SHORT, LONG], long_inputs="chunk")
    ends = np.cumsum(got.rows)
    assert np.array_equal(got.indices[ends[0]:], np.flatnonzero(want))
    assert np.allclose(got.values[ends[0]:], want[want > 0], atol=1e-5)
    assert got.token_counts[1] == sum(len(w) + sparse.tokens.specials for w in windows)
    cut = sparse.embed_sparse([LONG])
    assert cut.token_counts[0] == MAX


def test_a_hybrid_sparse_text_chunked_keeps_each_ids_largest_weight(tmp_path):
    m3 = load_encoder(ModelSpec(id="m3", source=str(build_tiny_hybrid(tmp_path / "h", seed=2)),
                                kind="hybrid", max_seq_length=8, chunk_overlap=2))
    text = "hello world " * 6
    windows = m3.chunks([text]).ids
    assert len(windows) > 2
    best: dict[int, float] = {}
    for window in windows:  # each alone
        alone = m3._hybrid_ids([window], np.array([len(window)]), colbert=False).sparse
        for i, v in zip(alone.indices.tolist(), alone.values.tolist(), strict=True):
            best[i] = max(best.get(i, 0.0), v)
    got = m3.embed_sparse([text], long_inputs="chunk")
    assert got.indices.tolist() == sorted(best)
    assert np.allclose(got.values, [best[i] for i in sorted(best)], atol=1e-6)


# ---- HTTP ----------------------------------------------------------------------------

async def test_embed_json_answers_the_mean_and_each_texts_chunks(client, enc):
    r = await client.post("/embed", json={"texts": [LONG, SHORT], "return_chunks": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert np.allclose(body["embeddings"][0], mean_by_hand(enc, LONG)[0], atol=1e-5)
    windows = windows_by_hand(enc, LONG)
    first = body["chunks"][0]
    assert len(first["embeddings"]) == len(first["offsets"]) == len(windows)
    assert np.allclose(first["embeddings"], enc.embed_tokens(windows, normalize=True).values,
                       atol=1e-5)
    assert body["chunks"][1]["offsets"] == [[0, len(SHORT)]]
    assert body["usage"]["prompt_tokens"] == mean_by_hand(enc, LONG)[1] + 5


@pytest.mark.parametrize("layout", ["numpy", "portable"])
async def test_embed_msgpack_carries_chunk_arrays_in_either_layout(client, enc, layout):
    r = await client.post("/embed", content=codecs.pack({
        "texts": [LONG], "return_chunks": True, "layout": layout, "dtype": "float16"}),
        headers={"content-type": "application/msgpack"})
    assert r.status_code == 200, r.text
    chunk = codecs.unpack(r.content)["chunks"][0]
    rows = (codecs.from_portable(**chunk["embeddings"]) if layout == "portable"
            else chunk["embeddings"])
    assert rows.dtype == np.float16 and rows.shape == (len(windows_by_hand(enc, LONG)), 16)
    assert [LONG[s:e] for s, e in chunk["offsets"]][0].startswith("the cat")


async def test_a_chunked_text_gets_the_same_vector_alone_or_batched(client, enc):
    alone = (await client.post("/embed", json={"texts": [LONG], "long_inputs": "chunk"})).json()
    batched = (await client.post("/embed", json={
        "texts": [SHORT, OTHER, LONG, LONG + " again"], "long_inputs": "chunk"})).json()
    assert np.allclose(alone["embeddings"][0], batched["embeddings"][2], atol=1e-6)
    assert np.allclose(alone["embeddings"][0], mean_by_hand(enc, LONG)[0], atol=1e-5)


async def test_offsets_are_in_the_text_as_sent_behind_a_prompt(client):
    r = await client.post("/embed", json={"texts": [LONG], "return_chunks": True,
                                          "prompt_name": "q"})
    offsets = r.json()["chunks"][0]["offsets"]
    assert offsets[0][0] == 0 and offsets[-1][1] == len(LONG)
    assert all(0 <= s < e <= len(LONG) for s, e in offsets)


async def test_openai_and_tei_take_long_inputs(client, enc):
    mean = mean_by_hand(enc, LONG)[0]
    r = await client.post("/v1/embeddings", json={"input": [LONG], "long_inputs": "chunk"})
    assert r.status_code == 200, r.text
    assert np.allclose(r.json()["data"][0]["embedding"], mean, atol=1e-5)
    r = await client.post("/embed", json={"inputs": [LONG], "long_inputs": "chunk"})
    assert np.allclose(r.json()[0], mean, atol=1e-5)


async def test_the_python_client_chunks(client, enc):
    blitz = AsyncClient("http://blitz", transport=client._transport)
    got = await blitz.embed([LONG], long_inputs="chunk")
    assert np.allclose(got[0], mean_by_hand(enc, LONG)[0], atol=1e-5)
    chunks = await blitz.embed_chunks([LONG, SHORT])
    assert chunks[0].offsets.shape == (len(windows_by_hand(enc, LONG)), 2)
    assert chunks[1].embeddings.shape == (1, 16)
    await blitz.aclose()


@pytest.mark.parametrize(("route", "body", "status", "param", "words"), [
    ("/embed", {"texts": [LONG], "long_inputs": "split"}, 422, "long_inputs", "chunk"),
    ("/embed", {"texts": [LONG], "long_inputs": "error"}, 413, "input", "max_seq_length"),
    ("/embed", {"texts": [LONG], "long_inputs": "error", "truncate": True}, 413, "input",
     "long_inputs"),
    ("/embed", {"texts": [LONG], "long_inputs": "truncate", "return_chunks": True}, 422,
     "return_chunks", "long_inputs chunk"),
    ("/embed", {"texts": [LONG], "return_chunks": 1}, 422, "return_chunks", "boolean"),
    ("/embed", {"inputs": [LONG], "return_chunks": True}, 422, "return_chunks", "texts"),
    ("/embed", {"texts": [[101, 2000, 102]], "long_inputs": "chunk"}, 422, "long_inputs",
     "token ids"),
    ("/v1/embeddings", {"input": [LONG], "return_chunks": True}, 422, "return_chunks",
     "/embed"),
    ("/v1/embeddings", {"input": [LONG], "long_inputs": "error"}, 413, "input",
     "max_seq_length"),
    ("/embed_all", {"inputs": [LONG], "long_inputs": "chunk"}, 422, "long_inputs",
     "some tokens two"),
    ("/embed_all", {"inputs": [LONG], "long_inputs": "error"}, 413, "input", "max_seq_length"),
])
async def test_refusals_name_the_field(client, route, body, status, param, words):
    r = await client.post(route, json=body)
    assert r.status_code == status, r.text
    error = error_body(r)
    assert error["param"] == param and words in error["message"], error


async def test_a_request_truncates_a_model_that_chunks(tiny, enc):
    settings = settings_of(tiny, long_inputs="chunk")
    async with api_client(settings) as http:
        chunked = (await http.post("/embed", json={"texts": [LONG]})).json()
        cut = (await http.post("/embed", json={"texts": [LONG], "long_inputs": "truncate"}))
        refused = await http.post("/embed", json={"texts": [LONG], "long_inputs": "error"})
    assert np.allclose(chunked["embeddings"][0], mean_by_hand(enc, LONG)[0], atol=1e-5)
    assert np.allclose(cut.json()["embeddings"][0], enc.embed([LONG], normalize=True).values[0],
                       atol=1e-5)
    assert refused.status_code == 413


# ---- gRPC ----------------------------------------------------------------------------

async def test_grpc_left_truncation_is_the_http_left_vector(tiny, client):
    settings = settings_of(tiny)
    service = EmbeddingService(settings, ReplicaDispatcher(settings))
    tei = tei_servicer(service)
    http_left = (await client.post("/embed", json={"inputs": [LONG],
                                                   "truncation_direction": "left"})).json()[0]
    http_right = (await client.post("/embed", json={"inputs": [LONG]})).json()[0]
    async with served(tei) as channel:
        left = await call(channel, "Embed")(pb.EmbedRequest(
            inputs=LONG, truncate=True, truncation_direction=pb.TRUNCATION_DIRECTION_LEFT))

        async def messages():
            for direction in (1, 1, 0, 1):
                yield pb.EmbedRequest(inputs=LONG, truncate=True,
                                      truncation_direction=direction)

        streamed = [r async for r in call(channel, "EmbedStream")(messages())]
    assert np.allclose(left.embeddings, http_left, atol=1e-6)
    assert not np.allclose(http_left, http_right, atol=1e-3)
    for reply, want in zip(streamed, (http_left, http_left, http_right, http_left),
                           strict=True):
        assert np.allclose(reply.embeddings, want, atol=1e-6)
