"""Blitz's library logs in the replica log (Serve's handlers), where operators look."""

from __future__ import annotations

import logging


def route_library_logs_to_serve() -> None:
    """Send the ``blitz`` loggers' records (tracebacks with request ids) to the replica log."""
    library = logging.getLogger("blitz")
    if not library.handlers:
        for handler in logging.getLogger("ray.serve").handlers:
            library.addHandler(handler)
        library.setLevel(logging.INFO)
        library.propagate = False
