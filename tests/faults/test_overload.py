"""Fault: 256 concurrent 32-text requests against a small pool with short queues.

Every request gets 200 or a 503 with Retry-After (the queues refuse what they cannot
hold instead of growing), and the next request after the burst is a 200. The metrics
count each refusal once: ``blitz_503_replies`` (reason ``overloaded``) and
``blitz_rejected`` equal the 503s the clients saw.
"""

from __future__ import annotations

import asyncio

import httpx

from tests.faults.conftest import small_app
from tests.faults.load import LoadRecord, send
from tests.metrics_scrape import metrics_url, scrape_until_async, total

APP = "fault-overload"
REQUESTS = 256
TEXTS = [f"overload text number {i} about something" for i in range(32)]


async def test_overload_answers_200_or_fast_503(deploy, tiny_models):
    url = deploy(APP, small_app([{"id": "tiny-a", "source": str(tiny_models["tiny-a"])}],
                                cpu_pool={"max_queued_texts": 64},
                                ingress={"max_queued_texts": 128}))
    record = LoadRecord()
    limits = httpx.Limits(max_connections=REQUESTS, max_keepalive_connections=REQUESTS)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        assert (await client.post("/embed", json={"texts": ["warm"]})).status_code == 200

        async def request(c):
            return await c.post("/embed", json={"texts": TEXTS})

        await asyncio.gather(*(send(client, record, request) for _ in range(REQUESTS)))
        after = await client.post("/embed", json={"texts": TEXTS})

    statuses = record.statuses()
    refused = sorted(o.seconds for o in record.outcomes if o.status == 503)
    served = sorted(o.seconds for o in record.outcomes if o.status == 200)
    print(f"\noverload: {statuses}; median 503 in {refused[len(refused) // 2]:.2f} s, "
          f"median 200 in {served[len(served) // 2]:.2f} s" if refused and served else "")
    assert not record.bad(), record.bad()[:5]
    assert statuses.get(503, 0) > 0  # the bounds engaged: refused, not queued without end
    assert statuses.get(200, 0) > 0
    assert after.status_code == 200

    refusals = statuses.get(503, 0)
    assert all('"overloaded"' in o.error for o in record.outcomes if o.status == 503)

    def counted(samples) -> bool:
        ours = [s for s in samples if s.labels.get("application") == APP]
        return (total(ours, "ray_blitz_503_replies_total", reason="overloaded") == refusals
                and total(ours, "ray_blitz_rejected_total") == refusals)

    await scrape_until_async(metrics_url(), counted)
