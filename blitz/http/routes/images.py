"""Images on the HTTP API, on the routes texts use, with the reply texts get: the image
variant of a route (``blitz.http.routes.table``, ``Variant``) answers a body that asks for
images.

- ``POST /embed`` with ``images`` (Blitz's): the vectors, in Blitz's reply, JSON, msgpack
  or raw as for texts. In msgpack each image is its file's bytes; in JSON, base64 or a
  data URL.
- ``POST /v1/embeddings`` and ``/embeddings`` with ``modality: "image"`` (Infinity's), and
  Infinity's ``POST /embeddings_image``: OpenAI's reply.
- ``POST /rerank`` with ``images`` in place of ``documents``: the images scored against
  the query, in the reply a text rerank gets (Infinity's JSON, or Blitz's msgpack).
- ``POST /similarity`` with ``inputs: {source_sentence, images}``: TEI's list of scores.

An ``http(s)`` URL is fetched only under ``images.url_allow``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, StrictBool, StrictInt
from starlette.requests import Request
from starlette.responses import Response

from blitz.codecs import ArrayLayout
from blitz.encoders.postprocess import OutputDtype
from blitz.http import reply_bodies
from blitz.http.bodies import _Request
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
    vectors,
)
from blitz.settings.kinds import kind_of

_IMAGES = "each an image file: its bytes (msgpack), base64, a data URL, or an http(s) URL " \
          "under images.url_allow"


class EmbedImagesRequest(_Request):
    """``POST /embed`` with ``images``."""

    images: list[Any] = Field(min_length=1, description=_IMAGES)
    model: str | None = Field(None, description="a dual-encoder model id; header or default")
    normalize: StrictBool | None = Field(None, description="unit-length rows; default per model")
    dimensions: StrictInt | None = Field(None, gt=0, description="Matryoshka: keep the first N")
    dtype: OutputDtype = Field("float32", description="float32|float16|int8|uint8|binary|ubinary")
    layout: ArrayLayout | None = Field(None, description="msgpack reply's array layout")


class OpenAIImagesRequest(_Request):
    """``POST /v1/embeddings`` with ``modality: "image"`` (Infinity's), ``/embeddings_image``."""

    input: str | list[Any] = Field(description=_IMAGES)
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = Field(None, ge=0, description="0: the model's own")
    user: str | None = None
    modality: Literal["image"] = "image"


class RerankImagesRequest(_Request):
    """``POST /rerank`` with ``images`` in place of ``documents``."""

    query: str
    images: list[Any] = Field(min_length=1, description=_IMAGES)
    model: str | None = None
    top_n: StrictInt | None = Field(None, gt=0)


class SimilarityImagesInputs(_Request):
    source_sentence: str
    images: list[Any] = Field(min_length=1, description=_IMAGES)


class SimilarityImagesRequest(_Request):
    """``POST /similarity`` with ``inputs: {source_sentence, images}``."""

    inputs: SimilarityImagesInputs
    model: str | None = None


async def embed(kit: Kit, request: Request, payload: Payload) -> Response:
    fmt, accept_layout = reply_format(request)  # before work
    req = EmbedImagesRequest.parse(payload)
    result = await kit.images.embed_images(
        req.images, model=model_id(request, req.model), normalize=req.normalize,
        dimensions=req.dimensions, dtype=req.dtype, record=record(request))
    return vectors(result, fmt, req.layout or accept_layout)


async def openai_embeddings(kit: Kit, request: Request, payload: Payload) -> Response:
    req = OpenAIImagesRequest.parse(payload)
    result = await kit.images.embed_images(
        [req.input] if isinstance(req.input, str) else req.input,
        model=model_id(request, req.model), dimensions=req.dimensions or None,
        record=record(request))
    return JSONBytesResponse(reply_bodies.openai_embeddings_reply(result,
                                                                  req.encoding_format))


async def rerank(kit: Kit, request: Request, payload: Payload) -> Response:
    fmt = reply_format(request)[0]  # before work
    req = RerankImagesRequest.parse(payload)
    model = model_id(request, req.model)
    rerank = (kit.late.rerank_pages if "embed_multi" in kind_of(kit.service.spec(model).kind)
              .serves else kit.images.rerank_images)  # a visual retriever's: MaxSim
    result = await rerank(req.query, req.images, model=model, top_n=req.top_n,
                          record=record(request))
    return ranked(result, fmt, request_id(request))


async def similarity(kit: Kit, request: Request, payload: Payload) -> Response:
    fmt = reply_format(request)[0]  # before work
    req = SimilarityImagesRequest.parse(payload)
    result = await kit.images.similarity_images(
        req.inputs.source_sentence, req.inputs.images,
        model=model_id(request, req.model), record=record(request))
    return plain(reply_bodies.similarity_reply(result), fmt)
