"""Routes over per-token vectors (``blitz.ingress.late_interaction``):

- ``POST /embed_multivector``: a late-interaction (ColBERT) model's vectors per text, as
  queries or documents, or a visual retriever's (ColPali, ColQwen2) per page (``images``); ``pool_factor`` pools a document's, ``muvera`` gives one
  fixed-size vector per text; ``dtype`` as ``/embed``'s (binary rows packed 8 per byte).
  JSON: lists; msgpack: one array per text (numpy or portable layout).
- Late chunking, Jina's contract: ``late_chunking: true`` on ``/v1/embeddings`` (and
  ``/embeddings``) or ``/embed`` makes the request's texts the chunks of one document, each
  embedded with the whole document in view; the reply is the route's own, one vector per
  chunk.
- ``POST /v1/contextualizedembeddings``, Voyage's: ``inputs`` a list of documents, each a
  list of chunks; per document a list of chunk vectors (``output_dtype``,
  ``output_dimension``, base64 as the voyageai client asks for it).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import AliasChoices, Field, StrictBool, StrictFloat, StrictInt
from starlette.requests import Request
from starlette.responses import Response

from blitz import codecs
from blitz.codecs import ArrayLayout
from blitz.encoders.postprocess import OutputDtype
from blitz.errors import InvalidValue
from blitz.hop_messages import ChunkedEmbedResult, EmbedResult, MultiVectorResult
from blitz.http import reply_bodies, responses
from blitz.http.bodies import _Request
from blitz.http.reply_bodies import usage_body
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

_POOLING = "mean | max | first | last: how a chunk's token vectors pool (default the model's)"


class EmbedMultiVectorRequest(_Request):
    """``POST /embed_multivector``."""

    _list_keys = ("texts", "input", "images")

    texts: str | list[str] | None = Field(
        None, validation_alias=AliasChoices("texts", "input"),
        description="a text or texts (`input` too)")
    images: list[Any] | None = Field(
        None, description="pages for a visual retriever (vl-multi-vector: ColPali, "
        "ColQwen2): each an image file's bytes (msgpack), base64, a data URL or an allowed "
        "URL; in place of texts")
    model: str | None = None
    input_type: Literal["query", "document"] = Field(
        "document", description="query: the model's query marker and expansion; document: "
        "its document marker, skiplisted tokens dropped")
    pool_factor: StrictFloat | StrictInt | None = Field(
        None, description="hierarchical token pooling of a document's vectors: about "
        "1/pool_factor kept (1 to 64; documents only)")
    muvera: StrictBool | dict[str, Any] | None = Field(
        None, description="true, or {k_sim, dim_proj, r_reps, fill_empty_partitions, "
        "final_dim, seed}: one MUVERA fixed-dimensional vector per text instead of many")
    dtype: OutputDtype = "float32"
    truncate: StrictBool = True
    layout: ArrayLayout | None = None


def multi_vector_reply(result: MultiVectorResult, layout: ArrayLayout | None) -> dict[str, Any]:
    """``layout`` None: JSON (lists); else the msgpack map in that layout."""
    rows: list[Any]
    if layout == "portable":
        rows = [dict(zip(("data", "shape", "dtype"), codecs.portable_array(r), strict=True))
                for r in result.embeddings]
    else:
        rows = list(result.embeddings)
    return {"model": result.model, "dimension": result.dimension, "muvera": result.muvera,
            "embeddings": rows, "usage": usage_body(result.usage)}


async def embed_multivector(kit: Kit, request: Request, payload: Payload) -> Response:
    fmt, accept_layout = reply_format(request)
    req = EmbedMultiVectorRequest.parse(payload, kit.settings.limits)
    result = await kit.late.embed_multi(
        req.texts, model_id(request, req.model), images=req.images,
        input_type=req.input_type,
        pool_factor=req.pool_factor, muvera=req.muvera, dtype=req.dtype,
        truncate=req.truncate, record=record(request))
    layout: ArrayLayout | None = ((req.layout or accept_layout or "numpy")
                                  if fmt == "msgpack" else None)
    return await responses.built(
        lambda: (MsgpackResponse if layout else JSONBytesResponse)(
            multi_vector_reply(result, layout)),
        sum(int(r.size) for r in result.embeddings))


# ---- late chunking ----------------------------------------------------------------------

def asks_late_chunking(payload: Any) -> bool:
    """The body asks for late chunking (Jina's ``late_chunking: true``)."""
    return isinstance(payload, dict) and payload.get("late_chunking") is True


class LateChunkingRequest(_Request):
    """``late_chunking: true`` on ``/v1/embeddings`` or ``/embed``: the texts are one
    document's chunks, in order."""

    _list_keys = ("input", "texts")

    input: list[str] | None = Field(None, description="the document's chunks, in order")
    texts: list[str] | None = Field(None, description="Blitz's name for input")
    late_chunking: Literal[True]
    model: str | None = None
    pooling: Literal["mean", "max", "first", "last"] | None = Field(None, description=_POOLING)
    normalize: StrictBool | None = None
    normalized: StrictBool | None = Field(None, description="Jina's name for normalize")
    dimensions: StrictInt | None = Field(None, gt=0)
    dtype: OutputDtype = "float32"
    encoding_format: Literal["float", "base64"] = "float"
    task: str | None = Field(None, description="Jina's: the model's prompt of that name")
    prompt_name: str | None = None
    layout: ArrayLayout | None = None

    def chunks(self) -> list[str]:
        chunks = self.input if self.input is not None else self.texts
        if not chunks:
            raise InvalidValue("late chunking takes the chunks of one document as a list of "
                               "texts in input (texts on /embed)", param="input")
        return chunks


async def _late_chunks(kit: Kit, request: Request, req: LateChunkingRequest) -> EmbedResult:
    normalize = req.normalize if req.normalize is not None else req.normalized
    result = await kit.late.embed_late_chunks(
        [req.chunks()], model_id(request, req.model),
        normalize=True if normalize is None else normalize, pooling=req.pooling,
        dimensions=req.dimensions, dtype=req.dtype,
        prompt_name=req.prompt_name or req.task, record=record(request))
    return EmbedResult(result.embeddings[0], result.model, result.usage, result.pool)


async def openai_late_chunks(kit: Kit, request: Request, payload: Payload) -> Response:
    """``/v1/embeddings`` with ``late_chunking``: OpenAI's list, one entry per chunk."""
    req = LateChunkingRequest.parse(payload, kit.settings.limits)
    result = await _late_chunks(kit, request, req)
    return JSONBytesResponse(reply_bodies.openai_embeddings_reply(result, req.encoding_format))


async def embed_late_chunks(kit: Kit, request: Request, payload: Payload) -> Response:
    """``/embed`` with ``late_chunking``: Blitz's reply, one row per chunk."""
    fmt, accept_layout = reply_format(request)
    req = LateChunkingRequest.parse(payload, kit.settings.limits)
    result = await _late_chunks(kit, request, req)
    return vectors(result, fmt, req.layout or accept_layout)


# ---- Voyage's contextualized embeddings ----------------------------------------------------

VOYAGE_DTYPES: dict[str, OutputDtype] = {"float": "float32", "int8": "int8", "uint8": "uint8",
                                         "binary": "binary", "ubinary": "ubinary"}


class ContextualizedRequest(_Request):
    """``POST /v1/contextualizedembeddings`` (Voyage's)."""

    _list_keys = ("inputs",)

    inputs: list[list[str]] = Field(min_length=1, description="documents, each a list of "
                                    "its chunks in order")
    model: str | None = None
    input_type: Literal["query", "document"] | None = Field(
        None, description="the model's prompt of that name before each document")
    output_dimension: StrictInt | None = Field(None, gt=0)
    output_dtype: Literal["float", "int8", "uint8", "binary", "ubinary"] | None = Field(
        None, description="float (default), int8, uint8, binary, ubinary")
    encoding_format: Literal["base64"] | None = None
    enable_auto_chunking: StrictBool = False
    pooling: Literal["mean", "max", "first", "last"] | None = Field(None, description=_POOLING)


def contextualized_reply(result: ChunkedEmbedResult, base64: bool) -> dict[str, Any]:
    """Voyage's body: per document ``{object: "list", data: [{object: "embedding",
    embedding, index}], index}``, then ``model`` and ``usage.total_tokens``."""
    def one(row: np.ndarray, j: int) -> dict[str, Any]:
        return {"object": "embedding", "index": j,
                "embedding": codecs.to_base64(row) if base64 else row}

    return {"object": "list", "data": [
        {"object": "list", "index": i, "data": [one(row, j) for j, row in enumerate(doc)]}
        for i, doc in enumerate(result.embeddings)],
        "model": result.model, "usage": {"total_tokens": result.usage.total_tokens}}


async def contextualized_embeddings(kit: Kit, request: Request, payload: Payload) -> Response:
    speaking(request, "voyage")
    req = ContextualizedRequest.parse(payload, kit.settings.limits)
    if req.enable_auto_chunking:
        raise InvalidValue("enable_auto_chunking is not served: send each document as the "
                           "list of its chunks", param="enable_auto_chunking")
    model = model_id(request, req.model)
    spec = kit.service.spec(model)
    prompt = req.input_type if req.input_type in spec.prompts else None
    result = await kit.late.embed_late_chunks(
        req.inputs, model, pooling=req.pooling, dimensions=req.output_dimension,
        dtype=VOYAGE_DTYPES[req.output_dtype or "float"], prompt_name=prompt, record=record(request))
    return JSONBytesResponse(contextualized_reply(result, req.encoding_format == "base64"))
