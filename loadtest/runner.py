"""The asyncio load generator: closed-loop workers sharing one pooled HTTP client.

``concurrency`` workers each send a request, wait for the reply, verify it and send the
next one. Throughput counts requests that *complete* inside the measured window, so the
window starts at full load: requests still in flight when the warm-up ends are counted
when they complete, and requests completing after a duration-bound window are dropped.

- duration-bound (``duration_s``): the window is ``[warm-up end, + duration_s)``;
- count-bound (``requests``): the window ends when that many requests have completed.

Latency runs from sending a request to holding its parsed numpy array.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import httpx
import numpy as np

from loadtest.apis import Api, auth_headers, get_api
from loadtest.corpus import batched, sentences
from loadtest.cpu import CpuProbe, CpuSample, delta
from loadtest.http_client import HTTP_CLIENTS, TRANSPORT_ERRORS, HttpClient, make_http_client
from loadtest.progress import NoProgress, Progress
from loadtest.stats import Recorder, Summary, summarize
from loadtest.verify import ReplyChecker, VerificationError, exception_kind, http_error_kind

DEFAULT_URL = "http://127.0.0.1:8000"
PROFILES: dict[str, tuple[int, int]] = {  # name -> (texts per request, concurrency)
    "single": (1, 32),
    "batch32": (32, 4),
}
TEXT_POOL_SIZE = 8192


class ConfigError(ValueError):
    """Settings that cannot make a run."""


@dataclass(frozen=True)
class LoadConfig:
    url: str = DEFAULT_URL
    api: str = "native-msgpack"
    model: str = "minilm"
    texts_per_request: int = 1
    concurrency: int = 32
    duration_s: float | None = 20.0
    requests: int | None = None  # when set, the run is count-bound and duration_s is ignored
    warmup_s: float = 5.0
    timeout_s: float = 60.0
    api_key: str | None = None
    dimension: int | None = None
    seed: int = 0
    path: str | None = None
    server_pids: tuple[int, ...] = ()  # processes (and children) whose CPU time to report
    http_client: str = "aiohttp"  # or httpx (loadtest/http_client.py says why aiohttp)

    def __post_init__(self) -> None:
        if self.texts_per_request < 1 or self.concurrency < 1:
            raise ConfigError("texts_per_request and concurrency must be >= 1")
        if self.requests is None and not (self.duration_s and self.duration_s > 0):
            raise ConfigError("give a positive duration_s or a number of requests")
        if self.requests is not None and self.requests < 1:
            raise ConfigError("requests must be >= 1")
        if self.warmup_s < 0:
            raise ConfigError("warmup_s must be >= 0")
        if self.http_client not in HTTP_CLIENTS:
            raise ConfigError(f"http_client must be one of {', '.join(HTTP_CLIENTS)}")

    def public(self) -> dict[str, Any]:
        """The settings as a report shows them (the API key masked)."""
        data = asdict(self)
        data["api_key"] = "***" if self.api_key else None
        if self.requests is not None:
            data["duration_s"] = None
        return data


@dataclass(frozen=True)
class RunResult:
    config: LoadConfig
    summary: Summary
    warmup_requests: int


def make_client(config: LoadConfig,
                transport: httpx.AsyncBaseTransport | None = None) -> HttpClient:
    """One client whose connection pool holds exactly one connection per worker."""
    return make_http_client(config.http_client, config.url, auth_headers(config.api_key),
                            config.timeout_s, config.concurrency, transport)


class _Run:
    def __init__(self, config: LoadConfig, api: Api, client: HttpClient,
                 texts: list[str], stop: asyncio.Event | None):
        self.config, self.api, self.client = config, api, client
        self.batches = batched(itertools.cycle(texts), config.texts_per_request)
        self.checker = ReplyChecker(config.dimension)
        self.warm, self.measured = Recorder(), Recorder()
        self.stop_event = stop or asyncio.Event()
        self.in_flight = 0
        now = time.perf_counter()
        self.t0 = now + config.warmup_s
        self.t1 = self.t0 + config.duration_s if config.requests is None else math.inf
        self.probe = CpuProbe(list(config.server_pids))
        self.started: tuple[float, CpuSample] | None = None  # client CPU, probe at start
        self.ended: tuple[float, CpuSample] | None = None
        self.stopped_at: float | None = None

    # -- the window -------------------------------------------------------------------
    def _issuing(self, now: float) -> bool:
        if self.stopped_at is not None or now >= self.t1:
            return False
        if self.stop_event.is_set():
            self._finish(now)
            return False
        if self.config.requests is not None and now >= self.t0:
            return self.measured.completed + self.in_flight < self.config.requests
        return True

    def _finish(self, at: float) -> None:
        if self.stopped_at is None:
            self.stopped_at = min(at, self.t1)
            self.ended = (time.process_time(), self.probe.sample())

    def _recorder_for(self, end: float) -> Recorder | None:
        if end < self.t0:
            return self.warm
        if self.stopped_at is not None and end >= self.stopped_at:
            return None
        if end >= self.t1:
            self._finish(self.t1)
            return None
        if self.started is None:
            self.started = (time.process_time(), self.probe.sample())
        if (self.config.requests is not None
                and self.measured.completed + 1 >= self.config.requests):
            self._finish(end)
        return self.measured

    # -- the workers ------------------------------------------------------------------
    async def worker(self) -> None:
        while self._issuing(time.perf_counter()):
            texts = next(self.batches)
            request = self.api.request(texts, self.config.model)
            kind, embeddings, tokens, reply_bytes = None, None, None, 0
            self.in_flight += 1
            start = time.perf_counter()
            try:
                response = await self.client.post(request.path, request.body,
                                                  request.headers)
                reply_bytes = len(response.content)
                if response.status_code != 200:
                    kind = http_error_kind(response.status_code)
                else:
                    reply = self.api.parse(response.content, response.headers)
                    embeddings, tokens = reply.embeddings, reply.tokens
            except VerificationError as exc:
                kind = exc.kind
            except TRANSPORT_ERRORS as exc:
                kind = exception_kind(exc)
            finally:
                self.in_flight -= 1
            end = time.perf_counter()
            if embeddings is not None:
                try:
                    self.checker.check(embeddings, len(texts))
                except VerificationError as exc:
                    kind = exc.kind
            recorder = self._recorder_for(end)
            if recorder is None:
                continue
            if kind is None:
                recorder.ok(end - start, len(texts), tokens, reply_bytes, len(request.body))
            else:
                recorder.error(kind)

    async def ticker(self, progress: Progress) -> None:
        while True:
            progress.update(self.status_line())
            await asyncio.sleep(0.25)

    def status_line(self) -> str:
        now = time.perf_counter()
        cfg = self.config
        head = f"{cfg.api} x{cfg.texts_per_request} c={cfg.concurrency}"
        if now < self.t0:
            return f"{head} | warm-up {now - self.t0 + cfg.warmup_s:4.1f}/{cfg.warmup_s:g}s"
        end = self.stopped_at or now
        elapsed = max(end - self.t0, 1e-9)
        m = self.measured
        where = (f"{m.completed}/{cfg.requests} req" if cfg.requests is not None
                 else f"{min(elapsed, cfg.duration_s or 0):5.1f}/{cfg.duration_s:g}s")
        recent = m.latencies_s[-500:]
        p50 = 1000 * float(np.median(recent)) if recent else math.nan
        return (f"{head} | {where} | {m.ok_count / elapsed:7.1f} req/s "
                f"{m.embeddings / elapsed:8.1f} emb/s | p50 {p50:6.1f} ms | "
                f"errors {m.error_count}")

    def result(self) -> RunResult:
        end = self.stopped_at if self.stopped_at is not None else min(
            self.t1, time.perf_counter())
        duration = max(end - self.t0, 0.0)
        client_cpu, cpu = 0.0, None
        if self.started is not None:
            ended = self.ended or (time.process_time(), self.probe.sample())
            client_cpu, cpu = ended[0] - self.started[0], delta(self.started[1], ended[1])
        return RunResult(self.config, summarize(self.measured, duration, client_cpu, cpu),
                         self.warm.completed)


async def run_load(config: LoadConfig, *, transport: httpx.AsyncBaseTransport | None = None,
                   progress: Progress | None = None, stop: asyncio.Event | None = None,
                   texts: list[str] | None = None) -> RunResult:
    """Run one load phase (warm-up, then the measured window) and summarize it.

    ``transport`` replaces the network (``httpx.ASGITransport``, ``httpx.MockTransport``);
    setting ``stop`` ends the window early and still returns what was measured.
    """
    api = get_api(config.api, config.path)
    progress = progress or NoProgress()
    client = make_client(config, transport)
    try:
        run = _Run(config, api, client, texts or sentences(TEXT_POOL_SIZE, config.seed), stop)
        ticker = asyncio.create_task(run.ticker(progress))
        try:
            await asyncio.gather(*(run.worker() for _ in range(config.concurrency)))
        finally:
            ticker.cancel()
        result = run.result()
        progress.done(run.status_line())
    finally:
        await client.aclose()
    return result


async def run_sweep(config: LoadConfig, concurrencies: list[int], *,
                    transport: httpx.AsyncBaseTransport | None = None,
                    progress: Progress | None = None,
                    stop: asyncio.Event | None = None) -> list[RunResult]:
    """``run_load`` once per concurrency, in order; ``stop`` ends the sweep early."""
    texts = sentences(TEXT_POOL_SIZE, config.seed)
    results = []
    for concurrency in concurrencies:
        step = replace(config, concurrency=concurrency)
        results.append(await run_load(step, transport=transport, progress=progress,
                                      stop=stop, texts=texts))
        if stop is not None and stop.is_set():
            break
    return results
