"""Infinity's routes: ``POST /rerank`` (Infinity's ``documents``, or TEI's ``texts``,
which it shares), ``POST /classify`` and ``GET /models``. Infinity's ``/embeddings`` is
OpenAI's (``openai``), its ``/embeddings_image`` an image route (``images``)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from blitz.errors import InvalidValue
from blitz.http import reply_bodies
from blitz.http.bodies import ClassifyRequest, RerankRequest
from blitz.http.responses import JSONBytesResponse
from blitz.http.routes.kit import (
    Kit,
    Payload,
    model_id,
    plain,
    ranked,
    record,
    reply_format,
    request_id,
    speaking,
)
from blitz.ingress import status
from blitz.settings.kinds import kind_of


async def rerank(kit: Kit, request: Request, payload: Payload) -> Response:
    """``/rerank``: TEI's ``texts`` get TEI's list, Infinity's ``documents`` Infinity's
    reply; a msgpack reply is Blitz's (Cohere's v1 shape)."""
    fmt = reply_format(request)[0]  # before work
    tei = (fmt != "msgpack" and isinstance(payload, dict) and "texts" in payload
           and "documents" not in payload)
    if tei:
        speaking(request, "tei")
    req = await rerank_result(kit, request, payload, RerankRequest)
    return ranked(req, fmt, request_id(request), tei)


async def rerank_result(kit: Kit, request: Request, payload: Payload,
                        body: type[RerankRequest]) -> Any:
    """A rerank body (``body``, TEI's, Infinity's and Cohere's shapes) run: the result."""
    req = body.parse(payload, kit.settings.limits)
    model = model_id(request, req.model)
    if req.raw_scores and not kind_of(kit.service.spec(model).kind).raw_scores:
        raise InvalidValue("raw_scores is not served for cross-encoders or LLM rerankers: "
                           "scores are the model's activation (a sigmoid of its logit; an "
                           "LLM reranker's as its normalize setting says); leave it out",
                           param="raw_scores")
    return await kit.service.rerank(
        req.query, req.documents, model=model, top_n=req.top_n,
        return_documents=req.return_documents, truncate=req.truncate,
        record=record(request))


async def classify(kit: Kit, request: Request, payload: Payload) -> Response:
    fmt = reply_format(request)[0]  # before work
    req = ClassifyRequest.parse(payload, kit.settings.limits)
    texts = [req.input] if isinstance(req.input, str) else req.input
    result = await kit.outputs.classify(
        texts, model=model_id(request, req.model), raw_scores=req.raw_scores,
        top_k=req.top_k, truncate=req.truncate, record=record(request))
    return plain(reply_bodies.classify_reply(result, f"blitz-{uuid.uuid4().hex}",
                                             int(time.time())), fmt)


async def models(kit: Kit, request: Request) -> Response:
    """Blitz's registry in Infinity's ``GET /models`` list."""
    created = kit.service.started
    return JSONBytesResponse({"object": "list", "data": [
        reply_bodies.infinity_model(m, created)
        for m in status.describe_models(kit.service, sources=kit.show_sources)]})
