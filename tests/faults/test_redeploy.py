"""Fault: the app is redeployed (one model more: new versions of the ingress and the CPU
pool) while 8 clients send single texts: no request may be lost to the swap.

The CPU pool is replaced in place (Serve's default for it, and what a full cluster
forces: the old replica stops before the new one starts), so for a while it has no
replica at all. Every request must end as 200, or 503 with Retry-After, well within
the clients' 20 s (Serve's own timeout is 180 s): none may hang. Before, a request that
reached the pool in that gap waited out its client (Serve's router waits for a replica
without end, Blitz's bound was pool_timeout_s), and a merged pool call cancelled with
the request that happened to start it left the others unanswered.
"""

from __future__ import annotations

import asyncio
import time

from tests.faults.conftest import small_app
from tests.faults.load import LoadRecord, run_clients

APP = "fault-redeploy-gap"
CLIENTS = 8
CLIENT_TIMEOUT_S = 20.0
AFTER_S = 5.0  # requests keep coming this long after the new version is RUNNING


def app_args(models: list[dict]) -> dict:
    return small_app(models, cpu_pool={"preload": [models[0]["id"]]},
                     ingress={"replica_wait_s": 3})


async def test_a_redeploy_answers_every_request(deploy, tiny_models):
    from ray import serve

    from deployments.app import build_app

    first = [{"id": "slow-load", "source": "fake:8:2"}]  # each load takes 2 s
    url = deploy(APP, app_args(first))
    record = LoadRecord()
    redeployed: list[float] = []

    async def request(client):
        return await client.post("/embed", json={"texts": ["one text, please"]})

    def until() -> bool:
        return bool(redeployed) and time.monotonic() > redeployed[0] + AFTER_S

    async def redeploy(delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        more = [*first, {"id": "tiny-a", "source": str(tiny_models["tiny-a"])}]
        await asyncio.to_thread(serve.run, build_app(app_args(more)), name=APP,
                                route_prefix=f"/{APP}")
        redeployed.append(time.monotonic())

    await asyncio.gather(
        run_clients(url, CLIENTS, request, until, deadline_s=150, record=record,
                    timeout_s=CLIENT_TIMEOUT_S),
        redeploy(3.0))

    statuses = record.statuses()
    print(f"\nredeploy: {statuses}, slowest reply "
          f"{max(o.seconds for o in record.outcomes):.1f} s")
    assert redeployed, "the redeploy never finished"
    assert not record.bad(), record.bad()[:5]  # only 200 or 503 + Retry-After, none lost
    late = [o for o in record.outcomes if o.started > redeployed[0]]
    assert late and all(o.status == 200 for o in late)
