"""The HTTP API: Starlette routes over ``EmbeddingService``, behind one middleware.

Routes decode bodies, call the service and encode replies (content negotiation); request
ids, API keys, error replies, timing headers and metrics are ``RequestMiddleware``'s.
``HttpApi`` is a plain ASGI app: the Serve ingress serves it, tests call it through
``httpx.ASGITransport``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, Router
from starlette.types import Receive, Scope, Send

from blitz import codecs
from blitz.errors import Overloaded, PayloadTooLarge, RequestTimeout
from blitz.http import wire
from blitz.http.bodies import (
    ClassifyRequest,
    DecodeRequest,
    EmbedAllRequest,
    EmbedRequest,
    EmbedSparseRequest,
    OpenAIEmbeddingRequest,
    PredictRequest,
    RerankRequest,
    SimilarityRequest,
    TokenizeRequest,
)
from blitz.http.middleware import RECORD, RequestMiddleware
from blitz.http.responses import JSONBytesResponse, MsgpackResponse, RawArrayResponse
from blitz.ingress import status
from blitz.ingress.outputs import OutputService
from blitz.ingress.service import EmbeddingService, RequestRecord
from blitz.ingress.tokenizing import TokenService

MODEL_HEADERS = ("serve_multiplexed_model_id", "serve-multiplexed-model-id")


class HttpApi:
    def __init__(self, service: EmbeddingService, tokens: TokenService | None = None,
                 outputs: OutputService | None = None):
        self.service = service
        self.tokens = tokens or TokenService(service)
        self.outputs = outputs or OutputService(service)
        self.settings = service.settings
        # a request body holds about one list or object per text (token-id rows, Cohere
        # documents, numpy arrays): more than this is refused before it is built
        limits = self.settings.limits
        self._max_containers = 2 * limits.max_texts_per_request + 64
        # and about one value per token id (codecs.loads_json: a decode stays a small
        # multiple of the body)
        self._max_values = limits.max_token_ids_per_request + 2 * self._max_containers + 64
        self._buffered = 0  # bytes of request bodies being read now (max_buffered_bytes)
        self.routes = [  # the hot routes first: the router tries them in order
            Route("/embed", self.embed, methods=["POST"]),
            Route("/v1/embeddings", self.openai_embeddings, methods=["POST"]),
            Route("/rerank", self.rerank, methods=["POST"]),
            Route("/v1/rerank", self.rerank, methods=["POST"]),
            Route("/embed_all", self.embed_all, methods=["POST"]),
            Route("/embed_sparse", self.embed_sparse, methods=["POST"]),
            Route("/similarity", self.similarity, methods=["POST"]),
            Route("/predict", self.predict, methods=["POST"]),
            Route("/classify", self.classify, methods=["POST"]),
            Route("/tokenize", self.tokenize, methods=["POST"]),
            Route("/decode", self.decode, methods=["POST"]),
            Route("/models", self.models, methods=["GET"]),
            Route("/info", self.info, methods=["GET"]),
            Route("/v1/models", self.openai_models, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/ready", self.ready, methods=["GET"]),
        ]
        auth = self.settings.auth
        # sources name buckets and paths: shown to callers with a key, or when asked for
        self._show_sources = auth.show_model_sources or bool(auth.resolved_keys())
        self._app = RequestMiddleware(Router(self.routes), [r.path for r in self.routes],
                                      self.settings.auth, service.observe,
                                      self.settings.ingress.server_timing)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)

    # ---- body --------------------------------------------------------------------------

    async def _body(self, request: Request) -> Any:
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
        held = 0  # bytes of this body counted in self._buffered
        try:
            try:
                async with asyncio.timeout(limits.body_timeout_s):  # the client cannot lift it
                    async for chunk in request.stream():
                        held += len(chunk)
                        self._buffered += len(chunk)
                        if held > limit:
                            raise PayloadTooLarge(f"body is over {limit} bytes; the limit "
                                                  f"max_body_bytes is {limit}")
                        if self._buffered > limits.max_buffered_bytes:
                            raise Overloaded("this server is reading too many large bodies "
                                             "at once; retry shortly")
                        chunks.append(chunk)
            except TimeoutError as exc:
                raise RequestTimeout(f"the body did not arrive within "
                                     f"{limits.body_timeout_s:g} s (limits.body_timeout_s); "
                                     "send it whole, faster", param="body") from exc
            return codecs.decode_body(b"".join(chunks), request.headers.get("content-type"),
                                      limit, self._max_containers, self._max_values)
        finally:
            self._buffered -= held

    @staticmethod
    def _model_id(request: Request, body_model: str | None) -> str | None:
        """The model the request names: a header wins over the body; None is the default."""
        for name in MODEL_HEADERS:
            value = request.headers.get(name)
            if value:
                return value
        return body_model

    # ---- routes ------------------------------------------------------------------------

    async def embed(self, request: Request) -> Response:
        req = EmbedRequest.parse(await self._body(request), self.settings.limits)
        fmt, accept_layout = codecs.choose_reply(request.headers.get("accept"))  # before work
        result = await self.service.embed(
            req.texts, model=self._model_id(request, req.model), normalize=req.normalize,
            truncate=req.truncate, dimensions=req.dimensions, dtype=req.dtype,
            prompt_name=req.prompt_name, record=_record(request))
        if fmt == "raw":
            return RawArrayResponse(result.embeddings)
        if fmt == "json":
            return JSONBytesResponse(wire.embed_reply(result))
        return MsgpackResponse(wire.embed_reply(result, req.layout or accept_layout or "numpy"))

    async def openai_embeddings(self, request: Request) -> Response:
        req = OpenAIEmbeddingRequest.parse(await self._body(request), self.settings.limits)
        texts, token_ids = req.texts_or_token_ids()
        result = await self.service.embed(
            texts, token_ids=token_ids, model=self._model_id(request, req.model),
            dimensions=req.dimensions, record=_record(request))
        return JSONBytesResponse(wire.openai_embeddings_reply(result, req.encoding_format))

    async def rerank(self, request: Request) -> Response:
        req = RerankRequest.parse(await self._body(request), self.settings.limits)
        fmt = codecs.choose_reply(request.headers.get("accept"), "json")[0]  # before work
        result = await self.service.rerank(
            req.query, req.documents, model=self._model_id(request, req.model),
            top_n=req.top_n, return_documents=req.return_documents, truncate=req.truncate,
            record=_record(request))
        return _plain(wire.rerank_reply(result), fmt)

    async def embed_all(self, request: Request) -> Response:
        return await self._arrays(request, EmbedAllRequest, self.outputs.embed_all,
                                  wire.embed_all_reply)

    async def embed_sparse(self, request: Request) -> Response:
        return await self._arrays(request, EmbedSparseRequest, self.outputs.embed_sparse,
                                  wire.embed_sparse_reply)

    async def _arrays(self, request: Request, body: type[EmbedAllRequest], run: Any,
                      reply: Any) -> Response:
        """A route of texts in, arrays out: JSON (TEI's lists) unless msgpack is asked for,
        then in the body's or Accept's array layout."""
        req = body.parse(await self._body(request), self.settings.limits)
        fmt, accept_layout = codecs.choose_reply(request.headers.get("accept"), "json")
        result = await run(req.texts, model=self._model_id(request, req.model),
                           truncate=req.truncate, prompt_name=req.prompt_name,
                           record=_record(request))
        if fmt == "msgpack":
            return MsgpackResponse(reply(result, req.layout or accept_layout or "numpy"))
        return JSONBytesResponse(reply(result, None))

    async def similarity(self, request: Request) -> Response:
        req = SimilarityRequest.parse(await self._body(request), self.settings.limits)
        fmt = codecs.choose_reply(request.headers.get("accept"), "json")[0]  # before work
        options = req.parameters
        result = await self.outputs.similarity(
            req.inputs.source_sentence, req.inputs.sentences,
            model=self._model_id(request, req.model),
            truncate=True if options is None or options.truncate is None else options.truncate,
            prompt_name=options.prompt_name if options else None, record=_record(request))
        return _plain(wire.similarity_reply(result), fmt)

    async def predict(self, request: Request) -> Response:
        req = PredictRequest.parse(await self._body(request), self.settings.limits)
        fmt = codecs.choose_reply(request.headers.get("accept"), "json")[0]  # before work
        items, single = req.batch()
        result = await self.outputs.classify(
            items, model=self._model_id(request, req.model), raw_scores=req.raw_scores,
            top_k=req.top_k, truncate=req.truncate, record=_record(request))
        return _plain(wire.predict_reply(result, single), fmt)

    async def classify(self, request: Request) -> Response:
        req = ClassifyRequest.parse(await self._body(request), self.settings.limits)
        fmt = codecs.choose_reply(request.headers.get("accept"), "json")[0]  # before work
        texts = [req.input] if isinstance(req.input, str) else req.input
        result = await self.outputs.classify(
            texts, model=self._model_id(request, req.model), raw_scores=req.raw_scores,
            top_k=req.top_k, truncate=req.truncate, record=_record(request))
        return _plain(wire.classify_reply(result, f"blitz-{uuid.uuid4().hex}",
                                          int(time.time())), fmt)

    async def tokenize(self, request: Request) -> Response:
        req = TokenizeRequest.parse(await self._body(request), self.settings.limits)
        fmt = codecs.choose_reply(request.headers.get("accept"), "json")[0]  # before work
        result = await self.tokens.tokenize(
            req.texts, model=self._model_id(request, req.model),
            add_special_tokens=req.add_special_tokens, prompt_name=req.prompt_name,
            return_offsets=req.return_offsets, offsets=req.offsets, record=_record(request))
        return _plain(wire.tokenize_reply(result), fmt)

    async def decode(self, request: Request) -> Response:
        req = DecodeRequest.parse(await self._body(request), self.settings.limits)
        fmt = codecs.choose_reply(request.headers.get("accept"), "json")[0]  # before work
        result = await self.tokens.decode(
            req.ids, model=self._model_id(request, req.model),
            skip_special_tokens=req.skip_special_tokens, record=_record(request))
        return _plain(wire.decode_reply(result), fmt)

    async def info(self, request: Request) -> Response:
        return JSONBytesResponse(status.info(self.service,
            self._model_id(request, request.query_params.get("model"))))

    async def models(self, request: Request) -> Response:
        return JSONBytesResponse({"object": "list", "data": status.describe_models(
            self.service, sources=self._show_sources)})

    async def openai_models(self, request: Request) -> Response:
        created = self.service.started
        return JSONBytesResponse({"object": "list", "data": [
            {"id": m["id"], "object": "model", "created": created, "owned_by": "blitz",
             "kind": m["kind"], "dimension": m["dimension"],
             "max_seq_length": m["max_seq_length"]}
            for m in status.describe_models(self.service)]})

    async def health(self, request: Request) -> Response:
        return JSONBytesResponse({"status": "ok"})

    async def ready(self, request: Request) -> Response:
        return JSONBytesResponse(status.check_ready(self.service))


def _record(request: Request) -> RequestRecord:
    """The request's record, made by the middleware; the service fills it in."""
    return request.scope[RECORD]


def _plain(body: Any, fmt: str) -> Response:
    """A reply with no arrays (the same in either msgpack layout): msgpack when asked for,
    else JSON."""
    return MsgpackResponse(body) if fmt == "msgpack" else JSONBytesResponse(body)
