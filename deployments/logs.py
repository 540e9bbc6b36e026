"""Blitz's library logs in the replica log (Serve's handlers), where operators look."""

from __future__ import annotations

import logging
import logging.handlers


def route_library_logs_to_serve() -> None:
    """Send the ``blitz`` loggers' records (tracebacks with request ids) to the replica log."""
    library = logging.getLogger("blitz")
    if not library.handlers:
        for handler in logging.getLogger("ray.serve").handlers:
            library.addHandler(handler)
        library.setLevel(logging.INFO)
        library.propagate = False
    for handler in _buffers():  # warnings reach the file at once, as errors do
        handler.flushLevel = min(handler.flushLevel, logging.WARNING)


def flush_replica_log() -> None:
    """Write out what Serve's log buffer holds. With ``RAY_SERVE_THROUGHPUT_OPTIMIZED``
    Serve buffers 1,000 records per replica and writes at once only on ERROR, so a
    killed replica loses the rest: called after rare events (start-up, a model loaded or
    evicted), so they reach the replica log when they happen."""
    for handler in _buffers():
        handler.flush()


def _buffers() -> list[logging.handlers.MemoryHandler]:
    return [h for h in logging.getLogger("ray.serve").handlers
            if isinstance(h, logging.handlers.MemoryHandler)]
