"""What every route uses: the services (``Kit``), the body read within limits, the
route served as Starlette's endpoint (``Endpoint``), and per request the model id, the
reply's format, the request record and id.

A route is a plain function ``async def route(kit, request, payload) -> Response`` (a GET
route: ``route(kit, request)``); ``blitz.http.routes.table`` lists them.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from blitz import codecs
from blitz.batches.service import BatchService
from blitz.errors import ErrorShape, Overloaded, PayloadTooLarge, RequestTimeout
from blitz.http import reply_bodies
from blitz.http.middleware import record_of, request_id_of, speaks, take_priority
from blitz.http.responses import JSONBytesResponse, MsgpackResponse, RawArrayResponse
from blitz.ingress.service import RequestRecord
from blitz.ingress.services import Services

Payload = Any  # a decoded request body (blitz.codecs.decode_body)

MODEL_HEADERS = ("serve_multiplexed_model_id", "serve-multiplexed-model-id")


class Kit:
    """The services the routes call, and the reading of request bodies within limits
    (one per HTTP app: it counts the bytes being read on this replica)."""

    def __init__(self, services: Services):
        self.service, self.tokens = services.service, services.tokens
        self.outputs, self.images = services.outputs, services.images
        self.parts = services.parts
        self.late = services.late
        self.settings = self.service.settings
        self.batches: BatchService | None = None  # the batch API's, when on (set by HttpApi)
        # a request body holds about one list or object per text (token-id rows, Cohere
        # documents, numpy arrays): more than this is refused before it is built
        limits = self.settings.limits
        self.max_containers = 2 * limits.max_texts_per_request + 64
        # and about one value per token id (codecs.loads_json: a decode stays a small
        # multiple of the body)
        self.max_values = limits.max_token_ids_per_request + 2 * self.max_containers + 64
        self.buffered = 0  # bytes of request bodies being read now (max_buffered_bytes)
        auth = self.settings.auth
        # sources name buckets and paths: shown to callers with a key, or when asked for
        self.show_sources = auth.show_model_sources or bool(auth.resolved_keys())
        self.openapi: dict[str, Any] = {}  # this API's document and page (set by HttpApi)
        self.docs = ""

    async def body(self, request: Request) -> Any:
        """The decoded body. Bodies are read whole before decoding; all those being read
        on this replica together stay under ``limits.max_buffered_bytes`` (past it: 503),
        and every byte is given back when the request ends, however it ends."""
        limits = self.settings.limits
        limit = limits.max_body_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise PayloadTooLarge(f"body is {declared} bytes; the limit max_body_bytes is "
                                  f"{limit}")
        chunks: list[bytes] = []
        held = 0  # bytes of this body counted in self.buffered
        try:
            try:
                async with asyncio.timeout(limits.body_timeout_s):  # the client cannot lift it
                    async for chunk in request.stream():
                        held += len(chunk)
                        self.buffered += len(chunk)
                        if held > limit:
                            raise PayloadTooLarge(f"body is over {limit} bytes; the limit "
                                                  f"max_body_bytes is {limit}")
                        if self.buffered > limits.max_buffered_bytes:
                            raise Overloaded("this server is reading too many large bodies "
                                             "at once; retry shortly")
                        chunks.append(chunk)
            except TimeoutError as exc:
                raise RequestTimeout(f"the body did not arrive within "
                                     f"{limits.body_timeout_s:g} s (limits.body_timeout_s); "
                                     "send it whole, faster", param="body") from exc
            return codecs.decode_body(b"".join(chunks), request.headers.get("content-type"),
                                      limit, self.max_containers, self.max_values)
        finally:
            self.buffered -= held


class Endpoint:
    """One route as Starlette serves it: an ASGI app (Starlette's own adapter,
    ``request_response``, adds two layers a bare router never uses). A route with a body
    reads it within the kit's limits, then answers ``run(kit, request, payload)``, or, for a
    body that asks for another input (images, documents of parts: a variant's ``asks``),
    the first such variant of the route; a ``tei`` route
    (one of Hugging Face TEI's own paths) answers errors in TEI's shape unless the reply is
    msgpack (Blitz's own). A route without a body answers ``run(kit, request)``."""

    def __init__(self, kit: Kit, run: Any, *, body: bool = True, tei: bool = False,
                 variants: tuple[Any, ...] = ()):
        self.kit, self.run, self.body, self.tei = kit, run, body, tei
        self.variants = variants
        self.__name__, self.__doc__ = run.__name__, run.__doc__  # what OpenAPI documents

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive, send)
        if not self.body:
            response = await self.run(self.kit, request)
        else:
            if self.tei and reply_format(request)[0] != "msgpack":
                speaks(scope, "tei")
            payload = await self.kit.body(request)
            take_priority(scope, payload)
            run = next((v.run for v in self.variants if v.asks(payload)), self.run)
            response = await run(self.kit, request, payload)
        await response(scope, receive, send)


def model_id(request: Request, body_model: str | None) -> str | None:
    """The model the request names: a header wins over the body; None is the default."""
    for name in MODEL_HEADERS:
        value = request.headers.get(name)
        if value:
            return value
    return body_model


def reply_format(request: Request) -> tuple[codecs.ReplyFormat, codecs.ArrayLayout | None]:
    """The reply's format and msgpack layout: what Accept names, else the body's own
    format (a msgpack body gets msgpack, anything else JSON). Decided from the headers,
    before any work."""
    own: codecs.ReplyFormat = ("msgpack" if codecs.is_msgpack(
        request.headers.get("content-type")) else "json")
    return codecs.choose_reply(request.headers.get("accept"), own)


def record(request: Request) -> RequestRecord:
    """The request's record (the middleware's): its priority, key, timings."""
    return record_of(request.scope)


def request_id(request: Request) -> str:
    return request_id_of(request.scope)


def speaking(request: Request, shape: ErrorShape) -> None:
    """The request speaks ``shape``'s dialect: its errors are answered in that shape."""
    speaks(request.scope, shape)


def vectors(result: Any, fmt: str, layout: Any, tei: bool = False) -> Response:
    """An ``EmbedResult`` in the reply format ``fmt``: the raw array, JSON (TEI's bare
    ``[[float]]`` when ``tei``, else Blitz's body) or Blitz's msgpack body in ``layout``
    (numpy's when None)."""
    if fmt == "raw":
        return RawArrayResponse(result.embeddings)
    if fmt == "json":
        return JSONBytesResponse(reply_bodies.tei_embed_reply(result) if tei
                                 else reply_bodies.embed_reply(result, None))
    return MsgpackResponse(reply_bodies.embed_reply(result, layout or "numpy"))


def ranked(result: Any, fmt: str, request_id: str, tei: bool = False) -> Response:
    """A ``RerankResult`` on ``/rerank``: Blitz's msgpack body (Cohere's v1 shape), TEI's
    list when ``tei``, else Infinity's JSON body."""
    if fmt == "msgpack":
        return MsgpackResponse(reply_bodies.rerank_reply(result, request_id))
    if tei:
        return JSONBytesResponse(reply_bodies.tei_rerank_reply(result))
    return JSONBytesResponse(reply_bodies.infinity_rerank_reply(result, request_id,
                                                                int(time.time())))


def plain(body: Any, fmt: str) -> Response:
    """A reply with no arrays (the same in either msgpack layout): msgpack when asked for,
    else JSON."""
    return MsgpackResponse(body) if fmt == "msgpack" else JSONBytesResponse(body)
