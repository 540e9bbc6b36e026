"""Operations at scale: autoscaling, redeploys and drains, each under load.

- **Autoscaling**: sustained load grows the CPU pool from its minimum (1) toward its
  maximum (3) and, once the load falls to a trickle, shrinks it back to 1; large
  requests wake the GPU pool from zero, and after its idle delay it goes back to zero.
  Replica counts are the ones Serve reports (``serve.status()``); every request must
  answer 200 throughout.
- **Redeploy**: ``serve.run`` of changed args (a model added, a batch setting changed)
  under the same app name while clients send load: every request 200, the pool's
  replica replaced, and the new model answers afterwards.
- **Drain**: requests in flight on a pool replica (a slow model) answer 200 when the app
  is redeployed and when it is deleted: the replicas finish their work before they stop.

Delays are short settings (seconds); the models are fakes whose batches take a set time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import httpx
import pytest

from blitz import codecs
from tests.faults.conftest import small_app
from tests.faults.load import LoadRecord, run_clients, send
from tests.waiting import wait_until_async

CPU_MAX = 3
LOOK_BACK_S = 11.0  # the shortest window Ray 2.60 takes (its metrics push every 10 s)
WAIT_S = 90  # bound on each replica transition


async def running(app: str, deployment: str) -> int:
    """RUNNING replicas of ``deployment`` as Serve's controller reports them."""
    from ray import serve

    status = await asyncio.to_thread(serve.status)
    return status.applications[app].deployments[deployment].replica_states.get("RUNNING", 0)


async def wait_for(condition: Callable[[], object], what: str, timeout_s: float = WAIT_S):
    """Poll the async ``condition`` until it is true; fail naming ``what`` after the bound."""
    await wait_until_async(condition, what, timeout_s, interval_s=0.5)


def embed(model: str, texts: int, dim: int):
    async def request(client: httpx.AsyncClient) -> httpx.Response:
        return await client.post("/embed", json={"texts": [f"text {i}" for i in range(texts)],
                                                 "model": model},
                                 headers={"accept": "application/msgpack"})

    def check(r: httpx.Response) -> None:
        assert codecs.unpack(r.content)["embeddings"].shape == (texts, dim)

    return request, check


async def test_pools_scale_up_under_load_and_down_when_idle(deploy):
    from ray import serve

    app = "fault-autoscale"
    delays = {"upscale_delay_s": 1, "downscale_delay_s": 2, "downscale_to_zero_delay_s": 2,
              "look_back_period_s": LOOK_BACK_S, "target_ongoing_requests": 1}

    def pool(replicas: tuple[int, int], **actor: float) -> dict:
        return {"torch_threads": 1, "max_batch_size": 16, "deployment": {
            "autoscaling_config": {**delays, "min_replicas": replicas[0],
                                   "max_replicas": replicas[1]},
            "ray_actor_options": {"num_cpus": 0.1, **actor}}}
    url = deploy(app, {
        "models": [{"id": "busy", "source": "fake:8:0:0.25"}],  # each batch takes 0.25 s
        "gpu": "on", "routing": {"gpu_min_batch": 10},
        "cpu_pool": pool((1, CPU_MAX)), "gpu_pool": pool((0, 1), num_gpus=0.1),
        "ingress": {"deployment": {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0.1}},
                    "pool_timeout_s": 60}})
    assert await running(app, "CPUPool") == 1
    assert await running(app, "GPUPool") == 0  # min_replicas 0: no GPU replica until work

    small, small_check = embed("busy", 2, 8)  # under gpu_min_batch: CPU pool
    large, large_check = embed("busy", 12, 8)  # GPU pool
    record = LoadRecord()
    seen = {"cpu": 0, "gpu": 0}
    phase = {"done": False}

    async def watch() -> bool:
        seen["cpu"] = max(seen["cpu"], await running(app, "CPUPool"))
        seen["gpu"] = max(seen["gpu"], await running(app, "GPUPool"))
        return seen["cpu"] >= 2 and seen["gpu"] == 1

    async def grow() -> None:
        # A direct call wakes the GPU pool whatever the ingress's routing does meanwhile.
        gpu_stats = await serve.get_deployment_handle("GPUPool", app).stats.remote()
        assert gpu_stats["pool"] == "gpu"
        try:
            await wait_for(watch, "CPU pool at 2+ replicas and GPU pool at 1 under load")
        finally:
            phase["done"] = True

    started = time.monotonic()
    await asyncio.gather(
        run_clients(url, 8, small, lambda: phase["done"], WAIT_S + 30, record,
                    check=small_check),
        run_clients(url, 2, large, lambda: phase["done"], WAIT_S + 30, record,
                    check=large_check),
        grow())
    grew_s = time.monotonic() - started
    assert 2 <= seen["cpu"] <= CPU_MAX

    # Idle (a trickle of single small requests): the CPU pool shrinks to its minimum and
    # the GPU pool, which gets no request at all, goes back to zero.
    async def shrunk() -> bool:
        return await running(app, "CPUPool") == 1 and await running(app, "GPUPool") == 0

    trickle_record = LoadRecord()
    stop = {"done": False}

    async def trickle() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            while not stop["done"]:
                await send(client, trickle_record, small, small_check)
                await asyncio.sleep(0.5)

    async def shrink() -> None:
        try:
            await wait_for(shrunk, "CPU pool back to 1 replica and GPU pool back to 0")
        finally:
            stop["done"] = True

    started = time.monotonic()
    await asyncio.gather(trickle(), shrink())
    shrank_s = time.monotonic() - started
    print(f"\nautoscaling: up to {seen['cpu']} CPU + {seen['gpu']} GPU replicas in "
          f"{grew_s:.1f} s under load ({record.statuses()}); back to 1 CPU + 0 GPU in "
          f"{shrank_s:.1f} s ({trickle_record.statuses()})")
    assert record.outcomes and trickle_record.outcomes
    for r in (record, trickle_record):
        assert set(r.statuses()) == {200}, [o for o in r.outcomes if o.status != 200][:5]


