"""A GPU pool scaled to zero (min_replicas 0), on the session's Ray with its logical GPU:
large requests are served on the CPU pool while the GPU pool has no running replica (they
do not wait for its cold start), the ingress wakes it, and once its replica runs they go
to it."""

from __future__ import annotations

import time

import httpx
import pytest

APP = "it-cold-gpu"
LARGE = [f"text number {i}" for i in range(8)]  # gpu_min_batch is 4
WARM_UP_BOUND_S = 180  # a bound on the poll below, not a timing assertion


@pytest.fixture(scope="module")
def cold_gpu_app(serve_instance, tiny_models):
    from ray import serve

    from deployments.app import build_app

    def small(min_replicas: int, **actor: float) -> dict:
        return {"torch_threads": 1, "deployment": {
            "autoscaling_config": {"min_replicas": min_replicas, "max_replicas": 1},
            "ray_actor_options": {"num_cpus": 0.1, **actor}}}

    args = {"models": [{"id": "tiny-a", "source": str(tiny_models["tiny-a"])}],
            "gpu": "on", "routing": {"gpu_min_batch": 4},
            "cpu_pool": small(1), "gpu_pool": small(0, num_gpus=0.1),
            "ingress": {"deployment": {"num_replicas": 1,
                                       "ray_actor_options": {"num_cpus": 0.1}}}}
    serve.run(build_app(args), name=APP, route_prefix=f"/{APP}")
    yield serve_instance + f"/{APP}"
    serve.delete(APP)


def _running_gpu_replicas() -> int:
    from ray import serve

    states = serve.status().applications[APP].deployments["GPUPool"].replica_states
    return states.get("RUNNING", 0)


def test_large_requests_use_the_cpu_pool_until_the_gpu_pool_is_up(cold_gpu_app):
    assert _running_gpu_replicas() == 0  # scaled to zero: a cold start ahead
    with httpx.Client(base_url=cold_gpu_app, timeout=120) as http:
        first = http.post("/embed", json={"texts": LARGE}, headers={"accept": "application/json"})
        assert first.status_code == 200, first.text
        assert first.headers["x-blitz-pool"] == "cpu"
        assert len(first.json()["embeddings"]) == len(LARGE)

        pools = ["cpu"]
        deadline = time.monotonic() + WARM_UP_BOUND_S
        while pools[-1] == "cpu" and time.monotonic() < deadline:
            time.sleep(0.5)
            r = http.post("/embed", json={"texts": LARGE})
            assert r.status_code == 200, r.text  # every request is answered meanwhile
            pools.append(r.headers["x-blitz-pool"])
        assert pools[-1] == "gpu", "the GPU pool was never woken"
        assert _running_gpu_replicas() == 1

        r = http.post("/embed", json={"texts": LARGE})  # and it stays there
        assert r.status_code == 200 and r.headers["x-blitz-pool"] == "gpu"
        r = http.post("/embed", json={"texts": LARGE[:2]})  # small ones still go to the CPU
        assert r.status_code == 200 and r.headers["x-blitz-pool"] == "cpu"
