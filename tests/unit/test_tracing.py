"""OpenTelemetry traces (blitz.runtime.tracing), with the SDK's in-memory exporter: one
request's spans and their parent links, from the client's ``traceparent`` through the
ingress, its queue, the hop and the pool replica's queue, batch and model call, in one
process and across a real process boundary (the local hop's socket); the sampler's no
sends nothing on; with traces off the request path imports no opentelemetry at all; and
``configure`` with an endpoint exports over OTLP/HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from blitz.grpc_api import tei_pb2 as pb
from blitz.hop_messages import EmbedJob, RerankJob
from blitz.ingress.service import EmbeddingService
from blitz.pool.local_hop import LocalHopClient
from blitz.pool.replica import PoolReplica
from blitz.runtime import tracing
from blitz.settings.config import BlitzSettings, TracingSettings
from tests.api_client import api_client, tei_servicer
from tests.traced_pool import ARGS, MODEL, in_memory, plain, serve_pool

REPO = Path(__file__).resolve().parents[2]
CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
TRACESTATE = "vendor=abc"
BOUND_S = 60  # a bound on each wait for the child process, not a timing assertion
SLACK_NS = 2_000_000  # spans made from measured times nest within this (clock reads apart)
CHAIN = [("POST /embed", None), ("blitz.ingress_queue", "POST /embed"),
         ("blitz.hop", "POST /embed"), ("blitz.pool", "blitz.hop"),
         ("blitz.pool_queue", "blitz.pool"), ("blitz.batch", "blitz.pool"),
         ("blitz.model", "blitz.batch")]  # each span and its parent's name


@pytest.fixture
def spans(request: pytest.FixtureRequest) -> Iterator[Any]:
    """This process traced into memory; the exporter. ``tracing.install``'s options come
    from an indirect parameter (``traced``), if any."""
    provider, exporter = in_memory(**getattr(request, "param", {}))
    try:
        yield exporter
    finally:
        tracing.uninstall()
        provider.shutdown()


def traced(**options: Any) -> Any:
    """A test whose ``spans`` are traced with ``tracing.install``'s ``options``."""
    return pytest.mark.parametrize("spans", [options], indirect=True)


class InProcessPool:
    """The CPU pool's replica logic in the ingress's process (``ingress.cpu_pool:
    in_process``)."""

    def __init__(self, settings: BlitzSettings):
        self.replica = PoolReplica(settings, "cpu")

    async def run_jobs_for(self, model_id: str, jobs: list) -> list:
        return await self.replica.run_jobs(model_id, jobs)


class HopHandle:
    """Stands in for the pool's Serve handle: ``options(...).run_jobs.remote(jobs)`` goes
    down a real local hop to a pool replica in another process."""

    deployment_name = "CPUPool"
    is_initialized = True

    def __init__(self, client: LocalHopClient):
        self.client = client

    def options(self, **_: Any) -> HopHandle:
        return self

    @property
    def run_jobs(self) -> HopHandle:
        return self

    async def remote(self, jobs: list) -> list:
        return await self.client.call(MODEL, jobs)


def service_on(pool: Any = None, handles: dict | None = None) -> EmbeddingService:
    """The real ingress (service, dispatcher with its queue and hop spans) on ``pool``, an
    in-process pool, or on ``handles``."""
    from deployments.ingress import InProcessCpuDispatcher, ServeDispatcher

    settings = BlitzSettings.from_args(ARGS)
    dispatcher = (InProcessCpuDispatcher(settings, pool or InProcessPool(settings), {})
                  if handles is None else ServeDispatcher(settings, handles))
    return EmbeddingService(settings, dispatcher)


async def embed(service: EmbeddingService, headers: dict[str, str]) -> httpx.Response:
    async with api_client(service) as client:
        reply = await client.post("/embed", json={"texts": ["a", "b"]},
                                  headers={"accept": "application/json", **headers})
    assert reply.status_code == 200, reply.text
    return reply