async def test_redeploy_under_load_drops_no_request_and_serves_the_new_model(deploy):
    from ray import serve

    from deployments.app import build_app

    app = "fault-redeploy"
    before = small_app([{"id": "a", "source": "fake:8:0:0.05"}])
    after = small_app([{"id": "a", "source": "fake:8:0:0.05"}, {"id": "b", "source": "fake:16"}],
                      cpu_pool={"max_batch_size": 16})
    url = deploy(app, before)
    pool = serve.get_deployment_handle("CPUPool", app)
    old_pid = (await pool.stats.remote())["pid"]
    request, check = embed("a", 2, 8)
    record = LoadRecord()
    phase = {"done": False}

    async def redeploy() -> None:
        try:
            await asyncio.sleep(2)  # load first
            # serve.run blocks until the new version is RUNNING; off the event loop, so the
            # clients keep sending meanwhile
            await asyncio.to_thread(serve.run, build_app(after), name=app,
                                    route_prefix=f"/{app}")
            await asyncio.sleep(2)  # and load after
        finally:
            phase["done"] = True

    await asyncio.gather(
        run_clients(url, 4, request, lambda: phase["done"], 120, record, check=check),
        redeploy())
    print(f"\nredeploy under load: {record.statuses()}")
    assert len(record.outcomes) > 20
    assert set(record.statuses()) == {200}, [o for o in record.outcomes if o.status != 200][:5]
    assert (await pool.stats.remote())["pid"] != old_pid, "the pool replica was not replaced"
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        new_request, new_check = embed("b", 3, 16)
        reply = await new_request(client)
        assert reply.status_code == 200, reply.text
        new_check(reply)
        models = (await client.get("/models", headers={"accept": "application/json"})).json()
        assert {"a", "b"} <= {m["id"] for m in models["data"]}


