"""Cohere's routes: ``POST /v1/embed``, ``/v2/embed``, ``/v1/rerank`` (Cohere's v1, and
Jina's) and ``/v2/rerank``, with Cohere's request bodies, defined once here as
``blitz.http.bodies`` defines Blitz's, TEI's, Infinity's and OpenAI's."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StrictInt, field_validator
from starlette.requests import Request
from starlette.responses import Response

from blitz import codecs
from blitz.encoders.postprocess import quantize
from blitz.hop_messages import EmbedOptions
from blitz.http import reply_bodies
from blitz.http.bodies import RerankRequest, _Request, _Texts
from blitz.http.responses import JSONBytesResponse
from blitz.http.routes.infinity import rerank_result
from blitz.http.routes.kit import (
    Kit,
    Payload,
    model_id,
    plain,
    record,
    reply_format,
    request_id,
    speaking,
)

CohereEmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]
COHERE_INPUT_TYPES = ("search_document", "search_query", "classification", "clustering")
# the model prompts (``prompts`` in the config) tried for each Cohere input_type, in order
_COHERE_PROMPTS = {"search_query": ("search_query", "query"),
                   "search_document": ("search_document", "document", "passage"),
                   "classification": ("classification",), "clustering": ("clustering",)}


class CohereEmbedRequest(_Request):
    """``POST /v1/embed`` and ``/v2/embed`` (Cohere's shape). ``input_type`` picks the
    model's prompt of that name (``search_query`` falls back to ``query``,
    ``search_document`` to ``document`` or ``passage``); none defined, none is applied."""

    _list_keys = ("texts",)

    texts: _Texts = Field(min_length=1)
    model: str | None = None
    input_type: Literal["search_document", "search_query", "classification",
                        "clustering"] | None = None
    embedding_types: Annotated[list[CohereEmbeddingType], Field(min_length=1,
                                                               max_length=6)] | None = None
    truncate: Literal["NONE", "END"] = Field(
        "END", description="END cuts an over-long text's end; NONE refuses it (413); START "
        "(cut the beginning) is not served")
    output_dimension: StrictInt | None = Field(None, gt=0)
    max_tokens: StrictInt | None = Field(None, gt=0)

    @field_validator("truncate", mode="before")
    @classmethod
    def _no_start(cls, value: Any) -> Any:
        if isinstance(value, str) and value.upper() == "START":
            raise ValueError("START (cut the beginning of an over-long text) is not served; "
                             "send END or NONE")
        return value.upper() if isinstance(value, str) else value

    @field_validator("max_tokens")
    @classmethod
    def _max_tokens_unserved(cls, value: int | None) -> int | None:
        if value is not None:
            raise ValueError("max_tokens is not served: texts are cut at the model's "
                             "max_seq_length (truncate END) or refused (NONE)")
        return value

    def prompt_for(self, prompts: dict[str, str]) -> str | None:
        """The model prompt ``input_type`` names, if the model defines one."""
        return prompt_named(self.input_type, prompts)


def prompt_named(input_type: str | None, prompts: dict[str, str]) -> str | None:
    """The model prompt a Cohere ``input_type`` names (``search_query`` falls back to
    ``query``, ``search_document`` to ``document`` or ``passage``), if the model defines one."""
    for name in _COHERE_PROMPTS.get(input_type or "", ()):
        if name in prompts:
            return name
    return None


class CohereRerankRequest(RerankRequest):
    """``POST /v2/rerank`` (Cohere's v2): ``RerankRequest``'s fields; v2 has no
    ``return_documents`` and ``max_tokens_per_doc`` is refused rather than ignored."""

    max_tokens_per_doc: StrictInt | None = None

    @field_validator("max_tokens_per_doc")
    @classmethod
    def _unserved(cls, value: int | None) -> int | None:
        if value is not None:
            raise ValueError("max_tokens_per_doc is not served: documents are cut at the "
                             "model's max_seq_length")
        return value


async def cohere_v1_rerank(kit: Kit, request: Request, payload: Payload) -> Response:
    fmt = reply_format(request)[0]
    result = await rerank_result(kit, request, payload, RerankRequest)
    return plain(reply_bodies.rerank_reply(result, request_id(request)), fmt)


async def cohere_v2_rerank(kit: Kit, request: Request, payload: Payload) -> Response:
    speaking(request, "cohere")
    result = await rerank_result(kit, request, payload, CohereRerankRequest)
    return JSONBytesResponse(reply_bodies.cohere_rerank_reply(result, request_id(request)))


async def cohere_embed_v1(kit: Kit, request: Request, payload: Payload) -> Response:
    return await _cohere_embed(kit, request, payload, "1")


async def cohere_embed_v2(kit: Kit, request: Request, payload: Payload) -> Response:
    return await _cohere_embed(kit, request, payload, "2")


async def _cohere_embed(kit: Kit, request: Request, payload: Payload,
                        version: str) -> Response:
    """Cohere's embed: ``input_type`` picks the model's prompt; one model call gives
    every ``embedding_types`` (Blitz's fixed-scale quantization, README "Output
    options"); v1 without ``embedding_types`` answers bare floats."""
    speaking(request, "cohere")
    req = CohereEmbedRequest.parse(payload, kit.settings.limits)
    model = model_id(request, req.model)
    options = EmbedOptions(truncate=req.truncate == "END", dimensions=req.output_dimension,
                           prompt_name=req.prompt_for(kit.service.spec(model).prompts))
    result = await kit.service.embed_with(req.texts, model, options, record=record(request))
    rid = request_id(request)
    tokens = result.usage.total_tokens
    if version == "1" and req.embedding_types is None:
        return JSONBytesResponse(reply_bodies.cohere_embed_reply(
            result.embeddings, req.texts, rid, tokens, version))
    return JSONBytesResponse(reply_bodies.cohere_embed_reply(
        by_type(result.embeddings, req.embedding_types or ["float"]), req.texts, rid, tokens,
        version))


def by_type(embeddings: Any, types: list[CohereEmbeddingType]) -> dict[str, Any]:
    """Cohere's ``embeddings`` object: the rows in each asked type (Blitz's fixed-scale
    quantization; base64: little-endian float32)."""
    out: dict[str, Any] = {}
    for kind in types:
        if kind == "base64":
            out[kind] = [codecs.to_base64(row) for row in embeddings]
        else:
            out[kind] = quantize(embeddings, "float32" if kind == "float" else kind)
    return out
