"""Preloaded models: resident before their first request, and /ready waits for them while
answering every impatient probe (an app of its own on the session's shared Ray + Serve
instance)."""

from __future__ import annotations

import asyncio
import time

import httpx

from tests.waiting import wait_until_async

APP = "it-preload"
PREFIX = "/it-preload"
PRELOAD = ["tiny-a", "slow"]
DEADLINE_S = 180  # bound on every wait; a healthy run needs a small part of it
PROBE_PATIENCE_S = 0.5  # a probe that gives up sooner than Kubernetes' default (1 s)


def _args(tiny_models, cache_dir) -> dict:
    return {
        "models": [{"id": "tiny-a", "source": str(tiny_models["tiny-a"])},
                   {"id": "slow", "source": "fake:8:6"},  # keeps the replica starting 6 s
                   {"id": "tiny-b", "source": str(tiny_models["tiny-b"])}],
        "cache_dir": str(cache_dir),
        "gpu": "off",
        "cpu_pool": {"deployment": {"ray_actor_options": {"num_cpus": 0.1}},
                     "torch_threads": 1, "preload": PRELOAD},
        "ingress": {"deployment": {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0.1}}},
    }


async def _reports_preloaded() -> bool:
    return await _reported_model_ids("CPUPool") == set(PRELOAD)


async def _reported_model_ids(deployment: str) -> set[str]:
    """The model ids the controller hands to routers for the deployment's replicas
    (Serve's private state: what multiplexed routing reads)."""
    from ray.serve.context import _get_global_client

    running = await _get_global_client()._controller._all_running_replicas.remote()
    return {model for deployment_id, replicas in running.items()
            if deployment_id.app_name == APP and deployment_id.name == deployment
            for replica in replicas for model in replica.multiplexed_model_ids}


async def test_preloaded_models_are_resident_before_any_request_and_ready_waits(
        serve_instance, tiny_models, tmp_path):
    from ray import serve

    from deployments.app import build_app

    serve.run_many([serve.RunTarget(build_app(_args(tiny_models, tmp_path)), name=APP,
                                    route_prefix=PREFIX)],
                   wait_for_applications_running=False)
    answers: list[int] = []
    deadline = time.monotonic() + DEADLINE_S
    try:
        async with httpx.AsyncClient(base_url=serve_instance + PREFIX, timeout=30) as http:
            while not answers or answers[-1] != 200:
                assert time.monotonic() < deadline, f"/ready never answered 200: {answers}"
                try:
                    r = await http.get("/ready", timeout=PROBE_PATIENCE_S)
                    answers.append(r.status_code)
                except httpx.TimeoutException:
                    answers.append(0)  # gave up; allowed only before the ingress is up
                await asyncio.sleep(0.2)
            # ready, and no request has named a preloaded model yet
            pool = serve.get_deployment_handle("CPUPool", APP)
            stats = await pool.stats.remote()
            assert stats["loaded"] == PRELOAD and stats["evictions"] == 0
            assert stats["backends"] == {"tiny-a": "torch", "slow": "fake"}
            await wait_until_async(_reports_preloaded, "the replica to report its models",
                                   deadline - time.monotonic(), interval_s=0.2)
            r = await http.post("/embed", json={"texts": ["x"], "model": "slow"})
            assert r.status_code == 200
            assert (await pool.stats.remote())["loaded"] == PRELOAD  # served, not reloaded
    finally:
        serve.delete(APP)
    # /ready answered "not ready" (within the probe's patience) while the replica preloaded
    assert 503 in answers and set(answers) <= {0, 404, 503, 200}, answers
    # once the ingress answered, every probe got its answer within its patience
    assert 0 not in answers[answers.index(503):], answers
