"""Blitz's own routes: ``POST /embed`` (Blitz's ``texts``, or TEI's ``inputs``, which it
shares), ``POST /embed_hybrid``, ``GET /info``, the probes (``/health``, ``/ready``) and
this API's description (``/openapi.json``, ``/docs``).

``/embed_hybrid`` answers a hybrid (bge-m3) model's dense, sparse and ColBERT outputs, any
subset of them (``outputs``, default all three), per text in one reply, all from one
forward pass on the pool. The reply is a map with the outputs asked for: ``dense`` (per
text a vector), ``sparse`` (per text TEI's ``/embed_sparse`` entries on JSON, ``{indices,
values}`` on msgpack) and ``colbert`` (per text its token vectors, as ``/embed_all`` gives
them), with ``model``, ``dimension`` (the sparse vectors' vocabulary size, when known) and
``usage``. On msgpack the arrays travel natively (numpy layout) or as ``{data, shape,
dtype}`` (portable).
"""

from __future__ import annotations

import time
from typing import Any, Literal

import numpy as np
from pydantic import Field, field_validator
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from blitz import codecs
from blitz.codecs import ArrayLayout
from blitz.errors import InvalidValue
from blitz.hop_messages import HybridResult, SparseResult, SparseVector
from blitz.http import responses
from blitz.http.bodies import EmbedRequest, EmbedSparseRequest
from blitz.http.middleware import API_KEYS
from blitz.http.reply_bodies import embed_sparse_reply, usage_body
from blitz.http.responses import JSONBytesResponse, MsgpackResponse
from blitz.http.routes.kit import (
    Kit,
    Payload,
    model_id,
    record,
    reply_format,
    speaking,
    vectors,
)
from blitz.ingress import status


async def embed(kit: Kit, request: Request, payload: Payload) -> Response:
    """Blitz's ``texts`` get Blitz's reply; TEI's ``inputs`` on JSON get TEI's
    ``[[float]]`` (and TEI's errors)."""
    fmt, accept_layout = reply_format(request)  # before work
    tei = fmt == "json" and isinstance(payload, dict) and "texts" not in payload
    if tei:
        speaking(request, "tei")
    req = EmbedRequest.parse(payload, kit.settings.limits)
    if req.return_chunks and (tei or fmt == "raw"):
        raise InvalidValue("return_chunks needs Blitz's reply: send `texts` (not TEI's "
                           "`inputs`) or msgpack, not raw", param="return_chunks")
    texts, token_ids = req.texts_or_token_ids()
    result = await kit.service.embed_with(texts, model_id(request, req.model), req.options(),
                                          token_ids=token_ids, record=record(request))
    return vectors(result, fmt, req.layout or accept_layout, tei)


# ---- /embed_hybrid ---------------------------------------------------------------------

HybridOutput = Literal["dense", "sparse", "colbert"]


class EmbedHybridRequest(EmbedSparseRequest):
    """``POST /embed_hybrid``: ``/embed_sparse``'s fields and ``outputs``."""

    outputs: list[HybridOutput] = Field(
        ["dense", "sparse", "colbert"],
        description="which of dense, sparse and colbert to return (default: all three)")

    @field_validator("outputs")
    @classmethod
    def _some_outputs(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("outputs must name at least one of dense, sparse, colbert")
        return list(dict.fromkeys(value))


def _array(array: np.ndarray, layout: ArrayLayout | None) -> Any:
    if layout == "portable":
        return dict(zip(("data", "shape", "dtype"), codecs.portable_array(array), strict=True))
    return array


def embed_hybrid_reply(result: HybridResult, layout: ArrayLayout | None) -> dict[str, Any]:
    """``layout`` None: JSON (lists); else the msgpack map in that layout."""
    body: dict[str, Any] = {"model": result.model}
    if result.dense is not None:
        body["dense"] = [_array(row, layout) for row in result.dense]
    if result.sparse is not None:
        body["dimension"] = result.dimension
        body["sparse"] = embed_sparse_reply(_as_sparse(result), layout)
        if layout is not None:
            body["sparse"] = body["sparse"]["embeddings"]
    if result.colbert is not None:
        body["colbert"] = [_array(rows, layout) for rows in result.colbert]
    body["usage"] = usage_body(result.usage)
    return body


def hybrid_numbers(result: HybridResult) -> int:
    """The numbers in the reply (whether to build it off the event loop)."""
    rows: list[np.ndarray | SparseVector] = [*(result.dense or []), *(result.sparse or []),
                                             *(result.colbert or [])]
    return sum(row.size if isinstance(row, np.ndarray) else 2 * row.values.size
               for row in rows)


def _as_sparse(result: HybridResult) -> SparseResult:
    return SparseResult(result.sparse or [], result.dimension, result.model, result.usage,
                        result.pool)


async def embed_hybrid(kit: Kit, request: Request, payload: Payload) -> Response:
    fmt, accept_layout = reply_format(request)
    req = EmbedHybridRequest.parse(payload, kit.settings.limits)
    result = await kit.outputs.embed_hybrid(
        req.texts, model=model_id(request, req.model), outputs=tuple(req.outputs),
        truncate=req.truncate, prompt_name=req.prompt_name, record=record(request))
    layout: ArrayLayout | None = ((req.layout or accept_layout or "numpy")
                                  if fmt == "msgpack" else None)
    return await responses.built(
        lambda: (MsgpackResponse if layout else JSONBytesResponse)(
            embed_hybrid_reply(result, layout)), hybrid_numbers(result))


# ---- facts, probes, the description -----------------------------------------------------

async def info(kit: Kit, request: Request) -> Response:
    return JSONBytesResponse(status.info(kit.service,
                                         model_id(request, request.query_params.get("model"))))


async def health(kit: Kit, request: Request) -> Response:
    return JSONBytesResponse({"status": "ok", "unix": time.time()})  # unix: Infinity's


async def ready(kit: Kit, request: Request) -> Response:
    if request.scope[API_KEYS].on and record(request).api_key < 0:  # no key: the status alone
        return JSONBytesResponse(*status.bare_ready(kit.service, record(request)))
    return JSONBytesResponse(status.check_ready(kit.service))


async def openapi(kit: Kit, request: Request) -> Response:
    """This API's OpenAPI 3.1 document (``blitz.http.openapi``)."""
    return JSONBytesResponse(kit.openapi)


async def docs(kit: Kit, request: Request) -> Response:
    """This API's document as a self-contained HTML page."""
    return HTMLResponse(kit.docs)
