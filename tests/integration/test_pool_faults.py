"""A pool replica under faults of its own: a model load that hangs, model calls that hang,
a handle caller naming a model nobody registered.

Each fault gets an app of its own on the session's shared Ray + Serve instance (a replica
stuck on purpose is replaced by Serve, so it must not be the main app's). Fake models
(``fake:<dim>[:<load s>[:<batch s>]]``, blitz/settings/registry.py) hang: an hour's load or an
hour's batch. Every request gets its answer in bounded time: 424 for the hung load, 503
with Retry-After while the replica cannot serve, 200 once Serve has replaced it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from blitz.errors import as_blitz_error
from blitz.hop_messages import EmbedJob, RerankJob
from tests.integration.conftest import APP as MAIN_APP
from tests.waiting import wait_until_async

DEADLINE_S = 180  # bound on every wait; a healthy run needs a small part of it
POLL_S = 0.5  # between two looks at a replica's stats
LOAD_TIMEOUT_S = 3
CALL_TIMEOUT_S = 2
HOUR = 3600
# Serve checks health every 10 s and replaces a replica after 3 failures in a row
REPLACED_WITHIN_S = 120


def _app(models: list[dict], cpu_pool: dict) -> dict:
    return {"models": models, "gpu": "off",
            "cpu_pool": {"torch_threads": 1, **cpu_pool,
                         "deployment": {"ray_actor_options": {"num_cpus": 0.1},
                                        "graceful_shutdown_timeout_s": 5}},
            "ingress": {"pool_timeout_s": 30,
                        "deployment": {"num_replicas": 1,
                                       "ray_actor_options": {"num_cpus": 0.1}}}}


def _deploy(name: str, args: dict) -> str:
    from ray import serve

    from deployments.app import build_app

    serve.run(build_app(args), name=name, route_prefix=f"/{name}")
    return f"/{name}"


async def _health_problem(pool) -> str | None:
    """What the replica's ``check_health`` raises now, or None when it passes."""
    try:
        await pool.check_health.remote()
    except Exception as exc:  # a RayTaskError carrying the RuntimeError's text
        return str(exc)
    return None


async def _replaced(pool, pid: int) -> bool:
    try:
        return (await pool.stats.remote())["pid"] != pid
    except Exception:  # the old replica stopping, the new one starting
        return False


async def _embed(http: httpx.AsyncClient, model: str) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    r = await http.post("/embed", json={"texts": [f"a text for {model}"], "model": model})
    return r, time.monotonic() - started


def _retry_later(r: httpx.Response) -> bool:
    return r.status_code == 503 and r.headers.get("retry-after") is not None


async def test_a_hung_load_is_a_424_and_its_replica_is_replaced(serve_instance):
    from ray import serve

    app = "it-pool-hung-load"
    prefix = _deploy(app, _app(
        [{"id": "ok", "source": "fake:8"}, {"id": "hangs", "source": f"fake:8:{HOUR}"},
         {"id": "later", "source": "fake:8"}],
        {"load_timeout_s": LOAD_TIMEOUT_S, "load_failure_ttl_s": 600, "preload": ["ok"]}))
    pool = serve.get_deployment_handle("CPUPool", app)
    try:
        pid = (await pool.stats.remote())["pid"]
        async with httpx.AsyncClient(base_url=serve_instance + prefix, timeout=60) as http:
            r, took = await _embed(http, "hangs")
            assert r.status_code == 424, r.text
            assert LOAD_TIMEOUT_S <= took < LOAD_TIMEOUT_S + 15
            assert r.json()["error"]["code"] == "model_load_failed"

            r, took = await _embed(http, "hangs")  # remembered: at once
            assert r.status_code == 424 and took < 5
            r, _ = await _embed(http, "ok")  # a resident model is still served
            assert r.status_code == 200, r.text
            r, took = await _embed(http, "later")  # nothing can load behind the stuck load
            assert _retry_later(r) and took < 5, r.text
            stats = await pool.stats.remote()
            assert stats["loading"] == "hangs" and stats["load_overdue_s"] > 0

            await wait_until_async(lambda: _health_problem(pool), "check_health to fail",
                                   timeout_s=60, interval_s=POLL_S)
            assert "'hangs' is stuck" in await _health_problem(pool)
            await wait_until_async(lambda: _replaced(pool, pid), "Serve to replace the replica",
                                   timeout_s=REPLACED_WITHIN_S, interval_s=POLL_S)
            r, _ = await _embed(http, "later")
            assert r.status_code == 200, r.text
            assert await _health_problem(pool) is None
    finally:
        serve.delete(app)


