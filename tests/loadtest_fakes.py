"""Fakes for the load generator's tests (tests/unit/test_loadtest_*.py): vectors from the
fake encoder, and the naive baseline server on them over real TCP."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import uvicorn

from blitz.encoders.fake import FakeEncoder
from loadtest.naive_server import create_app
from tests.ports import free_port
from tests.waiting import wait_until

DIM = 16


def fake_vectors(texts: list[str], dim: int = DIM) -> np.ndarray:
    return FakeEncoder("fake", dim).embed(texts, normalize=True).values


@contextmanager
def naive_server() -> Iterator[str]:
    """The naive baseline (loadtest/naive_server.py) on ``fake_vectors``, served by uvicorn
    on a thread; its URL."""
    app = create_app(fake_vectors, model_name="fake")
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(),
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), "the naive server to start", 20,
               interval_s=0.02)
    assert server.started, "the naive server did not start"
    try:
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(10)
