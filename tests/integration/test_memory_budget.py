"""Serve's multiplexed LRU evicts by bytes (``deployments/pool.py`` wires
``PoolReplica.load`` to the LRU ``@serve.multiplexed`` keeps): with a CPU pool budget that
holds two of the three tiny models but not all three, the third evicts the least recently
used, fewer than ``MAX_MODELS_PER_REPLICA`` stay, and what stays fits the budget (an app of
its own on the session's shared Ray + Serve instance)."""

from __future__ import annotations

import httpx

from blitz.loading.facts import model_shape
from blitz.loading.load import load_encoder
from blitz.pool.memory_budget import needed_bytes, size_model
from blitz.settings.config import BlitzSettings

APP = "it-memory"
PREFIX = "/it-memory"
MODELS = ("tiny-a", "tiny-b", "tiny-c")


def _args(tiny_models, cache_dir, budget: int | None = None) -> dict:
    pool: dict = {"deployment": {"ray_actor_options": {"num_cpus": 0.1}}, "workers": 1,
                  "torch_threads": 1, "max_batch_tokens": 64}
    if budget is not None:
        pool["memory_bytes"] = budget
    return {"models": [{"id": m, "source": str(tiny_models[m])} for m in MODELS],
            "cache_dir": str(cache_dir), "gpu": "off", "cpu_pool": pool,
            "ingress": {"deployment": {"num_replicas": 1,
                                       "ray_actor_options": {"num_cpus": 0.1}}}}


def _footprints(tiny_models, cache_dir, budget: int) -> dict:
    """Each model's footprint as the pool counts it once loaded (its exact weights)."""
    settings = BlitzSettings.from_args(_args(tiny_models, cache_dir, budget))
    out = {}
    for spec in settings.models:
        encoder = load_encoder(spec, "cpu", cache_dir)
        out[spec.id] = size_model(spec, settings.cpu_pool, "cpu", budget, model_shape(spec),
                                  weights=encoder.weight_bytes(),
                                  max_seq_length=encoder.max_seq_length)
    return out


async def test_a_model_that_does_not_fit_evicts_the_least_recently_used(
        serve_instance, tiny_models, tmp_path):
    from ray import serve

    from deployments.app import build_app

    roomy = _footprints(tiny_models, tmp_path, 2**40)
    budget = needed_bytes([roomy["tiny-b"], roomy["tiny-c"]], 1) + roomy["tiny-a"].weights // 2
    sized = _footprints(tiny_models, tmp_path, budget)
    assert needed_bytes([sized["tiny-b"], sized["tiny-c"]], 1) <= budget  # two fit
    assert needed_bytes(list(sized.values()), 1) > budget  # three do not
    serve.run(build_app(_args(tiny_models, tmp_path, budget)), name=APP, route_prefix=PREFIX)
    try:
        async with httpx.AsyncClient(base_url=serve_instance + PREFIX, timeout=120) as http:
            for model in MODELS:
                r = await http.post("/embed", json={"texts": ["x"], "model": model})
                assert r.status_code == 200, r.text
            stats = await serve.get_deployment_handle("CPUPool", APP).stats.remote()
            assert stats["evicted"] == ["tiny-a"], stats
            assert stats["loaded"] == ["tiny-b", "tiny-c"]
            memory = stats["memory"]
            assert memory["budget_bytes"] == budget
            assert memory["needed_bytes"] <= budget
            info = (await http.get("/info", params={"model": "tiny-b"})).json()
            assert 1 <= info["max_batch_tokens"] <= 64  # the setting, capped by memory
    finally:
        serve.delete(APP)
