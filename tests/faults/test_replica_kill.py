"""Fault: the CPU pool's replica process is SIGKILLed while 16 clients send single texts.

Every request must end as 200, or 503 with Retry-After, within 30 s (none hangs, none
is a 500), and the service must answer 200 again within 60 s of the kill.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import numpy as np

from blitz import codecs
from tests.faults.conftest import small_app
from tests.faults.load import LoadRecord, run_clients

APP = "fault-kill"
CLIENTS = 16


async def test_killed_pool_replica_loses_no_request(deploy, tiny_models):
    from ray import serve

    url = deploy(APP, small_app([{"id": "tiny-a", "source": str(tiny_models["tiny-a"])}]))
    pool = serve.get_deployment_handle("CPUPool", APP)
    record = LoadRecord()
    killed_at: list[float] = []
    state = {"recovered": None}

    async def request(client):
        return await client.post("/embed", json={"texts": ["one text, please"]},
                                 headers={"accept": "application/msgpack"})

    def check(r):
        assert codecs.unpack(r.content)["embeddings"].shape == (1, 32)

    def until() -> bool:
        if killed_at and state["recovered"] is None:
            after = [o for o in record.outcomes
                     if o.status == 200 and o.started > killed_at[0]]
            if after:
                state["recovered"] = min(o.started + o.seconds for o in after) - killed_at[0]
        return state["recovered"] is not None and time.monotonic() > killed_at[0] + \
            state["recovered"] + 5

    async def kill_after(delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        pid = (await pool.stats.remote())["pid"]
        os.kill(pid, signal.SIGKILL)
        killed_at.append(time.monotonic())

    await asyncio.gather(
        run_clients(url, CLIENTS, request, until, deadline_s=90, record=record, check=check),
        kill_after(4.0))

    statuses = record.statuses()
    worst = max(o.seconds for o in record.outcomes)
    print(f"\nreplica kill: {statuses}, recovered after {state['recovered']} s, "
          f"slowest reply {worst:.1f} s")
    assert killed_at, "the replica was never killed"
    assert not record.bad(), record.bad()[:5]  # only 200 or 503 + Retry-After, none lost
    assert worst < 30
    assert state["recovered"] is not None and state["recovered"] < 60
    assert np.isfinite(worst)
