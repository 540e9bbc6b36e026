"""TEI's gRPC methods over the same services as the HTTP routes.

``TeiServicer.unary`` answers one call, ``TeiServicer.stream`` a stream of them; the
ingress deployment's methods (``deployments/grpc_methods.py``) call them with Serve's
gRPC context. Each message goes through the service exactly as an HTTP request does:
limits, routing, the pool queues, batching, errors and metrics (route label: the
method's full name, ``/tei.v1.Embed/Embed``; a stream counts one request per message,
but an ``EmbedStream`` one per group of messages answered together,
``blitz/grpc_api/grouping.py``).

Metadata in: ``authorization: Bearer <key>`` when API keys are on, ``model`` to choose a
model (the default otherwise; ``multiplexed_model_id`` too, as HTTP's header),
``x-blitz-priority`` (or ``priority``): high | normal | low, as HTTP's header (held to the
key's ceiling, ``auth.max_priority`` and ``auth.priority_grants``, unless
``auth.trust_priority_header``), and ``traceparent`` / ``tracestate`` while traces are on
(``blitz.runtime.tracing``: each message answered gets a span under it; a call whose key
is refused gets none).
Errors: Blitz's error table (``blitz.errors``) as gRPC status codes (``CODES``), the
message as the details, ``retry-after`` and ``x-blitz-error`` as trailing metadata.
Like TEI, proto3's defaults apply: ``truncate``, ``add_special_tokens`` and
``skip_special_tokens`` are false unless sent, and token offsets are in UTF-8 bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import grpc

from blitz.errors import BlitzError, Overloaded, as_blitz_error
from blitz.grpc_api import convert
from blitz.grpc_api.grouping import EmbedGroups
from blitz.grpc_api.rpc_table import BY_METHOD, end_span
from blitz.hop_messages import NORMAL, priority_level
from blitz.ingress.keys import ApiKeys
from blitz.ingress.other_outputs import OutputService
from blitz.ingress.service import EmbeddingService, RequestRecord, record_failure
from blitz.ingress.tokenizing import TokenService
from blitz.runtime import tracing

CODES = {  # an error's HTTP status -> its gRPC status code
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    413: grpc.StatusCode.INVALID_ARGUMENT,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    424: grpc.StatusCode.FAILED_PRECONDITION,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
    507: grpc.StatusCode.RESOURCE_EXHAUSTED,
}
logger = logging.getLogger("blitz.grpc")
MODEL_KEYS = ("model", "multiplexed_model_id")
PRIORITY_KEYS = ("x-blitz-priority", "priority")  # the first given wins: high | normal | low
STREAM_WINDOW = 256
"""Messages of one stream being answered at once (they batch together on the pools, like
concurrent requests), and at most ``limits.max_body_bytes`` of them (one HTTP body's
worth; a message over it alone is still taken, alone): past either, the stream is read no
further until the oldest is answered, so a client that sends without reading is held
back by gRPC's flow control."""


class Context(Protocol):
    """What is used of a gRPC servicer context (Serve's ``RayServegRPCContext``)."""

    def invocation_metadata(self) -> Any: ...

    def set_code(self, code: grpc.StatusCode) -> None: ...

    def set_details(self, details: str) -> None: ...

    def set_trailing_metadata(self, metadata: Any) -> None: ...


def status_code(error: BlitzError) -> grpc.StatusCode:
    if isinstance(error, Overloaded):  # TEI's: overloaded is RESOURCE_EXHAUSTED
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    return CODES.get(error.status, grpc.StatusCode.INTERNAL)


