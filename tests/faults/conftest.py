"""Fault tests: apps deployed on the session's shared Serve instance (tests/conftest.py),
each with small pools and short timeouts, put under load while something goes wrong."""

from __future__ import annotations

import pytest

from blitz.settings.deployment_options import merge_options


@pytest.fixture(scope="session")
def deploy(serve_instance):
    """``deploy(name, args) -> base URL``: one app per fault, removed at the end. (Removing
    each module's apps when it ends was tried once; in that run the drain test that follows
    the scaling faults ran out of its bound, cause not established, so it stays as it was.)"""
    from ray import serve

    from deployments.app import build_app

    names: list[str] = []

    def run(name: str, args: dict) -> str:
        serve.run(build_app(args), name=name, route_prefix=f"/{name}")
        if name not in names:
            names.append(name)
        return f"{serve_instance}/{name}"

    yield run
    for name in names:
        serve.delete(name)


def small_app(models: list[dict], *, cpu_pool: dict | None = None,
              ingress: dict | None = None) -> dict:
    """Settings for a fault app: CPU pool only, one replica, short timeouts, no batch API;
    ``cpu_pool`` and ``ingress`` are merged over those, dict by dict."""
    return {
        "models": models,
        "gpu": "off",
        "cpu_pool": merge_options({
            "deployment": {"ray_actor_options": {"num_cpus": 0.1},
                           "autoscaling_config": {"min_replicas": 1, "max_replicas": 1}},
            "torch_threads": 1, "max_batch_size": 32}, cpu_pool or {}),
        "ingress": merge_options({"deployment": {"num_replicas": 1,
                                                 "ray_actor_options": {"num_cpus": 0.1}},
                                  "pool_timeout_s": 20}, ingress or {}),
        "batches": {"enabled": False},  # no runner replica: test_batch_restart.py's own
    }