async def test_in_flight_requests_drain_on_redeploy_and_on_delete(deploy):
    from ray import serve

    from deployments.app import build_app

    app = "fault-drain"
    models = [{"id": "slow", "source": "fake:8:0:3"}]  # each batch takes 3 s
    pool_options = {"deployment": {"graceful_shutdown_timeout_s": 30,
                                   "graceful_shutdown_wait_loop_s": 0.2}}
    args = small_app(models, cpu_pool=pool_options)
    url = deploy(app, args)
    pool = serve.get_deployment_handle("CPUPool", app)
    request, check = embed("slow", 1, 8)

    async def both_at_the_pool() -> bool:
        stats = await pool.stats.remote()
        return (stats["running_batches"].get("slow", 0)
                + stats["waiting_texts"].get("slow", 0)) == 2

    async def in_flight_through(change: Callable[[], None]) -> list[httpx.Response]:
        """Two slow requests reach the pool replica; then ``change`` runs (in a thread)."""
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            replies = [asyncio.ensure_future(request(client)) for _ in range(2)]
            await wait_for(both_at_the_pool, "two requests running or queued on the pool",
                           timeout_s=30)
            await asyncio.to_thread(change)
            return list(await asyncio.gather(*replies))

    old_pid = (await pool.stats.remote())["pid"]
    changed = {**args, "cpu_pool": {**args["cpu_pool"], "max_batch_size": 16}}
    replies = await in_flight_through(
        lambda: serve.run(build_app(changed), name=app, route_prefix=f"/{app}"))
    for reply in replies:
        assert reply.status_code == 200, reply.text
        check(reply)
    assert (await pool.stats.remote())["pid"] != old_pid, "the pool replica was not replaced"

    replies = await in_flight_through(lambda: serve.delete(app))
    for reply in replies:
        assert reply.status_code == 200, reply.text
        check(reply)
    assert app not in serve.status().applications


@contextlib.contextmanager
def cpus_claimed(cpus: float):
    """A placement group holding ``cpus`` CPUs of the cluster (whole bundles, then one
    fraction: Ray takes fractions only below 1), removed on exit."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    bundles = [{"CPU": 1.0}] * int(cpus)
    if cpus - int(cpus) > 0.01:
        bundles.append({"CPU": round(cpus - int(cpus), 2)})
    group = placement_group(bundles, strategy="PACK")
    try:
        ray.get(group.ready(), timeout=60)
        yield
    finally:
        remove_placement_group(group)


@pytest.mark.parametrize("cpu_pool", ["replicas", "in_process"])
async def test_redeploy_on_a_cluster_with_no_free_cpu_completes(deploy, cpu_pool):
    """Every CPU of the cluster is claimed (the app's replicas and a placement group hold
    them all): a redeploy that adds a model must still complete, the ingress replaced in
    place, not wait forever for room for its surge replica while the old config serves on.
    Every request answers 200 or 503 with Retry-After, and the new model answers within the
    bound. With the CPU pool inside the ingress (``in_process``) the ingress's replacement
    is the pool's too: the same holds."""
    import ray
    from ray import serve

    from deployments.app import build_app

    app = f"fault-redeploy-full-{cpu_pool.replace('_', '-')}"
    ingress_cpus = 0.5
    pool = {"deployment": {"ray_actor_options": {"num_cpus": 0.1}}}
    ingress = {"cpu_pool": cpu_pool,
               "deployment": {"ray_actor_options": {"num_cpus": ingress_cpus}}}
    before = small_app([{"id": "a", "source": "fake:8"}], cpu_pool=pool, ingress=ingress)
    after = small_app([{"id": "a", "source": "fake:8"}, {"id": "b", "source": "fake:16"}],
                      cpu_pool=pool, ingress=ingress)
    url = deploy(app, before)
    free = ray.available_resources().get("CPU", 0.0)
    with cpus_claimed(free - 0.05):  # a crumb stays free, too small for a surge replica
        assert ray.available_resources().get("CPU", 0.0) < ingress_cpus
        request, check = embed("a", 2, 8)
        record = LoadRecord()
        phase = {"done": False}

        async def redeploy() -> None:
            try:
                await asyncio.sleep(1)
                serve.run_many([serve.RunTarget(build_app(after), name=app,
                                                route_prefix=f"/{app}")],
                               wait_for_applications_running=False)
                async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                    new_request, new_check = embed("b", 3, 16)

                    async def new_model_answers() -> bool:
                        reply = await new_request(client)
                        if reply.status_code == 200:
                            new_check(reply)
                        return reply.status_code == 200

                    await wait_for(new_model_answers, "the new model after a redeploy on a "
                                   "full cluster")
            finally:
                phase["done"] = True

        await asyncio.gather(
            run_clients(url, 2, request, lambda: phase["done"], WAIT_S + 30, record,
                        check=check),
            redeploy())
    print(f"\nredeploy on a full cluster: {record.statuses()}")
    assert record.outcomes and not record.bad(), record.bad()[:5]
    assert await running(app, "Ingress") == 1
