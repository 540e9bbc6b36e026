"""OpenTelemetry traces on a live app (``tracing.otlp_endpoint``): one request with a
``traceparent`` gives the seven spans of docs/operations.md, "Traces (OpenTelemetry)", in
the client's trace, exported over OTLP/HTTP by the ingress replica and by the CPU pool
replica (another process), each under its parent, over the local hop and over Serve's
handle alike."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

EXPORTED_WITHIN_S = 60  # replicas export every 5 s (the SDK's batch delay): a bound, not a timing
FOUND_WITHIN_S = 60
CHAIN = [("POST /embed", None), ("blitz.ingress_queue", "POST /embed"),
         ("blitz.hop", "POST /embed"), ("blitz.pool", "blitz.hop"),
         ("blitz.pool_queue", "blitz.pool"), ("blitz.batch", "blitz.pool"),
         ("blitz.model", "blitz.batch")]


class Collector(BaseHTTPRequestHandler):
    """An OTLP/HTTP collector's ``/v1/traces``: every span received, with its process."""

    spans: list[dict[str, Any]] = []
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        body = self.rfile.read(int(self.headers["content-length"]))
        request = ExportTraceServiceRequest.FromString(body)
        found = []
        for resource_spans in request.resource_spans:
            resource = {a.key: a.value for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    found.append({
                        "name": span.name, "trace_id": span.trace_id.hex(),
                        "span_id": span.span_id.hex(), "parent": span.parent_span_id.hex(),
                        "service": resource["service.name"].string_value,
                        "pid": resource["process.pid"].int_value})
        with Collector.lock:
            Collector.spans.extend(found)
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture(scope="module")
def collector() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def traced_apps(serve_instance, tiny_models, collector):
    from ray import serve

    from deployments.app import build_app

    names = {"auto": "it-traces-hop", "serve": "it-traces-serve"}
    for pool_hop, name in names.items():
        args = {"models": [{"id": "tiny-a", "source": str(tiny_models["tiny-a"])}],
                "gpu": "off",
                "tracing": {"otlp_endpoint": collector, "service_name": "blitz-it"},
                "cpu_pool": {"torch_threads": 1, "workers": 1, "deployment": {
                    "num_replicas": 1, "ray_actor_options": {"num_cpus": 0.1}}},
                "ingress": {"pool_hop": pool_hop, "deployment": {
                    "num_replicas": 1, "ray_actor_options": {"num_cpus": 0.1}}}}
        serve.run(build_app(args), name=name, route_prefix=f"/{name}")
    yield {pool_hop: (serve_instance + f"/{name}", name) for pool_hop, name in names.items()}
    for name in names.values():
        serve.delete(name)


def _embed(base: str, trace_id: str) -> None:
    reply = httpx.post(f"{base}/embed", json={"texts": ["traced"]}, timeout=60, headers={
        "traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"})
    assert reply.status_code == 200, reply.text


def _trace(trace_id: str) -> list[dict[str, Any]]:
    with Collector.lock:
        return [span for span in Collector.spans if span["trace_id"] == trace_id]


async def _hop_calls(app: str) -> int | None:
    from ray import serve

    return (await serve.get_deployment_handle("CPUPool", app).stats.remote())["local_hop_calls"]


@pytest.mark.parametrize("pool_hop", ["auto", "serve"])
async def test_one_requests_spans_come_from_both_processes_in_the_clients_trace(
        traced_apps, pool_hop):
    base, app = traced_apps[pool_hop]
    if pool_hop == "auto":  # the local hop is found in the background: wait until it is used
        deadline = time.monotonic() + FOUND_WITHIN_S
        while not await _hop_calls(app):
            assert time.monotonic() < deadline, "the ingress never took the local hop"
            _embed(base, secrets.token_hex(16))
    trace_id = secrets.token_hex(16)
    _embed(base, trace_id)
    deadline = time.monotonic() + EXPORTED_WITHIN_S
    while len(_trace(trace_id)) < len(CHAIN):
        assert time.monotonic() < deadline, f"spans received: {_trace(trace_id)}"
        time.sleep(0.2)
    spans = _trace(trace_id)
    named = {span["name"]: span for span in spans}
    assert sorted(named) == sorted(name for name, _ in CHAIN) and len(spans) == len(CHAIN)
    for name, parent in CHAIN:
        if parent is not None:
            assert named[name]["parent"] == named[parent]["span_id"], name
    ingress_side = {named[n]["pid"] for n in ("POST /embed", "blitz.ingress_queue", "blitz.hop")}
    pool_side = {named[n]["pid"] for n in ("blitz.pool", "blitz.pool_queue", "blitz.batch",
                                           "blitz.model")}
    assert len(ingress_side) == len(pool_side) == 1 and ingress_side != pool_side
    assert {span["service"] for span in spans} == {"blitz-it"}