def check_chain(found: list[dict[str, Any]], parent_of_ingress: int | None) -> None:
    """``found`` holds one request's spans, each under its parent (``CHAIN``), in one
    trace, each within its parent's time."""
    named = {span["name"]: span for span in found}
    assert sorted(named) == sorted(name for name, _ in CHAIN) and len(found) == len(CHAIN)
    assert len({span["trace_id"] for span in found}) == 1
    for name, parent in CHAIN:
        span = named[name]
        if parent is None:
            assert span["parent"] == parent_of_ingress
            continue
        assert span["parent"] == named[parent]["span_id"], f"{name}'s parent is not {parent}"
        assert named[parent]["start"] - SLACK_NS <= span["start"] <= span["end"] \
            <= named[parent]["end"] + SLACK_NS, f"{name} is not within {parent}"
    kinds = {name: named[name]["kind"] for name in ("POST /embed", "blitz.hop", "blitz.pool")}
    assert kinds == {"POST /embed": "SERVER", "blitz.hop": "CLIENT", "blitz.pool": "SERVER"}


async def test_one_request_has_a_span_per_hop_under_the_clients_traceparent(spans):
    reply = await embed(service_on(), {"traceparent": TRACEPARENT, "tracestate": TRACESTATE})
    found = [plain(span) for span in spans.get_finished_spans()]
    check_chain(found, int(CLIENT_SPAN, 16))
    named = {span["name"]: span for span in found}
    ingress = named["POST /embed"]
    assert ingress["trace_id"] == int(CLIENT_TRACE, 16) and ingress["remote_parent"]
    assert {span["state"] for span in found} == {TRACESTATE}  # tracestate goes along
    assert ingress["attributes"] | {"blitz.request_id": "-"} == {
        "http.request.method": "POST", "url.path": "/embed", "http.route": "/embed",
        "blitz.request_id": "-", "http.response.status_code": 200, "blitz.model": MODEL,
        "blitz.pool": "cpu", "blitz.texts": 2, "blitz.tokens": ingress["attributes"][
            "blitz.tokens"]}
    assert ingress["attributes"]["blitz.request_id"] == reply.headers["x-request-id"]
    assert named["blitz.batch"]["attributes"]["blitz.batch.texts"] == 2
    assert "server-timing" in reply.headers  # the timings the spans are made from


async def test_a_request_without_traceparent_starts_a_trace_of_its_own(spans):
    await embed(service_on(), {"traceparent": "00-not-a-valid-header-01"})
    check_chain([plain(span) for span in spans.get_finished_spans()], None)


