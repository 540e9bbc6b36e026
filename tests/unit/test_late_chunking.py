"""Late chunking (``BiEncoder.embed_late_chunks``; ``late_chunking`` on ``/v1/embeddings``
and ``/embed``; Voyage's ``/v1/contextualizedembeddings``): each chunk's vector is its own
tokens' pooled states from one run of its whole document, checked against that computation
written out here (the tokens through the model's transformer, the span pooled), alone, in
any batch and in windows; the routes answer their APIs' shapes and refuse what they cannot
serve with the field to fix."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from blitz.encoders.sentence_transformer import SentenceTransformerEncoder
from blitz.errors import InvalidValue
from blitz.settings.config import BlitzSettings
from tests.api_client import api_client, api_for
from tests.tiny_models import build_tiny_bi_encoder, minilm_dir

DOCS = [["The cat sat on the mat.", " It was warm there, and it slept."],
        ["Berlin is a city.", " It is the capital of Germany.", " Its population is large."],
        ["One short document."]]


def _st(path: Path):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(path), device="cpu")


@pytest.fixture(scope="module")
def minilm():
    model = _st(minilm_dir())
    return model, SentenceTransformerEncoder("minilm", model, token_budget=8192)


def _states(model, ids: list[int]) -> np.ndarray:
    """The transformer's token states of one unpadded row."""
    with torch.inference_mode():
        out = model({"input_ids": torch.tensor([ids]),
                     "attention_mask": torch.ones(1, len(ids), dtype=torch.long)})
    return out["token_embeddings"][0].float().numpy()


def reference(model, doc: list[str], pooling: str = "mean", room: int | None = None,
              overlap: int = 0) -> np.ndarray:
    """Each chunk's tokens (tokenized alone, no specials) joined between [CLS] and [SEP];
    the document run once (or, past ``room`` content tokens, in windows ``room`` long that
    start every ``room - overlap`` tokens, each token taken from the window where it has
    the most tokens on its shorter side, the earlier on a tie); each chunk's span pooled; unit length."""
    tok = model.tokenizer
    pieces = [tok(c, add_special_tokens=False)["input_ids"] for c in doc]
    content = [t for p in pieces for t in p]
    room = room or len(content)
    step = room - overlap
    starts = list(range(0, max(len(content) - room, 0) + step, step))
    states = np.zeros((len(content), model.get_embedding_dimension()), np.float32)
    depth = np.full(len(content), -1.0)
    for s in starts:
        window = content[s:s + room]
        hidden = _states(model, [tok.cls_token_id, *window, tok.sep_token_id])[1:-1]
        for j in range(len(window)):
            context = min(j, len(window) - 1 - j)
            if context > depth[s + j]:
                states[s + j], depth[s + j] = hidden[j], context
    rows, at = [], 0
    for p in pieces:
        span = states[at:at + len(p)]
        at += len(p)
        row = {"mean": span.mean(0), "max": span.max(0), "first": span[0],
               "last": span[-1]}[pooling]
        rows.append(row / np.linalg.norm(row))
    return np.stack(rows)


def test_each_chunk_is_its_span_of_one_run_of_its_document(minilm):
    model, encoder = minilm
    got = encoder.embed_late_chunks(DOCS, normalize=True)
    assert got.rows.tolist() == [2, 3, 1]
    want = np.concatenate([reference(model, doc) for doc in DOCS])
    assert np.abs(got.values - want).max() < 1e-5
    # the context matters: a chunk alone is not the chunk in its document
    alone = encoder.embed_late_chunks([[DOCS[1][1]]], normalize=True).values[0]
    assert float(alone @ got.values[3]) < 0.9999


def test_a_chunk_gets_one_vector_whatever_it_is_batched_with(minilm):
    _, encoder = minilm
    together = encoder.embed_late_chunks(DOCS, normalize=True).values
    apart = np.concatenate([encoder.embed_late_chunks([doc], normalize=True).values
                            for doc in DOCS])
    reverse = encoder.embed_late_chunks(DOCS[::-1], normalize=True).values
    assert np.abs(together - apart).max() < 1e-5
    assert np.abs(reverse[-2:] - together[:2]).max() < 1e-5


@pytest.mark.parametrize("pooling", ["mean", "max", "first", "last"])
def test_every_pooling_pools_the_span_as_asked(minilm, pooling):
    model, encoder = minilm
    got = encoder.embed_late_chunks(DOCS[:2], normalize=True, pooling=pooling).values
    want = np.concatenate([reference(model, doc, pooling) for doc in DOCS[:2]])
    assert np.abs(got - want).max() < 1e-5


@pytest.mark.parametrize("overlap", [0, 3])
def test_a_document_longer_than_the_model_runs_in_windows(overlap):
    model = _st(minilm_dir())
    encoder = SentenceTransformerEncoder("m", model, max_seq_length=16, token_budget=8192)
    encoder.chunk_overlap = overlap
    doc = ["alpha beta gamma delta epsilon zeta eta theta.",
           " iota kappa lambda mu nu xi omicron pi rho sigma.",
           " tau upsilon phi chi psi omega, the end of the alphabet."]
    got = encoder.embed_late_chunks([doc], normalize=True)
    want = reference(model, doc, room=14, overlap=overlap)
    assert np.abs(got.values - want).max() < 1e-5
    windows = len(range(0, sum(got.token_counts) - 2, 14 - overlap))
    assert int(got.token_counts.sum()) >= 14 * (windows - 1)  # every window's tokens billed


