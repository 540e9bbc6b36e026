"""Fixtures shared by the Ray tiers (integration, faults): one Ray + Serve instance per test
session, started with a logical GPU (docs/ray-notes.md), and tiny models built offline."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.ports import free_port
from tests.tiny_models import build_tiny_bi_encoder, build_tiny_cross_encoder

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


RAY_TIERS = ("integration", "faults", "cluster")  # the folders under tests/ that start Ray
TESTS = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test in a Ray tier ``integration`` and ``slow`` by its folder, so that
    ``pytest -m "not slow"`` is the quick inner loop and a plain ``pytest`` runs all."""
    for item in items:
        tier = item.path.relative_to(TESTS).parts[0] if item.path.is_relative_to(TESTS) else ""
        if tier in RAY_TIERS:
            item.add_marker(pytest.mark.integration)
            item.add_marker(pytest.mark.slow)


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
def aws_files(tmp_path_factory) -> dict[str, Path]:
    """The AWS config and credentials files Ray's workers read, as a node's own profile
    would be: empty until a test writes them (tests/integration/test_bulk.py)."""
    root = tmp_path_factory.mktemp("aws")
    files = {"config": root / "config", "credentials": root / "credentials"}
    for path in files.values():
        path.write_text("")
    return files


@pytest.fixture(scope="session")
def grpc_port() -> int:
    """The port of the shared Serve's gRPC proxy (TEI's services, as serve_config.yaml)."""
    return free_port()


@pytest.fixture(scope="session")
def serve_instance(aws_files, grpc_port):
    import ray
    import yaml
    from ray import serve

    shipped = yaml.safe_load((Path(__file__).parents[1] / "serve_config.yaml").read_text())
    port = free_port()
    ray.init(num_cpus=8, num_gpus=1, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {
                 "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                 "AWS_CONFIG_FILE": str(aws_files["config"]),
                 "AWS_SHARED_CREDENTIALS_FILE": str(aws_files["credentials"]),
                 # the proxy's gRPC server on 127.0.0.1, as serve_config.yaml has it
                 "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": shipped["controller_options"][
                     "runtime_env"]["env_vars"]["RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"]}})
    serve.start(http_options={"host": "127.0.0.1", "port": port},
                grpc_options={**shipped["grpc_options"], "port": grpc_port})
    yield f"http://127.0.0.1:{port}"
    serve.shutdown()
    ray.shutdown()


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