class TeiServicer:
    def __init__(self, service: EmbeddingService, tokens: TokenService,
                 outputs: OutputService):
        self.service = service
        self.tokens = tokens
        self.outputs = outputs
        self.keys = ApiKeys(service.settings.auth)
        self.held_bytes = 0  # bytes of the messages being answered (max_buffered_bytes)

    # ---- one call --------------------------------------------------------------------

    async def unary(self, method: str, request: Any, context: Context) -> Any:
        """Answer one call of ``method`` (``"Embed"``); an error sets the context's code
        and details and answers an empty message, as Serve expects."""
        rpc = BY_METHOD[method]
        try:
            model, key, priority, traced = self._admit(context)
        except Exception as exc:
            return self._fail(context, exc, rpc.response)
        reply, error = await self._within_bytes(method, request, lambda message: self._answer(
            method, message, model, key, priority, traced))
        if error is not None:
            return self._fail(context, error, rpc.response)
        return reply

    async def _within_bytes(self, method: str, request: Any,
                            answer: Callable[[Any], Awaitable[tuple[Any, Exception | None]]],
                            ) -> tuple[Any, Exception | None]:
        """``answer(request)`` with the message's bytes counted among those this replica
        holds being answered, every call and stream together: past
        ``limits.max_buffered_bytes`` (as HTTP's bodies) it is refused at once,
        RESOURCE_EXHAUSTED (observed as a 503)."""
        size = request.ByteSize() if hasattr(request, "ByteSize") else 0
        limit = self.service.settings.limits.max_buffered_bytes
        if self.held_bytes + size > limit:
            refused = Overloaded(
                f"this server holds {self.held_bytes} bytes of gRPC messages being answered; "
                f"this {size}-byte one would pass the limit max_buffered_bytes ({limit}): "
                "retry shortly")
            record_failure(RequestRecord(BY_METHOD[method].path), refused, self.service.observe)
            return None, refused
        self.held_bytes += size
        try:
            return await answer(request)
        finally:
            self.held_bytes -= size

    async def _answer(self, method: str, request: Any, model: str | None, key: int = -1,
                      priority: int = NORMAL, traced: dict[str, Any] | None = None
                      ) -> tuple[Any, Exception | None]:
        """One message's reply, or the error it got; observed once either way (unless the
        client left: as an HTTP request whose client left, it is not counted). ``key``:
        the caller's API key (``RequestRecord.api_key``); ``priority``: its level;
        ``traced``: the call's metadata while traces are on (the message gets a span,
        ``Rpc.span``)."""
        record = RequestRecord(BY_METHOD[method].path, api_key=key, priority=priority)
        if traced is not None:
            record.trace = BY_METHOD[method].span(traced)
        started = time.perf_counter()
        try:
            reply = await convert.ANSWER[method](self, request, model, record)
        except Exception as exc:
            end_span(record, record_failure(record, exc, self.service.observe))
            return None, exc
        except BaseException:  # cancelled (the client left): not counted, its span still ends
            end_span(record, None)
            raise
        convert.fill_metadata(reply, request, record, time.perf_counter() - started)
        self.service.observe(record, 200)
        end_span(record, None)
        return reply, None

    def _admit(self, context: Context) -> tuple[str | None, int, int, dict[str, Any] | None]:
        """Check the key; the model the metadata names (None: the default), the index of
        the caller's API key (-1 with keys off), the priority level the metadata names
        (``x-blitz-priority`` or ``priority``; normal when neither), held to the key's
        ceiling as HTTP's header (``ApiKeys.priority``), and, while traces are on, the
        metadata (its ``traceparent``, ``blitz.runtime.tracing``)."""
        metadata = {key.lower(): value for key, value in context.invocation_metadata() or ()}
        api_key = (self.keys.check(str(metadata.get("authorization", "")))
                   if self.keys.on else -1)
        named = next((k for k in PRIORITY_KEYS if metadata.get(k) is not None), None)
        asked = priority_level(str(metadata[named]).strip().lower(), named) if named else NORMAL
        priority = self.keys.priority(asked, api_key, from_header=named is not None)
        model = next((str(metadata[k]) for k in MODEL_KEYS if metadata.get(k)), None)
        return model, api_key, priority, metadata if tracing.TRACER is not None else None

    @staticmethod
    def _fail(context: Context, exc: BaseException, response: Any) -> Any:
        error = as_blitz_error(exc)
        if not error.expose:
            logger.error("gRPC call failed", exc_info=exc)
        context.set_code(status_code(error))
        context.set_details(error.public_message())
        trailing = [("x-blitz-error", error.code)]
        if error.retry_after_s is not None:
            trailing.append(("retry-after", str(error.retry_after_s)))
        context.set_trailing_metadata(trailing)
        return response()

    # ---- a stream of calls -----------------------------------------------------------

    async def stream(self, method: str, requests: AsyncIterator[Any],
                     context: Context) -> AsyncIterator[Any]:
        """Answer each message of ``requests`` in order, up to ``STREAM_WINDOW`` at once.
        The first error ends the stream with its status (TEI's behaviour); what was still
        being answered is cancelled, and so is everything when the client leaves."""
        rpc = BY_METHOD[method]
        try:
            model, key, priority, traced = self._admit(context)
        except Exception as exc:
            self._fail(context, exc, rpc.response)
            return
        def alone(request: Any) -> Awaitable[tuple[Any, Exception | None]]:
            return self._answer(method, request, model, key, priority, traced)

        grouped = (EmbedGroups(self.service, model, alone, STREAM_WINDOW, key, priority,
                               traced).answer
                   if method == "EmbedStream" else alone)

        def answer(request: Any) -> Awaitable[tuple[Any, Exception | None]]:
            return self._within_bytes(method, request, grouped)

        window: asyncio.Queue[tuple[asyncio.Task, int] | None] = asyncio.Queue(STREAM_WINDOW)
        budget = self.service.settings.limits.max_body_bytes
        held = 0  # bytes of the messages in the window
        room = asyncio.Event()

        async def read() -> None:
            nonlocal held
            try:
                async for request in requests:
                    size = request.ByteSize() if hasattr(request, "ByteSize") else 0
                    while held and held + size > budget:
                        room.clear()
                        await room.wait()
                    held += size
                    task = asyncio.ensure_future(answer(request))
                    try:  # a full window waits here: the task is ours until it is queued
                        await window.put((task, size))
                    except BaseException:
                        task.cancel()
                        raise
            finally:
                await window.put(None)

        reader = asyncio.ensure_future(read())
        try:
            while (entry := await window.get()) is not None:
                task, size = entry
                reply, error = await task
                held -= size
                room.set()
                if error is not None:
                    self._fail(context, error, rpc.response)
                    return
                yield reply
            await reader  # a broken request stream raises here
        finally:
            reader.cancel()
            while not window.empty():
                pending = window.get_nowait()
                if pending is not None:
                    pending[0].cancel()
            with contextlib.suppress(BaseException):
                await reader

