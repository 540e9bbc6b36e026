"""A pool replica Ray cannot place is said out loud, not left "Upscaling": an app whose GPU pool
claims a resource no node has keeps serving from its CPU pool, and the ingress reports
the GPU pool as unplaced, naming the claim and what is free, in ``/ready``, ``/models``
and the gauge ``blitz_pool_unplaced``. (The WARNING goes to the replica's log.)"""

from __future__ import annotations

import httpx
import pytest

from tests.metrics_scrape import metrics_url, scrape_until, total
from tests.waiting import wait_until

APP = "it-unplaced"
MISSING = "blitz_test_no_such_node"


@pytest.fixture(scope="module")
def unplaced_app(serve_instance):
    from ray import serve

    from deployments.app import build_app

    one = {"autoscaling_config": {"min_replicas": 1, "max_replicas": 1}}
    args = {"models": [{"id": "free", "source": "fake:8"}], "gpu": "on",
            "routing": {"gpu_min_batch": 1},
            "cpu_pool": {"workers": 1, "deployment": {
                **one, "ray_actor_options": {"num_cpus": 0.1}}},
            "gpu_pool": {"deployment": {**one, "graceful_shutdown_timeout_s": 1,
                                        "ray_actor_options": {"num_cpus": 0.1, "num_gpus": 0.1,
                                                              "resources": {MISSING: 1}}}},
            "ingress": {"unplaced_after_s": 1, "deployment": {
                "num_replicas": 1, "ray_actor_options": {"num_cpus": 0.1}}}}
    serve._run(build_app(args), name=APP, route_prefix=f"/{APP}", _blocking=False)
    with httpx.Client(base_url=serve_instance + f"/{APP}", timeout=30) as http:
        yield http
    serve.delete(APP, _blocking=False)  # a replica never placed: Serve stops it in its time


def test_an_unplaceable_pool_is_reported_and_the_cpu_pool_serves(unplaced_app):
    def unplaced() -> dict | None:
        r = unplaced_app.get("/ready")
        return r.json().get("unplaced") if r.status_code == 200 else None

    reasons = wait_until(unplaced, "/ready to report the GPU pool unplaced", 90)
    assert set(reasons) == {"gpu"}
    assert f"{MISSING} 1" in reasons["gpu"] and f"{MISSING} 0" in reasons["gpu"]
    assert "short of" in reasons["gpu"] and "GPUPool" in reasons["gpu"]
    [model] = unplaced_app.get("/models").json()["data"]
    assert model["unplaced"] == reasons

    r = unplaced_app.post("/embed", json={"texts": ["served meanwhile"]})
    assert r.status_code == 200 and r.headers["x-blitz-pool"] == "cpu"  # the cold GPU pool

    samples = scrape_until(metrics_url(), lambda s: total(
        s, "ray_blitz_pool_unplaced", application=APP, pool="gpu") == 1)
    assert total(samples, "ray_blitz_pool_unplaced", application=APP, pool="cpu") == 0