async def test_hung_model_calls_answer_503_and_their_replica_is_replaced(serve_instance):
    from ray import serve

    app = "it-pool-hung-calls"
    prefix = _deploy(app, _app(
        [{"id": "hangs", "source": f"fake:8:0:{HOUR}"}, {"id": "ok", "source": "fake:8"}],
        {"workers": 2, "call_timeout_s": CALL_TIMEOUT_S, "preload": ["hangs", "ok"]}))
    pool = serve.get_deployment_handle("CPUPool", app)
    try:
        pid = (await pool.stats.remote())["pid"]
        async with httpx.AsyncClient(base_url=serve_instance + prefix, timeout=60) as http:
            # two calls, one after the other so that each is a batch of its own: both
            # workers hang, and each caller gets its 503 at the call timeout
            first = asyncio.ensure_future(_embed(http, "hangs"))
            await wait_until_async(lambda: _busy_workers(pool, 1),
                                   "the first call to take a worker",
                                   timeout_s=DEADLINE_S, interval_s=POLL_S)
            second = asyncio.ensure_future(_embed(http, "hangs"))
            for r, took in await asyncio.gather(first, second):
                assert _retry_later(r) and took < CALL_TIMEOUT_S + 10, r.text
            await wait_until_async(lambda: _stuck_workers(pool, 2), "both workers to be stuck",
                                   timeout_s=DEADLINE_S, interval_s=POLL_S)

            # no worker can run anything now: refused at once, not queued behind them
            for model in ("hangs", "ok"):
                r, took = await _embed(http, model)
                assert _retry_later(r) and took < CALL_TIMEOUT_S, (model, r.text)
            tokens = pool.options(multiplexed_model_id="ok")
            with pytest.raises(Exception) as refused:  # token-id jobs share the workers
                await tokens.run_jobs.remote([EmbedJob(token_ids=[[1, 2, 3]])])
            assert as_blitz_error(refused.value).status == 503
            assert "worker threads are stuck" in await _health_problem(pool)

            await wait_until_async(lambda: _replaced(pool, pid), "Serve to replace the replica",
                                   timeout_s=REPLACED_WITHIN_S, interval_s=POLL_S)
            r, _ = await _embed(http, "ok")
            assert r.status_code == 200, r.text
    finally:
        serve.delete(app)


async def _busy_workers(pool, n: int) -> bool:
    return (await pool.stats.remote())["busy_workers"] >= n


async def _stuck_workers(pool, n: int) -> bool:
    return (await pool.stats.remote())["stuck_workers"] >= n


async def test_an_unknown_model_id_on_a_pool_handle_is_a_404_and_creates_nothing(blitz_app):
    from ray import serve

    pool = serve.get_deployment_handle("CPUPool", MAIN_APP)
    stranger = pool.options(multiplexed_model_id="no-such-model")
    calls: list[Callable[[], Any]] = [
        lambda: stranger.run_jobs.remote([EmbedJob(texts=["x"]),
                                          EmbedJob(token_ids=[[1, 2]])]),
        lambda: stranger.run_jobs.remote([RerankJob(query="q", documents=["d"])])]
    for call in calls:
        with pytest.raises(Exception) as refused:
            await call()
        error = as_blitz_error(refused.value)
        assert (error.status, error.code) == (404, "model_not_found")
    stats = await pool.stats.remote()
    assert "no-such-model" not in stats["waiting_texts"]
    assert "no-such-model" not in stats["loaded"]