def test_the_models_own_pooling_is_the_default(tmp_path):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    path = build_tiny_bi_encoder(tmp_path / "bert")
    model = _st(path)
    cls = SentenceTransformer(modules=[model[0], Pooling(32, "cls")], device="cpu")
    encoder = SentenceTransformerEncoder("cls", cls, token_budget=4096)
    assert encoder.late_pooling() == "first"
    got = encoder.embed_late_chunks(DOCS[:1], normalize=True).values
    assert np.abs(got - reference(cls, DOCS[0], "first")).max() < 1e-5


def test_a_model_with_a_layer_after_pooling_is_refused(tmp_path):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense

    model = _st(build_tiny_bi_encoder(tmp_path / "bert"))
    dense = SentenceTransformer(modules=[*model, Dense(32, 8)], device="cpu")
    encoder = SentenceTransformerEncoder("dense", dense, token_budget=4096)
    with pytest.raises(InvalidValue, match="Dense after its transformer") as caught:
        encoder.embed_late_chunks(DOCS[:1], normalize=True)
    assert caught.value.param == "model"


def test_a_chunk_with_no_tokens_is_refused(minilm):
    _, encoder = minilm
    with pytest.raises(InvalidValue, match="document 0's chunk 1 has no tokens"):
        encoder.embed_late_chunks([["text", "\u200b"]], normalize=True)


# ---- the routes -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def api():
    settings = BlitzSettings.from_args({"models": [
        {"id": "minilm", "source": str(minilm_dir()), "cpu_backend": "torch",
         "prompts": {"query": "query: "}},
        {"id": "ce", "source": "fake:4", "kind": "cross-encoder"}],
        "limits": {"max_windows_per_request": 3}})
    return api_for(settings)


async def test_openai_late_chunking_answers_one_entry_per_chunk(api, minilm):
    model, _ = minilm
    async with api_client(api) as client:
        reply = await client.post("/v1/embeddings", json={
            "model": "minilm", "input": DOCS[1], "late_chunking": True})
        assert reply.status_code == 200, reply.text
        body = reply.json()
        rows = np.array([d["embedding"] for d in body["data"]], np.float32)
        assert [d["index"] for d in body["data"]] == [0, 1, 2]
        assert np.abs(rows - reference(model, DOCS[1])).max() < 1e-5
        assert body["usage"]["total_tokens"] > 0
        b64 = (await client.post("/embeddings", json={
            "model": "minilm", "input": DOCS[1], "late_chunking": True,
            "encoding_format": "base64", "dimensions": 8})).json()
        first = np.frombuffer(base64.b64decode(b64["data"][0]["embedding"]), np.float32)
        assert first.shape == (8,) and abs(float(np.linalg.norm(first)) - 1) < 1e-5


async def test_blitz_embed_late_chunking_and_its_python_client(api, minilm):
    from blitz.client import AsyncClient
    from tests.api_client import api_transport

    model, _ = minilm
    client = AsyncClient("http://blitz", transport=api_transport(api))
    rows = await client.embed_late_chunks(DOCS[0], model="minilm", pooling="max")
    assert np.abs(np.asarray(rows) - reference(model, DOCS[0], "max")).max() < 1e-5
    int8 = await client.embed_late_chunks(DOCS[0], model="minilm", dtype="int8")
    assert np.asarray(int8).dtype == np.int8 and np.asarray(int8).shape == (2, 384)
    await client.aclose()


async def test_voyage_contextualized_embeddings(api, minilm):
    model, _ = minilm
    async with api_client(api) as client:
        reply = await client.post("/v1/contextualizedembeddings", json={
            "model": "minilm", "inputs": DOCS, "input_type": "document"})
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert [d["index"] for d in body["data"]] == [0, 1, 2]
        for doc, entry in zip(DOCS, body["data"], strict=True):
            rows = np.array([e["embedding"] for e in entry["data"]], np.float32)
            assert np.abs(rows - reference(model, doc)).max() < 1e-5
        # input_type query: the model's query prompt before each document
        query = (await client.post("/v1/contextualizedembeddings", json={
            "model": "minilm", "inputs": [["where is it?"]], "input_type": "query",
            "output_dtype": "binary", "encoding_format": "base64"})).json()
        packed = np.frombuffer(base64.b64decode(query["data"][0]["data"][0]["embedding"]),
                               np.int8)
        want = reference(model, ["query: where is it?"])[0]
        assert packed.tolist() == (np.packbits(want > 0).astype(np.int16) - 128).tolist()


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"model": "ce", "inputs": [["a"]]}, 422, "model"),
    ({"model": "minilm", "inputs": [["a"]], "enable_auto_chunking": True}, 422,
     "enable_auto_chunking"),
    ({"model": "minilm", "inputs": [[]]}, 422, "input"),
    ({"model": "minilm", "inputs": [["a", " "]]}, 422, "input"),
    ({"model": "minilm", "inputs": [["a"]], "output_dtype": "float16"}, 422, "output_dtype"),
    ({"model": "minilm", "inputs": [["word " * 400]] * 2}, 413, "texts"),
])
async def test_what_cannot_be_served_is_refused_naming_the_field(api, body, status, param):
    async with api_client(api) as client:
        reply = await client.post("/v1/contextualizedembeddings", json=body)
        assert reply.status_code == status, reply.text
        error = reply.json()  # Voyage's shape: what the voyageai client reads
        assert error["param"] == param and error["detail"], error
        # and the app keeps serving
        ok = await client.post("/v1/embeddings", json={"model": "minilm", "input": ["a"],
                                                       "late_chunking": True})
        assert ok.status_code == 200


async def test_late_chunking_needs_its_texts_as_a_list(api):
    async with api_client(api) as client:
        reply = await client.post("/v1/embeddings", content=json.dumps(
            {"model": "minilm", "input": "one text", "late_chunking": True}),
            headers={"content-type": "application/json"})
        assert reply.status_code == 422
        assert reply.json()["error"]["param"] == "input"
