"""A request whose client left is cancelled, also where Serve does not watch for it.

HAProxy (scripts/haproxy_loopback.py) marks each request with a large or chunked body
``x-request-disconnect-disabled: ?1``. Serve then gives the app the HTTP server's own
``receive`` instead of draining the whole body into a queue of its own as soon as the
request arrives, before it waits for a slot (Ray 2.60 replica.py,
``ASGIDIReceiveProxy``): the body stays in the client's socket (the HTTP server stops
reading past 64 KiB) until Blitz reads it, counted against ``limits.max_buffered_bytes``.
Without that queue Serve no longer notices the client leaving; ``run_watching`` does,
once the body is read, and cancels the request as Serve would have.
"""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = b"x-request-disconnect-disabled"
UNWATCHED = (HEADER, b"?1")  # among a request's headers: Serve leaves its disconnects to us


def unwatched(scope: Scope) -> bool:
    """Whether Serve leaves this request's disconnects to the app."""
    return UNWATCHED in scope.get("headers", ())


async def run_watching(app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
    """``app(scope, receive, send)``, cancelled if the client leaves after its body was
    read and before the reply ends."""
    task = asyncio.current_task()
    body_read = asyncio.Event()
    replied = False

    async def tracked_receive() -> Message:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            body_read.set()
        return message

    async def tracked_send(message: Message) -> None:
        nonlocal replied
        await send(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            replied = True

    async def watch() -> None:
        await body_read.wait()
        message = await receive()  # the app reads nothing more: the next is the end
        if message["type"] == "http.disconnect" and not replied and task is not None:
            task.cancel()

    watcher = asyncio.create_task(watch())
    try:
        await app(scope, tracked_receive, tracked_send)
    finally:
        watcher.cancel()
