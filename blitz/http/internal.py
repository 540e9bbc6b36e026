"""Requests made inside the server: a batch's lines, each answered by the HTTP app itself
(every route's parsing, limits, cost budget and reply), in this process, with no socket.
``run_lines`` answers a piece of a batch (the ingress's ``batch_requests``).

The request carries the API key it runs as in its ASGI scope (``AS_KEY``), where only code
in this process can put it: the middleware takes it in place of an ``Authorization``
header. It asks for JSON and runs at priority low (``x-blitz-priority: low``, a level every
key may ask for), behind the interactive requests in the pools' queues.

``run_lines`` sends ``batches.line_concurrency`` lines at once: enough to fill the pools'
batches, few enough that a batch never fills the queues interactive requests wait in. A
line answered 429 or 503 (a full queue, a pool restarting) is sent again,
``batches.line_retries`` times, after waits that double from ``RETRY_FIRST_S`` to
``RETRY_MAX_S``: a batch has hours, an interactive request does not. Any other answer, an
error too, is the line's.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.types import ASGIApp, Message

from blitz.settings.batches import BatchSettings

RETRIED = frozenset({429, 503})
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 15.0
AS_KEY = "blitz.as_key"  # scope key: the index of the API key the request runs as (-1: none)
REQUEST_ID_HEADER = b"x-request-id"


async def call(app: ASGIApp, path: str, body: bytes, key: int,
               priority: bytes = b"low") -> tuple[int, str, bytes]:
    """POST ``body`` (JSON) to ``path`` on ``app`` as the key ``key``: (status, the
    request's id, the reply's body)."""
    scope: dict[str, Any] = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
        "query_string": b"", "client": None, "server": None,
        "headers": [(b"content-type", b"application/json"), (b"accept", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"x-blitz-priority", priority)],
        AS_KEY: key}
    sent = False
    finished = asyncio.Event()
    status = 0
    request_id = ""
    chunks: list[bytes] = []

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await finished.wait()  # nothing more comes: the "client" stays until the reply ends
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        nonlocal status, request_id
        if message["type"] == "http.response.start":
            status = message["status"]
            for name, value in message.get("headers", ()):
                if name == REQUEST_ID_HEADER:
                    request_id = value.decode("latin-1")
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                finished.set()

    try:
        await app(scope, receive, send)
    finally:
        finished.set()
    return status, request_id, b"".join(chunks)


async def run_lines(app: ASGIApp, endpoint: str, bodies: list[bytes], key: int | None,
                    settings: BatchSettings) -> list[tuple[int, str, bytes]]:
    """(status, request id, reply body) for each body POSTed to ``endpoint`` as the API key
    with index ``key`` (-1: keys off; None: the key that made the batch is configured no
    more, and every line is answered 401)."""
    if key is None:
        message = ("the API key that created this batch is no longer configured on the "
                   "server (auth.api_keys)")
        body = json.dumps({"error": {"message": message, "type": "authentication_error",
                                     "param": None, "code": "invalid_api_key"}}).encode()
        return [(401, "", body)] * len(bodies)
    gate = asyncio.Semaphore(settings.line_concurrency)

    async def one(body: bytes) -> tuple[int, str, bytes]:
        wait_s = RETRY_FIRST_S
        for attempt in range(settings.line_retries + 1):
            async with gate:
                answer = await call(app, endpoint, body, key)
            if answer[0] not in RETRIED or attempt == settings.line_retries:
                return answer
            await asyncio.sleep(wait_s)
            wait_s = min(wait_s * 2, RETRY_MAX_S)
        raise AssertionError("unreachable")

    return list(await asyncio.gather(*(one(b) for b in bodies)))
