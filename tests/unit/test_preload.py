"""Preloading: the settings that name preloaded models, and /ready while pools start
(no Ray; the replica side is tests/integration/test_preload.py)."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from blitz.pool.dispatcher import ReplicaDispatcher
from blitz.settings.config import MAX_MODELS_PER_REPLICA, BlitzSettings
from tests.api_client import api_client, api_for
from tests.waiting import wait_until_async

MODELS = [{"id": f"m{i}", "source": "fake:4"} for i in range(MAX_MODELS_PER_REPLICA + 1)]


def settings(**pools) -> BlitzSettings:
    return BlitzSettings.from_args({"models": MODELS, **pools})


def test_preload_is_off_by_default_and_takes_registered_ids():
    assert settings().cpu_pool.preload == [] and settings().gpu_pool.preload == []
    chosen = settings(cpu_pool={"preload": ["m0", "m1"]}, gpu_pool={"preload": ["m3"]})
    assert chosen.cpu_pool.preload == ["m0", "m1"] and chosen.gpu_pool.preload == ["m3"]


@pytest.mark.parametrize("pools, message", [
    ({"cpu_pool": {"preload": [m["id"] for m in MODELS]}}, "a replica holds at most 3"),
    ({"gpu_pool": {"preload": ["m0", "m0"]}}, "lists a model twice"),
    ({"gpu_pool": {"preload": ["nope"]}}, "gpu_pool.preload names unknown models: ['nope']"),
    ({"cpu_pool": {"preload": ["m1", "m2", "m3"]}}, "default model 'm0': its first request"),
])
def test_preload_that_cannot_stay_resident_is_refused(pools, message):
    with pytest.raises(ValidationError, match=message.replace("[", r"\[").replace("]", r"\]")):
        settings(**pools)


def test_a_full_cpu_preload_that_includes_the_default_model_is_accepted():
    full = settings(cpu_pool={"preload": ["m2", "m0", "m1"]})
    assert len(full.cpu_pool.preload) == MAX_MODELS_PER_REPLICA


class StartingDispatcher(ReplicaDispatcher):
    """Pools that start when told (``running``), and model calls that wait for ``open``: a
    pool whose replicas are still starting or preloading."""

    def __init__(self, settings):
        super().__init__(settings)
        self.running: frozenset[str] = frozenset()
        self.open = asyncio.Event()
        self.calls = 0

    def running_pools(self):
        return self.running

    async def submit(self, pool, model_id, job):
        self.calls += 1
        await self.open.wait()
        return await super().submit(pool, model_id, job)


async def test_impatient_probes_get_answers_during_start_up_and_ready_follows_the_pool():
    """Probes that give up after 0.5 s (Kubernetes' default is 1 s) each get an answer
    while the pool starts, and the first probe after it runs answers 200: nothing a
    probe that left behind stays stuck, and no probe calls a model."""
    config = BlitzSettings.from_args({"models": [{"id": "fake", "source": "fake:8"}]})
    dispatcher = StartingDispatcher(config)
    api = api_for(config, dispatcher)
    async with api_client(api, timeout=0.5) as client:
        starting = await asyncio.gather(*(client.get("/ready") for _ in range(8)))
        assert {r.status_code for r in starting} == {503}
        assert all(r.headers["retry-after"] for r in starting)
        dispatcher.running = frozenset({"cpu"})
        r = await client.get("/ready")
        assert r.status_code == 200
        assert r.json() == {"status": "ready", "default_model": "fake", "pools": ["cpu"]}
        # a full model queue (calls that never return) does not make the replica unready
        stuck = asyncio.ensure_future(client.post("/embed", json={"texts": ["a"]}))
        await wait_until_async(lambda: dispatcher.calls == 1, "the /embed to reach the pool")
        assert (await client.get("/ready")).status_code == 200
        stuck.cancel()
    assert dispatcher.calls == 1  # the /embed above; readiness loaded nothing


async def test_a_cpu_pool_that_scales_to_zero_is_ready_without_a_replica():
    config = BlitzSettings.from_args({"models": [{"id": "fake", "source": "fake:8"}],
                                      "cpu_pool": {"deployment": {
                                          "autoscaling_config": {"min_replicas": 0}}}})
    async with api_client(config, StartingDispatcher(config)) as client:
        assert (await client.get("/ready")).status_code == 200


class UnplacedDispatcher(StartingDispatcher):
    """A CPU pool replica the cluster cannot place: /ready names what the cluster has."""

    def unplaced_pools(self):
        return {"cpu": "needs 8 CPU; the cluster has 2 free"}


async def test_with_api_keys_ready_tells_a_caller_without_a_key_only_its_status():
    """/ready stays public, but with keys on only a valid key reads the model
    ids, pools and what the cluster has free; anyone else gets the bare status, with the
    same status code and Retry-After."""
    config = BlitzSettings.from_args({"models": [{"id": "secret-model", "source": "fake:8"}],
                                      "auth": {"api_keys": ["k1", "k2"]}})
    dispatcher = UnplacedDispatcher(config)
    key = {"authorization": "Bearer k2"}
    async with api_client(config, dispatcher) as client:
        for headers in ({}, {"authorization": "Bearer wrong"}):
            r = await client.get("/ready", headers=headers)
            assert (r.status_code, r.json()) == (503, {"status": "not_ready"})
            assert r.headers["retry-after"] == "5"
        r = await client.get("/ready", headers=key)
        assert r.status_code == 503 and r.headers["retry-after"] == "5"
        assert "secret-model" in r.text and "2 free" in r.text
        dispatcher.running = frozenset({"cpu"})
        r = await client.get("/ready")
        assert (r.status_code, r.json()) == (200, {"status": "ready"})
        r = await client.get("/ready", headers=key)
        assert r.status_code == 200 and r.json()["default_model"] == "secret-model"
        assert r.json()["unplaced"] == {"cpu": "needs 8 CPU; the cluster has 2 free"}


def test_the_old_readiness_settings_are_accepted_and_ignored(caplog):
    config = BlitzSettings.from_args({"models": MODELS[:1], "ingress": {
        "ready_timeout_s": 5, "ready_cache_s": 5, "pool_timeout_s": 7}})
    assert config.ingress.pool_timeout_s == 7
    assert "ingress.ready_timeout_s is no longer used" in caplog.text
