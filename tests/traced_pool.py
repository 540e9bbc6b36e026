"""Test scaffolding for traces (tests/unit/test_tracing.py): an SDK tracer provider that
keeps spans in memory, spans as plain dicts that cross a pipe, and a pool replica on a fake
model served over the local hop in a process of its own, traced there into memory."""

from __future__ import annotations

import asyncio
import os
from multiprocessing.connection import Connection
from typing import Any

from blitz.pool.local_hop import LocalHopServer
from blitz.pool.replica import PoolReplica
from blitz.runtime import tracing
from blitz.settings.config import BlitzSettings

MODEL = "m"
ARGS: dict[str, Any] = {"models": [{"id": MODEL, "source": "fake:4"}],
                        "cpu_pool": {"workers": 1}, "ingress": {"pool_hop": "serve"}}


def in_memory(**options: Any) -> tuple[Any, Any]:
    """Trace this process into memory: (the provider, its ``InMemorySpanExporter``);
    ``options`` go to ``tracing.install`` (``sample_ratio``, ``trust_remote_sampling``)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider, **options)
    return provider, exporter


def plain(span: Any) -> dict[str, Any]:
    """A finished span as a dict (picklable), with the process it was made in."""
    return {"name": span.name, "kind": span.kind.name, "trace_id": span.context.trace_id,
            "span_id": span.context.span_id, "state": span.context.trace_state.to_header(),
            "parent": span.parent.span_id if span.parent is not None else None,
            "remote_parent": span.parent.is_remote if span.parent is not None else None,
            "links": [link.context.span_id for link in span.links],
            "attributes": dict(span.attributes or {}), "status": span.status.status_code.name,
            "start": span.start_time, "end": span.end_time, "pid": os.getpid()}


def serve_pool(conn: Connection) -> None:
    """In a process of its own: a pool replica on a fake model behind a local hop, traced
    into memory. Sends the socket's path, then, when asked, its finished spans."""
    asyncio.run(_serve_pool(conn))


async def _serve_pool(conn: Connection) -> None:
    provider, exporter = in_memory()
    replica = PoolReplica(BlitzSettings.from_args(ARGS), "cpu")
    server = LocalHopServer(replica.run_jobs)
    await server.start()
    conn.send(server.path)
    try:
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)  # "spans?"
        conn.send([plain(span) for span in exporter.get_finished_spans()])
    finally:
        await server.aclose()
        provider.shutdown()
