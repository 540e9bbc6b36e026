"""The HTTP API: Starlette routes over ``EmbeddingService``, behind one middleware.

Routes decode bodies, call the service and encode replies (content negotiation); request
ids, API keys, error replies, timing headers and metrics are ``RequestMiddleware``'s.
``HttpApi`` is a plain ASGI app: the Serve ingress serves it, tests call it through
``httpx.ASGITransport``.

One server speaks Blitz's API and its peers' (Hugging Face TEI, Infinity, Cohere, OpenAI)
on their own paths, so a peer's client needs only the base URL changed. Where two APIs
share a path, the request says which it speaks (docs/compatibility.md): the reply's
format is the one Accept names, else the body's own (JSON in, JSON out; msgpack in,
msgpack out), and its shape follows the body's field names (``/embed``: Blitz's
``texts`` or TEI's ``inputs``; ``/rerank``: TEI's ``texts`` or Infinity's
``documents``); a msgpack reply is always Blitz's own shape. A request in TEI's dialect
gets TEI's error body too (``ERROR_SHAPE``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route, Router
from starlette.types import Receive, Scope, Send

from blitz import codecs
from blitz.admin.table import ModelAdmin
from blitz.errors import ErrorShape, InvalidValue, Overloaded, PayloadTooLarge, RequestTimeout
from blitz.http import hybrid, openapi, reply_bodies, responses
from blitz.http.admin import AdminApi
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
from blitz.http.images import ImageRoutes, asks_images
from blitz.http.middleware import (
    RequestMiddleware,
    record_of,
    request_id_of,
    speaks,
    take_priority,
)
from blitz.http.peers import PeerRoutes
from blitz.http.responses import JSONBytesResponse, MsgpackResponse, RawArrayResponse
from blitz.ingress import status
from blitz.ingress.images import ImageService
from blitz.ingress.other_outputs import OutputService
from blitz.ingress.service import EmbeddingService, RequestRecord
from blitz.ingress.services import Services
from blitz.ingress.tokenizing import TokenService
from blitz.settings.kinds import kind_of

Payload = Any  # a decoded request body (blitz.codecs.decode_body)

MODEL_HEADERS = ("serve_multiplexed_model_id", "serve-multiplexed-model-id")


class HttpApi:
    def __init__(self, service: Services | EmbeddingService, tokens: TokenService | None = None,
                 outputs: OutputService | None = None, admin: ModelAdmin | None = None,
                 images: ImageService | None = None):
        services = Services.of(service, tokens, outputs, images)  # built in one place
        self.service, self.tokens, self.outputs = services.service, services.tokens, services.outputs
        self.service_images = services.images
        self._images = ImageRoutes(self)
        self.settings = self.service.settings
        # a request body holds about one list or object per text (token-id rows, Cohere
        # documents, numpy arrays): more than this is refused before it is built
        limits = self.settings.limits
        self._max_containers = 2 * limits.max_texts_per_request + 64
        # and about one value per token id (codecs.loads_json: a decode stays a small
        # multiple of the body)
        self._max_values = limits.max_token_ids_per_request + 2 * self._max_containers + 64
        self._buffered = 0  # bytes of request bodies being read now (max_buffered_bytes)
        peers = PeerRoutes(self)
        self.routes = [  # the hot routes first: the router tries them in order
            Route("/embed", self._read(self.embed), methods=["POST"]),
            Route("/v1/embeddings", self._read(self.openai_embeddings), methods=["POST"]),
            Route("/rerank", self._read(self.rerank), methods=["POST"]),
            Route("/v1/rerank", self._read(self.cohere_v1_rerank), methods=["POST"]),
            Route("/", self._read(peers.tei_root), methods=["POST"]),
            Route("/embeddings", self._read(self.openai_embeddings), methods=["POST"]),
            Route("/v1/embed", self._read(peers.cohere_embed_v1), methods=["POST"]),
            Route("/v2/embed", self._read(peers.cohere_embed_v2), methods=["POST"]),
            Route("/v2/rerank", self._read(peers.cohere_v2_rerank), methods=["POST"]),
            Route("/embed_all", self._read(self.embed_all, tei=True), methods=["POST"]),
            Route("/embed_sparse", self._read(self.embed_sparse, tei=True), methods=["POST"]),
            Route("/embed_hybrid", self._read(hybrid.HybridRoute(self).embed_hybrid),
                  methods=["POST"]),
            Route("/similarity", self._read(self.similarity, tei=True), methods=["POST"]),
            Route("/predict", self._read(self.predict, tei=True), methods=["POST"]),
            Route("/classify", self._read(self.classify), methods=["POST"]),
            Route("/tokenize", self._read(self.tokenize, tei=True), methods=["POST"]),
            Route("/decode", self._read(self.decode, tei=True), methods=["POST"]),
            Route("/invocations", self._read(peers.tei_root), methods=["POST"]),  # SageMaker's
            Route("/embeddings_image", self._read(self._images.openai_embeddings),  # Infinity's
                  methods=["POST"]),
            Route("/models", self.models, methods=["GET"]),
            Route("/info", self.info, methods=["GET"]),
            Route("/v1/models", self.openai_models, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/ready", self.ready, methods=["GET"]),
        ]
        auth = self.settings.auth
        # sources name buckets and paths: shown to callers with a key, or when asked for
        self._show_sources = auth.show_model_sources or bool(auth.resolved_keys())
        # TEI answers GET / and GET /ping as /health: public like it (not in self.routes,
        # whose POST / takes a key)
        # and its API's description (/openapi.json, /docs), public like TEI's /docs
        public = [Route("/", self.health, methods=["GET"]),
                  Route("/ping", self.health, methods=["GET"]),
                  Route("/openapi.json", self.openapi, methods=["GET"]),
                  Route("/docs", self.docs, methods=["GET"])]
        self._openapi = openapi.document([*self.routes, *public])
        public += AdminApi(admin, self.settings.admin).routes(self._read)  # keys of its own
        self._docs = openapi.docs_page(self._openapi)
        router = Router([*self.routes, *public])
        self._app = RequestMiddleware(router, [r.path for r in self.routes],
                                      self.settings.auth, self.service.observe,
                                      self.settings.ingress.server_timing)
        self.drain = self._app.drain  # the replica's stop (deployments/draining.py)

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
    def model_id(request: Request, body_model: str | None) -> str | None:
        """The model the request names: a header wins over the body; None is the default."""
        for name in MODEL_HEADERS:
            value = request.headers.get(name)
            if value:
                return value
        return body_model

    def _reply(self, request: Request) -> tuple[codecs.ReplyFormat, codecs.ArrayLayout | None]:
        """The reply's format and msgpack layout: what Accept names, else the body's own
        format (a msgpack body gets msgpack, anything else JSON). Decided from the headers,
        before any work."""
        own: codecs.ReplyFormat = ("msgpack" if codecs.is_msgpack(
            request.headers.get("content-type")) else "json")
        return codecs.choose_reply(request.headers.get("accept"), own)

    def _read(self, route: Any, tei: bool = False) -> Any:
        """An endpoint that reads the body, then calls ``route(request, payload)``. A
        ``tei`` route (one of Hugging Face TEI's own paths) answers errors in TEI's shape
        unless the reply is msgpack (Blitz's own)."""
        async def endpoint(request: Request) -> Response:
            if tei and self._reply(request)[0] != "msgpack":
                _speaks(request, "tei")
            payload = await self._body(request)
            take_priority(request.scope, payload)
            if asks_images(route.__name__, payload):  # the same route, with images
                return await self._images.serve(route.__name__, request, payload)
            return await route(request, payload)
        endpoint.__name__, endpoint.__doc__ = route.__name__, route.__doc__
        return endpoint

    # ---- routes ------------------------------------------------------------------------

    async def embed(self, request: Request, payload: Payload) -> Response:
        """Blitz's ``texts`` get Blitz's reply; TEI's ``inputs`` on JSON get TEI's
        ``[[float]]`` (and TEI's errors)."""
        fmt, accept_layout = self._reply(request)  # before work
        tei = fmt == "json" and isinstance(payload, dict) and "texts" not in payload
        if tei:
            _speaks(request, "tei")
        req = EmbedRequest.parse(payload, self.settings.limits)
        if req.return_chunks and (tei or fmt == "raw"):
            raise InvalidValue("return_chunks needs Blitz's reply: send `texts` (not TEI's "
                               "`inputs`) or msgpack, not raw", param="return_chunks")
        texts, token_ids = req.texts_or_token_ids()
        result = await self.service.embed(
            texts, token_ids=token_ids, model=self.model_id(request, req.model),
            normalize=req.normalize, truncate=req.truncate, dimensions=req.dimensions,
            dtype=req.dtype, prompt_name=req.prompt_name, instruction=req.instruction,
            truncation_side=req.side(), long_inputs=req.long_inputs,
            return_chunks=req.return_chunks, record=_record(request))
        if fmt == "raw":
            return RawArrayResponse(result.embeddings)
        if fmt == "json":
            return JSONBytesResponse(reply_bodies.tei_embed_reply(result) if tei
                                     else reply_bodies.embed_reply(result, None))
        return MsgpackResponse(reply_bodies.embed_reply(result, req.layout or accept_layout or "numpy"))

    async def openai_embeddings(self, request: Request, payload: Payload) -> Response:
        """OpenAI's ``/v1/embeddings``, and Infinity's and TEI's ``/embeddings``."""
        req = OpenAIEmbeddingRequest.parse(payload, self.settings.limits)
        texts, token_ids = req.texts_or_token_ids()
        result = await self.service.embed(
            texts, token_ids=token_ids, model=self.model_id(request, req.model),
            dimensions=req.dimensions, prompt_name=req.prompt_name,
            instruction=req.instruction, long_inputs=req.long_inputs, record=_record(request))
        return JSONBytesResponse(reply_bodies.openai_embeddings_reply(result, req.encoding_format))

    async def rerank(self, request: Request, payload: Payload) -> Response:
        """``/rerank``: TEI's ``texts`` get TEI's list, Infinity's ``documents`` Infinity's
        reply; a msgpack reply is Blitz's (Cohere's v1 shape)."""
        fmt = self._reply(request)[0]  # before work
        tei = (fmt != "msgpack" and isinstance(payload, dict) and "texts" in payload
               and "documents" not in payload)
        if tei:
            _speaks(request, "tei")
        req = await self.rerank_result(request, payload, RerankRequest)
        if fmt == "msgpack":
            return MsgpackResponse(reply_bodies.rerank_reply(req, _request_id(request)))
        if tei:
            return JSONBytesResponse(reply_bodies.tei_rerank_reply(req))
        return JSONBytesResponse(reply_bodies.infinity_rerank_reply(req, _request_id(request),
                                                            int(time.time())))

    async def cohere_v1_rerank(self, request: Request, payload: Payload) -> Response:
        fmt = self._reply(request)[0]
        result = await self.rerank_result(request, payload, RerankRequest)
        return _plain(reply_bodies.rerank_reply(result, _request_id(request)), fmt)

    async def rerank_result(self, request: Request, payload: Payload,
                      body: type[RerankRequest]) -> Any:
        req = body.parse(payload, self.settings.limits)
        model = self.model_id(request, req.model)
        if req.raw_scores and not kind_of(self.service.spec(model).kind).raw_scores:
            raise InvalidValue("raw_scores is not served for cross-encoders or LLM rerankers: "
                               "scores are the model's activation (a sigmoid of its logit; an "
                               "LLM reranker's as its normalize setting says); leave it out",
                               param="raw_scores")
        return await self.service.rerank(
            req.query, req.documents, model=model, top_n=req.top_n,
            return_documents=req.return_documents, truncate=req.truncate,
            record=_record(request))

    async def embed_all(self, request: Request, payload: Payload) -> Response:
        return await self._arrays(request, payload, EmbedAllRequest, self.outputs.embed_all,
                                  reply_bodies.embed_all_reply)

    async def embed_sparse(self, request: Request, payload: Payload) -> Response:
        return await self._arrays(request, payload, EmbedSparseRequest,
                                  self.outputs.embed_sparse, reply_bodies.embed_sparse_reply)

    async def _arrays(self, request: Request, payload: Payload, body: type[EmbedAllRequest],
                      run: Any, reply: Any) -> Response:
        """A route of texts in, arrays out: JSON (TEI's lists) unless msgpack is asked for,
        then in the body's or Accept's array layout."""
        fmt, accept_layout = self._reply(request)
        req = body.parse(payload, self.settings.limits)
        result = await run(req.texts, model=self.model_id(request, req.model),
                           truncate=req.truncate, prompt_name=req.prompt_name,
                           long_inputs=req.long_inputs, record=_record(request))
        layout = req.layout or accept_layout or "numpy"
        return await responses.built(  # a large reply is encoded off the event loop
            lambda: MsgpackResponse(reply(result, layout)) if fmt == "msgpack"
            else JSONBytesResponse(reply(result, None)), responses.numbers(result.embeddings))

    async def similarity(self, request: Request, payload: Payload) -> Response:
        fmt = self._reply(request)[0]  # before work
        req = SimilarityRequest.parse(payload, self.settings.limits)
        options = req.parameters
        result = await self.outputs.similarity(
            req.inputs.source_sentence, req.inputs.sentences,
            model=self.model_id(request, req.model),
            truncate=True if options is None or options.truncate is None else options.truncate,
            prompt_name=options.prompt_name if options else None, record=_record(request))
        return _plain(reply_bodies.similarity_reply(result), fmt)

    async def predict(self, request: Request, payload: Payload) -> Response:
        fmt = self._reply(request)[0]  # before work
        req = PredictRequest.parse(payload, self.settings.limits)
        items, single = req.batch()
        result = await self.outputs.classify(
            items, model=self.model_id(request, req.model), raw_scores=req.raw_scores,
            top_k=req.top_k, truncate=req.truncate, record=_record(request))
        return _plain(reply_bodies.predict_reply(result, single), fmt)

    async def classify(self, request: Request, payload: Payload) -> Response:
        fmt = self._reply(request)[0]  # before work
        req = ClassifyRequest.parse(payload, self.settings.limits)
        texts = [req.input] if isinstance(req.input, str) else req.input
        result = await self.outputs.classify(
            texts, model=self.model_id(request, req.model), raw_scores=req.raw_scores,
            top_k=req.top_k, truncate=req.truncate, record=_record(request))
        return _plain(reply_bodies.classify_reply(result, f"blitz-{uuid.uuid4().hex}",
                                          int(time.time())), fmt)

    async def tokenize(self, request: Request, payload: Payload) -> Response:
        fmt = self._reply(request)[0]  # before work
        req = TokenizeRequest.parse(payload, self.settings.limits)
        result = await self.tokens.tokenize(
            req.texts, model=self.model_id(request, req.model),
            add_special_tokens=req.add_special_tokens, prompt_name=req.prompt_name,
            return_offsets=req.return_offsets, offsets=req.offsets, record=_record(request))
        return await responses.built(  # a large reply is built off the event loop
            lambda: _plain(reply_bodies.tokenize_reply(result), fmt),
            5 * sum(map(len, result.tokens)))

    async def decode(self, request: Request, payload: Payload) -> Response:
        fmt = self._reply(request)[0]  # before work
        req = DecodeRequest.parse(payload, self.settings.limits)
        result = await self.tokens.decode(
            req.ids, model=self.model_id(request, req.model),
            skip_special_tokens=req.skip_special_tokens, record=_record(request))
        return _plain(reply_bodies.decode_reply(result), fmt)

    async def info(self, request: Request) -> Response:
        return JSONBytesResponse(status.info(self.service,
            self.model_id(request, request.query_params.get("model"))))

    async def models(self, request: Request) -> Response:
        """Blitz's registry in Infinity's ``GET /models`` list."""
        created = self.service.started
        return JSONBytesResponse({"object": "list", "data": [
            reply_bodies.infinity_model(m, created)
            for m in status.describe_models(self.service, sources=self._show_sources)]})

    async def openai_models(self, request: Request) -> Response:
        created = self.service.started
        return JSONBytesResponse({"object": "list", "data": [
            {"id": m["id"], "object": "model", "created": created, "owned_by": "blitz",
             "kind": m["kind"], "dimension": m["dimension"],
             "max_seq_length": m["max_seq_length"]}
            for m in status.describe_models(self.service)]})

    async def openapi(self, request: Request) -> Response:
        """This API's OpenAPI 3.1 document (``blitz.http.openapi``)."""
        return JSONBytesResponse(self._openapi)

    async def docs(self, request: Request) -> Response:
        """This API's document as a self-contained HTML page."""
        return HTMLResponse(self._docs)

    async def health(self, request: Request) -> Response:
        return JSONBytesResponse({"status": "ok", "unix": time.time()})  # unix: Infinity's

    async def ready(self, request: Request) -> Response:
        if self._app.keys.on and _record(request).api_key < 0:  # no key: the status alone
            return JSONBytesResponse(*status.bare_ready(self.service, _record(request)))
        return JSONBytesResponse(status.check_ready(self.service))


def _record(request: Request) -> RequestRecord:
    return record_of(request.scope)


def _speaks(request: Request, shape: ErrorShape) -> None:
    speaks(request.scope, shape)


def _request_id(request: Request) -> str:
    return request_id_of(request.scope)


def _plain(body: Any, fmt: str) -> Response:
    """A reply with no arrays (the same in either msgpack layout): msgpack when asked for,
    else JSON."""
    return MsgpackResponse(body) if fmt == "msgpack" else JSONBytesResponse(body)
