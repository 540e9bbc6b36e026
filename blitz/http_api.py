"""HTTP routes over ``EmbeddingService``: decoding, auth, content negotiation, error replies.

Plain Starlette requests in, Starlette responses out, so the same object serves inside a
Serve ingress replica and in tests over ``httpx.ASGITransport``.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from blitz import codecs
from blitz.errors import (
    BlitzError,
    NotFound,
    PayloadTooLarge,
    Unauthorized,
    as_blitz_error,
)
from blitz.responses import JSONBytesResponse, MsgpackResponse, RawArrayResponse
from blitz.schemas import EmbedRequest, OpenAIEmbeddingRequest, RerankRequest
from blitz.service import EmbeddingService

logger = logging.getLogger("blitz.http")
MODEL_HEADERS = ("serve_multiplexed_model_id", "serve-multiplexed-model-id")
PUBLIC_ROUTES = frozenset({"/health", "/ready"})
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")

Observer = Callable[[str, str, str, int, int], None]  # route, model, pool, status, texts
Handler = Callable[[Request, "RequestContext"], Awaitable[Response]]


class RequestContext:
    """Facts gathered while answering one request: for headers, logs and metrics."""

    __slots__ = ("request_id", "model", "pool", "texts")

    def __init__(self, request_id: str):
        self.request_id = request_id
        self.model = ""
        self.pool = ""
        self.texts = 0


class HttpApi:
    def __init__(self, service: EmbeddingService, observe: Observer | None = None):
        self.service = service
        self.settings = service.settings
        self.observe = observe
        keys = self.settings.auth.resolved_keys()
        if self.settings.auth.required and not keys:
            raise ValueError(
                "auth.required is true but no API key resolves: set auth.api_keys or "
                f"${self.settings.auth.api_keys_env} in the replica's environment "
                "(runtime_env.env_vars for `serve deploy`)")
        logger.info("API keys %s", f"on ({len(keys)} key(s))" if keys else
                    "off: every route is public (set auth.api_keys, or auth.required: true "
                    "to refuse to start without keys)")
        self._key_digests = [_digest(k.encode()) for k in keys]
        # a request body holds about one list or object per text (token-id rows, Cohere
        # documents, numpy arrays): more than this is refused before it is built
        limits = self.settings.limits
        self._max_containers = 2 * limits.max_texts_per_request + 64
        self.routes: dict[tuple[str, str], Handler] = {
            ("POST", "/embed"): self.embed,
            ("POST", "/rerank"): self.rerank,
            ("POST", "/v1/embeddings"): self.openai_embeddings,
            ("POST", "/v1/rerank"): self.rerank,
            ("GET", "/models"): self.models,
            ("GET", "/v1/models"): self.openai_models,
            ("GET", "/health"): self.health,
            ("GET", "/ready"): self.ready,
        }
        self._paths = frozenset(path for _, path in self.routes)

    # ---- entry point -----------------------------------------------------------------

    async def __call__(self, request: Request) -> Response:
        started = time.perf_counter()
        given = request.headers.get("x-request-id", "")
        ctx = RequestContext(given if _REQUEST_ID.match(given) else uuid.uuid4().hex)
        path = _route_path(request)
        try:
            handler = self.routes.get((request.method, path))
            if handler is None:
                methods = [m for (m, p) in self.routes if p == path]
                raise NotFound(f"no route {request.method} {path}" + (
                    f"; it takes {', '.join(methods)}" if methods else ""))
            if self._key_digests and path not in PUBLIC_ROUTES:
                self._authorize(request)
            response = await handler(request, ctx)
        except Exception as exc:  # the one place errors become replies
            response = self._error_response(as_blitz_error(exc), ctx, exc)
        response.headers["x-request-id"] = ctx.request_id
        response.headers["x-compute-time"] = f"{time.perf_counter() - started:.6f}"
        if ctx.pool:
            response.headers["x-blitz-pool"] = ctx.pool
        if self.observe is not None:  # labels from bounded sets only: no series per stranger
            model = ctx.model if ctx.model in self.service.registry else (
                "other" if ctx.model else "")
            self.observe(path if path in self._paths else "other", model, ctx.pool,
                         response.status_code, ctx.texts)
        return response

    def _authorize(self, request: Request) -> None:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")
        given = _digest(token.strip().encode())
        matched = False
        for key in self._key_digests:  # digests, all compared: time reveals no key or length
            matched |= hmac.compare_digest(given, key)
        if not matched:
            raise Unauthorized("invalid API key")

    def _error_response(self, error: BlitzError, ctx: RequestContext,
                        exc: BaseException) -> Response:
        if not error.expose:
            logger.error("request %s failed", ctx.request_id, exc_info=exc)
        headers = ({"retry-after": str(error.retry_after_s)}
                   if error.retry_after_s is not None else None)
        return JSONBytesResponse(error.to_payload(ctx.request_id), status_code=error.status,
                                 headers=headers)

    # ---- body --------------------------------------------------------------------------

    async def _body(self, request: Request) -> Any:
        limit = self.settings.limits.max_body_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise PayloadTooLarge(f"body is {declared} bytes; the limit max_body_bytes is "
                                  f"{limit}")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"body is over {limit} bytes; the limit max_body_bytes "
                                      f"is {limit}")
            chunks.append(chunk)
        return codecs.decode_body(b"".join(chunks), request.headers.get("content-type"), limit,
                                  self._max_containers)

    @staticmethod
    def _model_id(request: Request, body_model: str | None) -> str | None:
        for name in MODEL_HEADERS:
            value = request.headers.get(name)
            if value:
                return value
        return body_model

    # ---- routes ------------------------------------------------------------------------

    async def embed(self, request: Request, ctx: RequestContext) -> Response:
        req = EmbedRequest.parse(await self._body(request), self.settings.limits)
        ctx.model = self._model_id(request, req.model) or self.settings.default_model
        ctx.texts = 1 if isinstance(req.texts, str) else len(req.texts)
        result = await self.service.embed(
            req.texts, model=ctx.model, normalize=req.normalize, truncate=req.truncate,
            dimensions=req.dimensions, dtype=req.dtype, prompt_name=req.prompt_name)
        ctx.pool = result.pool
        fmt = codecs.choose_reply_format(request.headers.get("accept"))
        if fmt == "raw":
            return RawArrayResponse(result.embeddings)
        if fmt == "json":
            return JSONBytesResponse(result.to_native())
        return MsgpackResponse(result.to_native())

    async def openai_embeddings(self, request: Request, ctx: RequestContext) -> Response:
        req = OpenAIEmbeddingRequest.parse(await self._body(request), self.settings.limits)
        ctx.model = self._model_id(request, req.model) or self.settings.default_model
        items = req.input
        token_ids: list[list[int]] | None = None
        texts: list[str] | None = None
        if isinstance(items, str):
            texts = [items]
        elif items and isinstance(items[0], int):
            token_ids = [items]  # type: ignore[list-item]
        elif items and isinstance(items[0], list):
            token_ids = items  # type: ignore[assignment]
        else:
            texts = items  # type: ignore[assignment]
        ctx.texts = len(texts if texts is not None else token_ids or [])
        result = await self.service.embed(texts, token_ids=token_ids, model=ctx.model,
                                          dimensions=req.dimensions)
        ctx.pool = result.pool
        rows = result.embeddings
        if req.encoding_format == "base64":
            data = [{"object": "embedding", "index": i, "embedding": codecs.to_base64(row)}
                    for i, row in enumerate(rows)]
        else:
            data = [{"object": "embedding", "index": i, "embedding": row}
                    for i, row in enumerate(rows)]
        return JSONBytesResponse({"object": "list", "data": data, "model": result.model,
                                  "usage": result.usage.to_dict()})

    async def rerank(self, request: Request, ctx: RequestContext) -> Response:
        req = RerankRequest.parse(await self._body(request), self.settings.limits)
        ctx.model = self._model_id(request, req.model) or self.settings.default_model
        ctx.texts = len(req.documents)
        result = await self.service.rerank(
            req.query, req.documents, model=ctx.model, top_n=req.top_n,
            return_documents=req.return_documents, truncate=req.truncate)
        ctx.pool = result.pool
        body = result.to_dict()
        if codecs.choose_reply_format(request.headers.get("accept"), "json") == "msgpack":
            return MsgpackResponse(body)
        return JSONBytesResponse(body)

    async def models(self, request: Request, ctx: RequestContext) -> Response:
        return JSONBytesResponse({"object": "list", "data": self.service.describe_models()})

    async def openai_models(self, request: Request, ctx: RequestContext) -> Response:
        created = self.service.started
        return JSONBytesResponse({"object": "list", "data": [
            {"id": m["id"], "object": "model", "created": created, "owned_by": "blitz",
             "kind": m["kind"], "dimension": m["dimension"],
             "max_seq_length": m["max_seq_length"]}
            for m in self.service.describe_models()]})

    async def health(self, request: Request, ctx: RequestContext) -> Response:
        return JSONBytesResponse({"status": "ok"})

    async def ready(self, request: Request, ctx: RequestContext) -> Response:
        await self.service.check_ready()
        return JSONBytesResponse({"status": "ready", "default_model":
                                  self.settings.default_model})


def _digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


def _route_path(request: Request) -> str:
    """The path below the app's route prefix (Serve puts the prefix in ``root_path``)."""
    path = request.scope.get("path", "/")
    root = request.scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root):]
    path = "/" + path.strip("/")
    return path
