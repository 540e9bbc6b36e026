"""``POST /embed_hybrid``: a hybrid (bge-m3) model's dense, sparse and ColBERT outputs, any
subset of them (``outputs``, default all three), per text in one reply, all from one
forward pass on the pool.

The reply is a map with the outputs asked for: ``dense`` (per text a vector), ``sparse``
(per text TEI's ``/embed_sparse`` entries on JSON, ``{indices, values}`` on msgpack) and
``colbert`` (per text its token vectors, as ``/embed_all`` gives them), with ``model``,
``dimension`` (the sparse vectors' vocabulary size, when known) and ``usage``. On msgpack
the arrays travel natively (numpy layout) or as ``{data, shape, dtype}`` (portable).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import Field, field_validator
from starlette.requests import Request
from starlette.responses import Response

from blitz import codecs
from blitz.codecs import ArrayLayout
from blitz.hop_messages import HybridResult, SparseResult, SparseVector
from blitz.http import responses
from blitz.http.bodies import EmbedSparseRequest
from blitz.http.middleware import record_of
from blitz.http.reply_bodies import embed_sparse_reply, usage_body
from blitz.http.responses import JSONBytesResponse, MsgpackResponse

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


def numbers(result: HybridResult) -> int:
    """The numbers in the reply (whether to build it off the event loop)."""
    rows: list[np.ndarray | SparseVector] = [*(result.dense or []), *(result.sparse or []),
                                             *(result.colbert or [])]
    return sum(row.size if isinstance(row, np.ndarray) else 2 * row.values.size
               for row in rows)


def _as_sparse(result: HybridResult) -> SparseResult:
    return SparseResult(result.sparse or [], result.dimension, result.model, result.usage,
                        result.pool)


class HybridRoute:
    """``POST /embed_hybrid`` over the ``HttpApi`` that serves it (typed ``Any``: it
    imports this module)."""

    def __init__(self, api: Any):
        self.api = api

    async def embed_hybrid(self, request: Request, payload: Any) -> Response:
        api = self.api
        fmt, accept_layout = api._reply(request)
        req = EmbedHybridRequest.parse(payload, api.settings.limits)
        result = await api.outputs.embed_hybrid(
            req.texts, model=api.model_id(request, req.model), outputs=tuple(req.outputs),
            truncate=req.truncate, prompt_name=req.prompt_name, record=record_of(request.scope))
        layout: ArrayLayout | None = ((req.layout or accept_layout or "numpy")
                                      if fmt == "msgpack" else None)
        return await responses.built(
            lambda: (MsgpackResponse if layout else JSONBytesResponse)(
                embed_hybrid_reply(result, layout)), numbers(result))
