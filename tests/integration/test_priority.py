"""Priorities on the live app: a high request overtakes low work queued before it (the
"busy" model: each batch 3 s; two pool calls in flight, both low when it arrives), a bad
priority is a 422 naming where it came from, and the handle API takes ``priority=``."""

from __future__ import annotations

import asyncio

import httpx

from tests.integration.conftest import APP
from tests.waiting import wait_until_async

QUEUE_FIRST_S = 0.5  # low requests sent this long before the high one, so they queue first


async def test_a_high_request_overtakes_low_work_queued_before_it(blitz_app):
    from ray import serve

    pool = serve.get_deployment_handle("CPUPool", APP)

    async def running() -> int:
        return (await pool.stats.remote())["running_batches"].get("busy", 0)

    async with httpx.AsyncClient(base_url=blitz_app, timeout=120) as client:
        def embed(text: str, priority: str) -> asyncio.Future[httpx.Response]:
            return asyncio.ensure_future(client.post(
                "/embed", json={"model": "busy", "texts": [text]},
                headers={"x-blitz-priority": priority, "accept": "application/json"}))

        first = [embed("low 1", "low"), embed("low 2", "low")]
        await wait_until_async(running, "the first low batches to run")
        queued = [embed("low 3", "low"), embed("low 4", "low")]
        await asyncio.sleep(QUEUE_FIRST_S)
        high = await embed("high", "high")
        assert high.status_code == 200, high.text
        assert not any(q.done() for q in queued)  # queued first, answered later
        for reply in await asyncio.gather(*first, *queued):
            assert reply.status_code == 200, reply.text  # low work finishes too


async def test_a_bad_priority_is_a_422_naming_it(blitz_app):
    async with httpx.AsyncClient(base_url=blitz_app, timeout=60) as client:
        header = await client.post("/embed", json={"texts": ["x"]},
                                   headers={"x-blitz-priority": "urgent"})
        body = await client.post("/embed", json={"texts": ["x"], "priority": "asap"})
        fine = await client.post("/v1/embeddings", json={"input": ["x"], "model": "minilm",
                                                         "priority": "low"})
    assert header.status_code == 422 and header.json()["error"]["param"] == "x-blitz-priority"
    assert body.status_code == 422 and body.json()["error"]["param"] == "priority"
    assert fine.status_code == 200, fine.text


async def test_the_handle_takes_a_priority(blitz_app):
    from ray import serve

    handle = serve.get_app_handle(APP)
    low = await handle.embed.remote(["bulk text"], model="minilm", priority="low")
    normal = await handle.embed.remote(["bulk text"], model="minilm")
    assert low.embeddings.shape == normal.embeddings.shape == (1, 384)
