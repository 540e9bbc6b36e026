"""Decoder embedders through the APIs, in process (no Ray): Blitz's ``/embed``, OpenAI's
``/v1/embeddings``, TEI's ``/embed`` and TEI's gRPC ``Embed`` answer sentence-transformers'
own vectors, with prompts (``prompt_name``), a free-form ``instruction`` and Matryoshka
``dimensions``. One app serves four tiny families: two sentence-transformers folders and
two plain checkpoints served with ``pooling: lasttoken``."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from blitz.grpc_api import rpc_table
from blitz.grpc_api import tei_pb2 as pb
from blitz.ingress.service import EmbeddingService
from blitz.pool.dispatcher import ReplicaDispatcher
from blitz.settings.config import BlitzSettings
from tests.api_client import api_client, tei_servicer
from tests.tiny_decoders import INSTRUCTION_TEMPLATE, PROMPTS, build_decoder
from tests.unit.test_grpc_api import bridge

AGREE = 0.9999
TEXTS = ["hello", "the quick brown fox jumps over the lazy dog " * 8, "cat",
         "paris is the capital of france", "what is the red tree by the river? " * 3]
TASK = "Given a question, retrieve passages that answer it"
# model id -> (family, padding side, served as)
MODELS = {"qwen3": ("qwen3", "left", "st"), "gemma3": ("gemma3", "right", "st"),
          "llama": ("llama", "left", "plain"), "mistral": ("mistral", "right", "plain")}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The settings and each model's reference (sentence-transformers on its folder)."""
    from sentence_transformers import SentenceTransformer

    root = tmp_path_factory.mktemp("decoder-apis")
    specs, references = [], {}
    for seed, (model_id, (family, side, form)) in enumerate(MODELS.items()):
        built = build_decoder(root / model_id, family, seed=10 + seed, padding_side=side)
        source = {"source": str(built.st)} if form == "st" else {
            "source": str(built.plain), "pooling": "lasttoken"}
        specs.append({"id": model_id, **source, "prompts": PROMPTS,
                      "instruction_template": INSTRUCTION_TEMPLATE})
        references[model_id] = SentenceTransformer(str(built.st), device="cpu")
    settings = BlitzSettings.from_args({"models": specs, "cache_dir": str(root / "cache")})
    service = EmbeddingService(settings, ReplicaDispatcher(settings))
    return service, references


@pytest.fixture
async def client(served):
    service, _ = served
    async with api_client(service) as c:
        yield c


def agree(got, expected) -> float:
    got = np.asarray(got, dtype=np.float32)
    got = got / np.linalg.norm(got, axis=1, keepdims=True)
    expected = expected / np.linalg.norm(expected, axis=1, keepdims=True)
    return float((got * expected).sum(axis=1).min())


@pytest.mark.parametrize("model", list(MODELS))
async def test_every_embedding_api_answers_the_references_vectors(served, client, model):
    reference = served[1][model]
    expected = reference.encode(TEXTS)
    native = await client.post("/embed", json={"texts": TEXTS, "model": model},
                               headers={"accept": "application/json"})
    assert agree(native.json()["embeddings"], expected) >= AGREE
    openai = await client.post("/v1/embeddings", json={"input": TEXTS, "model": model})
    assert agree([row["embedding"] for row in openai.json()["data"]], expected) >= AGREE
    tei = await client.post("/embed", json={"inputs": TEXTS, "model": model})
    assert agree(tei.json(), expected) >= AGREE
    one = await client.post("/embed", json={"inputs": TEXTS[1], "model": model})
    assert agree(one.json(), expected[1:2]) >= AGREE


@pytest.mark.parametrize("model", list(MODELS))
async def test_prompt_names_and_instructions_match_the_references_prompts(served, client,
                                                                          model):
    reference = served[1][model]
    query = reference.encode(TEXTS, prompt_name="query")
    instructed = reference.encode(TEXTS, prompt=f"Instruct: {TASK}\nQuery:")
    native = await client.post("/embed", json={"texts": TEXTS, "model": model,
                                               "prompt_name": "query"},
                               headers={"accept": "application/json"})
    assert agree(native.json()["embeddings"], query) >= AGREE
    tei = await client.post("/embed", json={"inputs": TEXTS, "model": model,
                                            "prompt_name": "query"})
    assert agree(tei.json(), query) >= AGREE
    native = await client.post("/embed", json={"texts": TEXTS, "model": model,
                                               "instruction": TASK},
                               headers={"accept": "application/json"})
    assert agree(native.json()["embeddings"], instructed) >= AGREE
    tei = await client.post("/embed", json={"inputs": TEXTS, "model": model,
                                            "instruction": TASK})
    assert agree(tei.json(), instructed) >= AGREE
    openai = await client.post("/v1/embeddings", json={"input": TEXTS, "model": model,
                                                       "instruction": TASK})
    assert agree([row["embedding"] for row in openai.json()["data"]], instructed) >= AGREE
    openai = await client.post("/v1/embeddings", json={"input": TEXTS, "model": model,
                                                       "prompt_name": "query"})
    assert agree([row["embedding"] for row in openai.json()["data"]], query) >= AGREE


async def test_matryoshka_dimensions_answer_the_references_truncated_vectors(served, client):
    expected = served[1]["qwen3"].encode(TEXTS, truncate_dim=16)
    native = await client.post("/embed", json={"texts": TEXTS, "model": "qwen3",
                                               "dimensions": 16},
                               headers={"accept": "application/json"})
    assert np.asarray(native.json()["embeddings"]).shape == (len(TEXTS), 16)
    assert agree(native.json()["embeddings"], expected) >= AGREE
    openai = await client.post("/v1/embeddings", json={"input": TEXTS, "model": "qwen3",
                                                       "dimensions": 16})
    assert agree([row["embedding"] for row in openai.json()["data"]], expected) >= AGREE


async def test_an_instruction_beside_a_prompt_name_is_refused(client):
    both = await client.post("/embed", json={"texts": ["a"], "model": "qwen3",
                                             "prompt_name": "query", "instruction": TASK})
    assert both.status_code == 422 and "not both" in both.text


async def test_grpc_embed_answers_the_references_vectors_with_a_prompt(served):
    service, references = served
    tei = tei_servicer(service)
    server = grpc.aio.server()
    for name in rpc_table.SERVICES:
        getattr(rpc_table, f"add_{name}Servicer_to_server")(bridge(tei), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            embed = rpc_table.client_method(channel, "Embed")
            for model in ("qwen3", "llama"):
                expected = references[model].encode(TEXTS[1:3], prompt_name="query")
                rows = [(await embed(pb.EmbedRequest(inputs=text, prompt_name="query"),
                                     metadata=(("model", model),))).embeddings
                        for text in TEXTS[1:3]]
                assert agree(rows, expected) >= AGREE
    finally:
        await server.stop(None)
