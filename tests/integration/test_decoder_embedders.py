"""Decoder embedders served by Ray Serve (an app of its own on the session's shared Ray +
Serve instance): a Qwen3 sentence-transformers folder on torch and a Llama plain
checkpoint with ``pooling: lasttoken`` on ONNX (built in the pool replica's child) answer
sentence-transformers' own vectors over HTTP (Blitz's /embed, TEI's /embed, /v1/embeddings)
and gRPC (TEI's ``Embed``, through Serve's gRPC proxy), with a prompt and a free-form
instruction."""

from __future__ import annotations

import grpc
import httpx
import numpy as np

from blitz.grpc_api import rpc_table
from blitz.grpc_api import tei_pb2 as pb
from tests.tiny_decoders import INSTRUCTION_TEMPLATE, PROMPTS, build_decoder

APP = "it-decoders"
PREFIX = "/it-decoders"
TEXTS = ["hello", "the quick brown fox jumps over the lazy dog " * 8, "cat",
         "what is the red tree by the river? " * 3]
TASK = "Given a question, retrieve passages that answer it"


def _min_cosine(got, expected) -> float:
    got = np.asarray(got, dtype=np.float32)
    got = got / np.linalg.norm(got, axis=1, keepdims=True)
    expected = expected / np.linalg.norm(expected, axis=1, keepdims=True)
    return float((got * expected).sum(axis=1).min())


def test_decoder_embedders_answer_the_references_vectors_through_serve(serve_instance,
                                                                       grpc_port, tmp_path):
    from ray import serve
    from sentence_transformers import SentenceTransformer

    from deployments.app import build_app

    qwen3 = build_decoder(tmp_path / "qwen3", "qwen3", seed=1)
    llama = build_decoder(tmp_path / "llama", "llama", seed=2)
    extra = {"prompts": PROMPTS, "instruction_template": INSTRUCTION_TEMPLATE}
    args = {
        "models": [{"id": "qwen3", "source": str(qwen3.st), **extra},
                   {"id": "llama", "source": str(llama.plain), "pooling": "lasttoken",
                    "cpu_backend": "onnx", **extra}],
        "cache_dir": str(tmp_path / "cache"),
        "gpu": "off",
        "cpu_pool": {"deployment": {"ray_actor_options": {"num_cpus": 0.1}},
                     "torch_threads": 1},
        "ingress": {"deployment": {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0.1}}},
    }
    serve.run(build_app(args), name=APP, route_prefix=PREFIX)
    try:
        with httpx.Client(base_url=serve_instance + PREFIX, timeout=300) as http:
            for model, built in (("qwen3", qwen3), ("llama", llama)):
                reference = SentenceTransformer(str(built.st), device="cpu")
                plain = http.post("/embed", json={"inputs": TEXTS, "model": model})
                assert plain.status_code == 200, plain.text
                assert _min_cosine(plain.json(), reference.encode(TEXTS)) >= 0.9999
                query = http.post("/v1/embeddings", json={"input": TEXTS, "model": model,
                                                          "prompt_name": "query"})
                assert _min_cosine([row["embedding"] for row in query.json()["data"]],
                                   reference.encode(TEXTS, prompt_name="query")) >= 0.9999
                told = http.post("/embed", json={"texts": TEXTS, "model": model,
                                                 "instruction": TASK},
                                 headers={"accept": "application/json"})
                expected = reference.encode(TEXTS, prompt=f"Instruct: {TASK}\nQuery:")
                assert _min_cosine(told.json()["embeddings"], expected) >= 0.9999
            with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                embed = rpc_table.client_method(channel, "Embed")
                for model, built in (("qwen3", qwen3), ("llama", llama)):
                    reference = SentenceTransformer(str(built.st), device="cpu")
                    for name in (None, "query"):
                        rows = [embed(pb.EmbedRequest(inputs=text, truncate=True,
                                                      prompt_name=name),
                                      metadata=(("application", APP), ("model", model)),
                                      timeout=300).embeddings for text in TEXTS]
                        assert _min_cosine(rows, reference.encode(
                            TEXTS, prompt_name=name)) >= 0.9999
    finally:
        serve.delete(APP)
