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

from blitz import codecs
from blitz.codecs import ArrayLayout
from blitz.hop_messages import HybridResult, SparseResult, SparseVector
from blitz.http.bodies import EmbedSparseRequest
from blitz.http.reply_bodies import embed_sparse_reply, usage_body

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