@traced(trust_remote_sampling=True)
async def test_a_request_the_client_did_not_sample_gets_no_spans_and_sends_none_on(spans):
    """With ``tracing.trust_remote_sampling``: the caller's sampled flag decides."""
    class Watching(InProcessPool):
        jobs: list = []

        async def run_jobs_for(self, model_id: str, jobs: list) -> list:
            self.jobs.extend(jobs)
            return await super().run_jobs_for(model_id, jobs)

    settings = BlitzSettings.from_args(ARGS)
    pool = Watching(settings)
    await embed(service_on(pool), {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-00"})
    assert spans.get_finished_spans() == ()
    assert [job.trace for job in pool.jobs] == [None]


async def test_by_default_the_callers_sampled_flag_does_not_decide(spans):
    """``trust_remote_sampling`` off (the default), ``sample_ratio`` 1: a caller that says
    "not sampled" is traced all the same, in its own trace."""
    await embed(service_on(), {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-00"})
    found = [plain(span) for span in spans.get_finished_spans()]
    check_chain(found, int(CLIENT_SPAN, 16))
    assert {span["trace_id"] for span in found} == {int(CLIENT_TRACE, 16)}


@traced(sample_ratio=0.0)
async def test_by_default_a_caller_cannot_have_its_requests_traced_past_the_ratio(spans):
    """``sample_ratio`` 0: a caller's "sampled" traceparent (any trace id it likes) makes
    no spans, and no context goes on to the pool."""
    settings = BlitzSettings.from_args(ARGS)
    pool = InProcessPool(settings)
    jobs: list = []
    run = pool.run_jobs_for

    async def watched(model_id: str, sent: list) -> list:
        jobs.extend(sent)
        return await run(model_id, sent)

    pool.run_jobs_for = watched  # type: ignore[method-assign]
    for trace_id in (CLIENT_TRACE, "0" * 31 + "1"):  # a trace id a ratio sampler keeps
        await embed(service_on(pool), {"traceparent": f"00-{trace_id}-{CLIENT_SPAN}-01"})
    assert spans.get_finished_spans() == ()
    assert [job.trace for job in jobs] == [None, None]


def test_the_local_decision_is_a_draw_under_the_ratio(spans):
    from opentelemetry.trace import get_current_span

    sampled = tracing._otel.propagator.extract({"traceparent": TRACEPARENT})
    unsampled = tracing._otel.propagator.extract(
        {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-00"})
    for context in (sampled, unsampled):
        assert tracing.sampled_here(context, 0.5, draw=lambda: 0.5) is None
        kept = tracing.sampled_here(context, 0.5, draw=lambda: 0.49)
        parent = get_current_span(kept).get_span_context()
        assert parent.trace_flags.sampled and parent.is_remote
        assert (parent.trace_id, parent.span_id) == (int(CLIENT_TRACE, 16),
                                                     int(CLIENT_SPAN, 16))
    fresh = tracing._otel.propagator.extract({})
    assert tracing.sampled_here(fresh, 0.0, draw=lambda: 0.9) is fresh  # the sampler's


async def test_a_request_whose_key_is_refused_makes_no_span(spans):
    settings = BlitzSettings.from_args({**ARGS, "auth": {"api_keys": ["right"]}})
    service = EmbeddingService(settings, service_on().dispatcher)
    async with api_client(service) as client:
        for key, status in (("wrong", 401), (None, 401), ("right", 200)):
            reply = await client.post(
                "/embed", json={"texts": ["a"]},
                headers={"traceparent": TRACEPARENT, "accept": "application/json",
                         **({"authorization": f"Bearer {key}"} if key else {})})
            assert reply.status_code == status, reply.text
    found = [plain(span) for span in spans.get_finished_spans()]
    ingress = [span for span in found if span["name"] == "POST /embed"]
    assert [span["attributes"]["http.response.status_code"] for span in ingress] == [200]
    tei = tei_servicer(service)
    context = GrpcContext([("traceparent", TRACEPARENT), ("authorization", "Bearer wrong")])
    await tei.unary("Embed", pb.EmbedRequest(inputs="hello"), context)
    assert context.code is not None and context.code.name == "UNAUTHENTICATED"
    assert len(spans.get_finished_spans()) == len(found)  # none more


async def test_jobs_that_share_a_pool_batch_each_get_their_spans_linked_to_the_others(spans):
    replica = PoolReplica(BlitzSettings.from_args(ARGS), "cpu")
    tracer = tracing.TRACER
    hops = [tracer.start_span(f"hop {k}") for k in range(2)]
    carriers = [tracing.RequestSpan(hop).carrier for hop in hops]
    results = await replica.run_jobs(MODEL, [EmbedJob(texts=["a"], trace=carriers[0]),
                                             RerankJob("q", ["d1", "d2"], trace=carriers[1]),
                                             EmbedJob(texts=["untraced"])])
    assert len(results) == 3 and replica.batches_run == {MODEL: 1}  # one batch for all
    found = [plain(span) for span in spans.get_finished_spans()]
    pools = {span["parent"]: span for span in found if span["name"] == "blitz.pool"}
    batches = [span for span in found if span["name"] == "blitz.batch"]
    assert sorted(pools) == sorted(hop.get_span_context().span_id for hop in hops)
    assert len(batches) == 2  # one per traced job, in its own trace
    for batch in batches:
        own = next(span for span in pools.values() if span["span_id"] == batch["parent"])
        other = next(span for span in pools.values() if span is not own)
        assert batch["trace_id"] == own["trace_id"] and batch["links"] == [other["span_id"]]
        assert batch["attributes"]["blitz.batch.jobs"] == 3
        assert batch["attributes"]["blitz.batch.texts"] == 1 + 2 + 1


async def test_the_context_crosses_the_process_boundary_to_a_pool_over_the_local_hop(spans):
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    child = context.Process(target=serve_pool, args=(theirs,), daemon=True)
    child.start()
    try:
        assert await asyncio.to_thread(ours.poll, BOUND_S), "the pool process did not start"
        client = await LocalHopClient.connect(ours.recv())
        try:
            await embed(service_on(handles={"cpu": HopHandle(client)}),
                        {"traceparent": TRACEPARENT, "tracestate": TRACESTATE})
        finally:
            client.close()
        ours.send("spans?")
        assert await asyncio.to_thread(ours.poll, BOUND_S), "the pool process sent no spans"
        theirs_found = ours.recv()
    finally:
        child.join(BOUND_S)
        if child.is_alive():
            child.kill()
    ours_found = [plain(span) for span in spans.get_finished_spans()]
    assert {span["name"] for span in ours_found} == {
        "POST /embed", "blitz.ingress_queue", "blitz.hop"}
    assert {span["name"] for span in theirs_found} == {
        "blitz.pool", "blitz.pool_queue", "blitz.batch", "blitz.model"}
    assert {span["pid"] for span in theirs_found} == {child.pid} != {os.getpid()}
    check_chain(ours_found + theirs_found, int(CLIENT_SPAN, 16))
    assert {span["trace_id"] for span in theirs_found} == {int(CLIENT_TRACE, 16)}
    assert {span["state"] for span in theirs_found} == {TRACESTATE}


class GrpcContext(SimpleNamespace):
    def __init__(self, metadata: list[tuple[str, str]]):
        super().__init__(metadata=metadata, code=None)

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return self.metadata

    def set_code(self, code: Any) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        pass

    def set_trailing_metadata(self, metadata: Any) -> None:
        pass


async def test_a_grpc_call_takes_its_traceparent_from_the_metadata(spans):
    service = service_on()
    tei = tei_servicer(service)
    reply = await tei.unary("Embed", pb.EmbedRequest(inputs="hello"),
                            GrpcContext([("traceparent", TRACEPARENT)]))
    assert len(reply.embeddings) == 4
    found = [plain(span) for span in spans.get_finished_spans()]
    named = {span["name"]: span for span in found}
    call = named["tei.v1.Embed/Embed"]
    assert call["parent"] == int(CLIENT_SPAN, 16) and call["kind"] == "SERVER"
    assert call["attributes"]["rpc.method"] == "Embed"
    assert named["blitz.hop"]["parent"] == call["span_id"]
    assert named["blitz.model"]["trace_id"] == int(CLIENT_TRACE, 16)


async def test_a_failed_request_ends_its_span_with_the_errors_kind(spans):
    async with api_client(service_on()) as client:
        reply = await client.post("/embed", json={"texts": ["a"], "model": "nope"})
    assert reply.status_code == 404
    (span,) = [plain(span) for span in spans.get_finished_spans()]
    assert span["attributes"]["http.response.status_code"] == 404
    assert span["attributes"]["error.type"] == "model_not_found"  # its code, not its text
    assert span["status"] == "UNSET"  # a client's error is not the server's


def _run(code: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, cwd=REPO, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


def _env_without_otel() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")} | {
        "PYTHONPATH": str(REPO)}


def test_with_traces_off_the_request_path_imports_no_opentelemetry():
    """A fresh interpreter serves HTTP and gRPC requests (a traceparent included) through
    the service, the ingress's queue and a pool replica with the default settings: not one
    opentelemetry module is imported, and jobs carry no context."""
    out = _run("""
        import asyncio, sys
        import httpx
        from blitz.grpc_api import tei_pb2 as pb
        from blitz.grpc_api.servicer import TeiServicer
        from blitz.http.api import HttpApi
        from blitz.ingress.other_outputs import OutputService
        from blitz.ingress.service import EmbeddingService
        from blitz.ingress.tokenizing import TokenService
        from blitz.pool.batching import Batcher
        from blitz.pool.dispatcher import ReplicaDispatcher
        from blitz.runtime import tracing
        from blitz.settings.config import BlitzSettings
        from tests.traced_pool import ARGS

        settings = BlitzSettings.from_args(ARGS)
        assert tracing.configure(settings.tracing) is False and tracing.TRACER is None
        seen = []

        class Queued(ReplicaDispatcher):  # an ingress queue in front of its pool replica
            def __init__(self, settings):
                super().__init__(settings)
                self.batcher = Batcher(lambda jobs: self.replica.run_jobs("m", jobs),
                                       max_batch=128, max_waiting=1024)

            async def submit(self, pool, model_id, job):
                seen.append(job.trace)
                return await self.batcher.submit(job)

        async def main():
            service = EmbeddingService(settings, Queued(settings))
            async with httpx.AsyncClient(transport=httpx.ASGITransport(HttpApi(service)),
                                         base_url="http://blitz") as client:
                reply = await client.post("/embed", json={"texts": ["a", "b"]}, headers={
                    "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})
                assert reply.status_code == 200, reply.text

            class Context:
                def invocation_metadata(self):
                    return [("traceparent",
                             "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")]

            tokens = TokenService(service)
            tei = TeiServicer(service, tokens, OutputService(service, tokens))
            assert (await tei.unary("Embed", pb.EmbedRequest(inputs="x"), Context())).embeddings

        asyncio.run(main())
        print(sorted(m for m in sys.modules if m.startswith("opentelemetry")), seen)
    """, _env_without_otel())
    assert out == "[] [None, None]"


class Collector(BaseHTTPRequestHandler):
    """An OTLP/HTTP collector's traces route: keeps each request's path and body."""

    received: list[tuple[str, bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["content-length"]))
        Collector.received.append((self.path, body))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        pass


@contextlib.contextmanager
def collector() -> Iterator[str]:
    Collector.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_configured_with_an_endpoint_spans_go_out_over_otlp_http():
    """A process with ``tracing.otlp_endpoint`` set exports its spans to the collector's
    ``/v1/traces`` (at exit at the latest: the SDK flushes then), named by service."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    with collector() as url:
        out = _run(f"""
            from blitz.runtime import tracing
            from blitz.settings.config import TracingSettings
            assert tracing.configure(TracingSettings(otlp_endpoint={url!r},
                                                     service_name="blitz-test"))
            span = tracing.start_request("POST /embed", {{}}, {{"url.path": "/embed"}})
            span.end(type("R", (), dict(model="m", pool="cpu", texts=1, tokens=2,
                                        error=""))(), False, {{}})
            print(tracing.TRACER is not None)
        """, _env_without_otel())
    assert out == "True"
    assert [path for path, _ in Collector.received] == ["/v1/traces"]
    request = ExportTraceServiceRequest.FromString(Collector.received[0][1])
    (resource_spans,) = request.resource_spans
    service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
    assert service["service.name"] == "blitz-test"
    names = [span.name for scope in resource_spans.scope_spans for span in scope.spans]
    assert names == ["POST /embed"]


def test_the_endpoint_comes_from_the_settings_or_the_environment():
    assert tracing.endpoint_of(None, {}) is None  # off by default
    assert tracing.endpoint_of("http://c:4318", {}) == "http://c:4318"
    assert tracing.endpoint_of(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://e:4318"}) == \
        "http://e:4318"
    assert tracing.endpoint_of("http://c:4318", {"OTEL_SDK_DISABLED": "true"}) is None
    assert tracing.traces_url("http://c:4318/") == "http://c:4318/v1/traces"
    assert tracing.traces_url("http://c:4318/v1/traces") == "http://c:4318/v1/traces"
    assert TracingSettings().otlp_endpoint is None and TracingSettings().sample_ratio == 1.0
    assert TracingSettings().trust_remote_sampling is False  # callers do not decide
