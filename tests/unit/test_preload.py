"""Preloading: the settings that name preloaded models, and /ready while pools start
(no Ray; the replica side is tests/integration/test_preload.py)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from pydantic import ValidationError

from blitz.config import MAX_MODELS_PER_REPLICA, BlitzSettings
from blitz.http_api import HttpApi
from blitz.local import LocalDispatcher
from blitz.service import EmbeddingService

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
    ({"cpu_pool": {"preload": ["m1", "m2", "m3"]}}, "default model 'm0', which /ready loads"),
])
def test_preload_that_cannot_stay_resident_is_refused(pools, message):
    with pytest.raises(ValidationError, match=message.replace("[", r"\[").replace("]", r"\]")):
        settings(**pools)


def test_a_full_cpu_preload_that_includes_the_default_model_is_accepted():
    full = settings(cpu_pool={"preload": ["m2", "m0", "m1"]})
    assert len(full.cpu_pool.preload) == MAX_MODELS_PER_REPLICA


class GatedDispatcher(LocalDispatcher):
    """Model calls wait for ``open``: a pool whose replicas are still preloading."""

    def __init__(self, settings):
        super().__init__(settings)
        self.open = asyncio.Event()
        self.calls = 0

    async def embed(self, pool, model_id, job):
        self.calls += 1
        await self.open.wait()
        return await super().embed(pool, model_id, job)


async def test_ready_answers_503_while_the_pool_starts_and_200_once_it_answers():
    config = BlitzSettings.from_args({"models": [{"id": "fake", "source": "fake:8"}],
                                      "ingress": {"ready_timeout_s": 0.05}})
    dispatcher = GatedDispatcher(config)
    api = HttpApi(EmbeddingService(config, dispatcher))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(api),
                                 base_url="http://blitz") as client:
        waiting = [await client.get("/ready") for _ in range(2)]
        assert [r.status_code for r in waiting] == [503, 503]
        assert waiting[0].headers["retry-after"]
        dispatcher.open.set()
        assert (await client.get("/ready")).status_code == 200
    assert dispatcher.calls == 1  # the probes shared one check, which went on past its timeout
