"""Model loads neither stall nor evict the models a pool replica already serves."""

from __future__ import annotations

import asyncio

import httpx

from tests.integration.conftest import APP
from tests.waiting import wait_until_async


async def _embed(client: httpx.AsyncClient, model: str) -> httpx.Response:
    return await client.post("/embed", json={"texts": ["isolation"], "model": model},
                             headers={"accept": "application/json"})


async def test_a_slow_load_does_not_stall_resident_models(blitz_app):
    from ray import serve

    pool = serve.get_deployment_handle("CPUPool", APP)

    async def slow_loading() -> bool:
        return (await pool.stats.remote())["loading"] == "slow"

    async with httpx.AsyncClient(base_url=blitz_app, timeout=120) as client:
        assert (await _embed(client, "tiny-a")).status_code == 200
        slow = asyncio.ensure_future(_embed(client, "slow"))  # a 6 s load starts
        await wait_until_async(slow_loading, "the slow model's load to start")
        for _ in range(5):
            assert (await _embed(client, "tiny-a")).status_code == 200
        assert not slow.done()  # tiny-a answered while "slow" was still loading
        assert (await slow).status_code == 200


async def test_a_model_that_cannot_load_evicts_nothing(blitz_app):
    from ray import serve

    pool = serve.get_deployment_handle("CPUPool", APP)
    async with httpx.AsyncClient(base_url=blitz_app, timeout=120) as client:
        for model in ("tiny-a", "tiny-b", "tiny-c"):
            assert (await _embed(client, model)).status_code == 200
        before = await pool.stats.remote()
        for _ in range(3):
            assert (await _embed(client, "broken")).status_code == 424
        after = await pool.stats.remote()
    assert sorted(after["loaded"]) == ["tiny-a", "tiny-b", "tiny-c"]
    assert after["evictions"] == before["evictions"]
