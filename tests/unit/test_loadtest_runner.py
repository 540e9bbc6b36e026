"""The load generator's runs (loadtest.runner), end to end: through the real Blitz HTTP
API on a fake encoder over ``httpx.ASGITransport``, through small fault-injecting apps, and
over real TCP to the naive baseline server (on a fake encoder) served by uvicorn on a free
local port."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import replace

import httpx
import numpy as np
import orjson
import pytest
from starlette.requests import Request
from starlette.responses import Response

from blitz import codecs
from blitz.settings.config import BlitzSettings
from loadtest.apis import API_NAMES
from loadtest.http_client import HTTP_CLIENTS
from loadtest.runner import ConfigError, LoadConfig, run_load, run_sweep
from tests.api_client import api_for
from tests.loadtest_fakes import DIM, fake_vectors
from tests.ports import free_port


def test_config_rejects_impossible_runs():
    for bad in ({"concurrency": 0}, {"texts_per_request": 0}, {"duration_s": None},
                {"requests": 0}, {"warmup_s": -1}):
        with pytest.raises(ConfigError):
            LoadConfig(**bad)


def blitz_transport(api_keys: list[str] | None = None,
                    on_request: Callable[[int], object] | None = None,
                    ) -> tuple[httpx.ASGITransport, list]:
    settings = BlitzSettings.from_args({
        "models": [{"id": "fake", "source": "fake:16"}],
        "auth": {"api_keys": api_keys or []},
    })
    api = api_for(settings)
    seen: list[str] = []

    async def app(scope, receive, send):
        seen.append(scope["path"])
        if on_request is not None:
            on_request(len(seen))
        await api(scope, receive, send)

    return httpx.ASGITransport(app), seen


@pytest.mark.parametrize("api", API_NAMES)
async def test_run_against_blitz_http_api(api):
    transport, seen = blitz_transport()
    config = LoadConfig(url="http://blitz", api=api, model="fake", texts_per_request=3,
                        concurrency=4, requests=40, warmup_s=0.0)
    result = await run_load(config, transport=transport)
    s = result.summary
    assert (s.requests, s.errors, s.embeddings) == (40, 0, 120)
    assert len(seen) == 40  # nothing sent beyond the count
    assert s.reply_bytes_per_request >= 3 * DIM * 4
    if api != "raw":
        assert s.tokens > 0  # usage was read from each reply


async def test_warmup_is_excluded_and_nothing_is_lost():
    transport, seen = blitz_transport()
    config = LoadConfig(url="http://blitz", api="native-msgpack", model="fake",
                        concurrency=4, requests=30, warmup_s=0.2)
    result = await run_load(config, transport=transport)
    assert result.warmup_requests > 0
    assert result.summary.requests == 30
    assert len(seen) == result.warmup_requests + 30


async def test_duration_bound_sweep_counts_only_the_window():
    pace, window = 0.1, 0.6  # the server answers each request after `pace` seconds
    seen: list[int] = []
    transport = httpx.ASGITransport(json_app(lambda i, values: (200, values), pace_s=pace,
                                             seen=seen))
    config = LoadConfig(url="http://paced", api="native-json", model="fake",
                        concurrency=2, duration_s=window, warmup_s=0.1)
    results = await run_sweep(config, [1, 3], transport=transport)
    assert [r.config.concurrency for r in results] == [1, 3]
    for r in results:
        workers = r.config.concurrency
        assert r.summary.duration_s == pytest.approx(window) and r.summary.errors == 0
        # a worker completes at most one request per `pace`, plus one begun in the warm-up
        assert 0 < r.summary.requests <= workers * (round(window / pace) + 1)
    # three paced workers complete about three times as many requests as one
    assert results[1].summary.requests_per_s > 2 * results[0].summary.requests_per_s
    measured = sum(r.warmup_requests + r.summary.requests for r in results)
    assert len(seen) >= measured  # requests finishing after a window are not counted


async def test_api_key_is_sent():
    transport, _ = blitz_transport(api_keys=["k-123"])
    base = LoadConfig(url="http://blitz", model="fake", concurrency=2, requests=6,
                      warmup_s=0.0)
    without = await run_load(base, transport=transport)
    assert without.summary.error_kinds == {"http_401": 6}
    with_key = await run_load(replace(base, api_key="k-123"), transport=transport)
    assert with_key.summary.requests == 6 and with_key.summary.errors == 0


async def test_stop_event_ends_a_run_early_with_a_report():
    stop = asyncio.Event()
    transport, seen = blitz_transport(on_request=lambda n: n >= 10 and stop.set())
    config = LoadConfig(url="http://blitz", model="fake", concurrency=2, duration_s=600,
                        warmup_s=0.0)
    started = time.perf_counter()
    result = await asyncio.wait_for(run_load(config, transport=transport, stop=stop), 60)
    elapsed = time.perf_counter() - started
    assert 8 <= result.summary.requests <= 10 and len(seen) == 10
    assert 0 < result.summary.duration_s <= elapsed  # the window ended at the stop


def json_app(fault: Callable[[int, np.ndarray], tuple[int, np.ndarray]], pace_s: float = 0.0,
             seen: list[int] | None = None):
    """A JSON /embed that lets ``fault`` change the status or the vectors of request i,
    answers after ``pace_s`` seconds, and appends i to ``seen``."""
    counter = iter(range(10**9))

    async def app(scope, receive, send):
        request = Request(scope, receive)
        texts = orjson.loads(await request.body())["texts"]
        await asyncio.sleep(pace_s)
        i = next(counter)
        if seen is not None:
            seen.append(i)
        status, values = fault(i, fake_vectors(texts))
        if status == 0:
            raise ConnectionResetError("dropped")
        body = codecs.dumps_json({"embeddings": values}) if status == 200 else b"{}"
        await Response(body, status_code=status, media_type="application/json")(
            scope, receive, send)

    return app


def break_some(i: int, values: np.ndarray) -> tuple[int, np.ndarray]:
    kind = i % 6
    if kind == 1:
        return 503, values
    if kind == 2:
        return 200, values[:-1]
    if kind == 3:
        values = values.copy()
        values[0, 0] = np.nan
        return 200, values
    if kind == 4:
        return 200, values[:, :8]
    if kind == 5:
        return 0, values
    return 200, values


async def test_errors_are_counted_by_kind_without_stopping():
    transport = httpx.ASGITransport(json_app(break_some), raise_app_exceptions=False)
    config = LoadConfig(url="http://faulty", api="native-json", texts_per_request=2,
                        concurrency=1, requests=60, warmup_s=0.0)
    s = (await run_load(config, transport=transport)).summary
    assert s.requests == 10 and s.embeddings == 20
    assert s.error_kinds == {"http_503": 10, "verify_count": 10, "verify_nonfinite": 10,
                             "verify_dimension": 10, "http_500": 10}


@pytest.mark.parametrize(("http_client", "kind"), [("aiohttp", "ClientConnectorError"),
                                                   ("httpx", "ConnectError")])
async def test_unreachable_server_is_an_exception_kind(http_client, kind):
    config = LoadConfig(url=f"http://127.0.0.1:{free_port()}", concurrency=2, requests=4,
                        warmup_s=0.0, timeout_s=2, http_client=http_client)
    s = (await run_load(config)).summary
    assert s.requests == 0 and s.error_kinds == {f"exception_{kind}": 4}


@pytest.mark.parametrize("http_client", HTTP_CLIENTS)
@pytest.mark.parametrize("api", ["native-json", "openai-float", "openai-base64"])
async def test_run_against_naive_server_over_tcp(naive_url, api, http_client):
    config = LoadConfig(url=naive_url, api=api, model="fake", texts_per_request=5,
                        concurrency=3, requests=24, warmup_s=0.0, dimension=DIM,
                        http_client=http_client)
    s = (await run_load(config)).summary
    assert (s.requests, s.errors, s.embeddings) == (24, 0, 120)
    assert s.latency_ms.p50 <= s.latency_ms.p95 <= s.latency_ms.p99 <= s.latency_ms.max


async def test_server_cpu_is_reported_per_request(naive_url):
    # the "server" is this process (uvicorn on a thread): its CPU time is all there is
    config = LoadConfig(url=naive_url, api="native-json", model="fake", concurrency=2,
                        requests=100, warmup_s=0.0, server_pids=(os.getpid(),))
    cpu_before = time.process_time()
    s = (await run_load(config)).summary
    cpu_s = time.process_time() - cpu_before
    assert s.server_cpu_ms_per_request is not None
    server_s = s.server_cpu_ms_per_request * (s.requests + s.errors) / 1000
    # the run's CPU time minus the client's set-up and tear-down, in 10 ms clock ticks
    assert 0.3 * cpu_s <= server_s <= cpu_s + 0.02
    assert s.machine_busy_pct is not None and 0 < s.machine_busy_pct <= 100
    assert s.others_busy_pct is not None and 0 <= s.others_busy_pct <= 100
    without = (await run_load(replace(config, server_pids=()))).summary
    assert without.server_cpu_ms_per_request is None
