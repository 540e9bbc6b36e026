"""An ASGI app served by uvicorn on 127.0.0.1 (a free port) for the length of a block, for
tests that drive it with a real client process (Node, Chromium)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import uvicorn


@asynccontextmanager
async def served(app: Any) -> AsyncIterator[str]:
    """Yields the base URL (``http://127.0.0.1:PORT``) while uvicorn serves ``app``."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, lifespan="off", ws="none", log_level="error",
                                           access_log=False))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if serving.done():
                pytest.fail(f"uvicorn did not start: {serving.exception()!r}")
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await serving
        sock.close()
