"""Replica logs (deployments/logs.py): Serve's buffered log handler, as throughput-optimized
mode installs it, writes warnings at once and rare events when Blitz flushes them."""

from __future__ import annotations

import logging
import logging.handlers

import pytest

from deployments.logs import flush_replica_log, route_library_logs_to_serve


class ListHandler(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def serve_buffer():
    """A replica's logger as Serve 2.60 sets it up with RAY_SERVE_THROUGHPUT_OPTIMIZED=1."""
    serve, library = logging.getLogger("ray.serve"), logging.getLogger("blitz")
    saved = (serve.handlers[:], serve.level, library.handlers[:], library.level,
             library.propagate)
    written = ListHandler()
    buffer = logging.handlers.MemoryHandler(1000, flushLevel=logging.ERROR, target=written)
    serve.handlers[:] = [buffer]
    serve.setLevel(logging.INFO)
    library.handlers[:] = []
    yield written
    serve.handlers[:], library.handlers[:] = saved[0], saved[2]
    serve.setLevel(saved[1])
    library.setLevel(saved[3])
    library.propagate = saved[4]


def test_warnings_are_written_at_once_info_when_flushed(serve_buffer):
    route_library_logs_to_serve()
    logging.getLogger("ray.serve").info("loaded model 'minilm'")
    assert serve_buffer.messages == []  # buffered, as Serve does for the request path
    logging.getLogger("blitz.service").warning("readiness: no replica")
    assert serve_buffer.messages == ["loaded model 'minilm'", "readiness: no replica"]
    logging.getLogger("ray.serve").info("cpu pool replica constructed in 1.00 s")
    flush_replica_log()
    assert serve_buffer.messages[-1] == "cpu pool replica constructed in 1.00 s"


def test_flush_without_a_buffer_does_nothing(serve_buffer):
    logging.getLogger("ray.serve").handlers[:] = [serve_buffer]
    flush_replica_log()
    route_library_logs_to_serve()
    assert serve_buffer.messages == []
