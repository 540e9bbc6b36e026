"""Documents of text and image parts on the HTTP API, in the request shapes each API's
clients send (``blitz.ingress.parts`` reads every part shape), with each API's reply:

- ``POST /embed`` with ``parts`` (Blitz's): one vector per document, in Blitz's reply
  (JSON, msgpack or raw, as for texts).
- ``POST /v1/embeddings`` and ``/embeddings`` with ``messages`` (vLLM's chat embeddings:
  the system turn's text is the instruction, the user turns' parts are one document; one
  vector), or with ``input`` objects (Jina's ``[{"text"} | {"image"}]``: one vector each):
  OpenAI's reply.
- ``POST /v2/embed`` and ``/v1/embed`` with ``inputs`` (``[{content: [parts]}]``) or
  ``images`` (Cohere's): Cohere's reply, by type.
- ``POST /v1/multimodalembeddings`` (Voyage's): ``inputs: [{content: [parts]}]``;
  Voyage's reply with ``text_tokens``, ``image_pixels`` and ``total_tokens``.
- ``POST /rerank``, ``/v1/rerank`` (Jina's, Cohere's v1) and ``/v2/rerank`` (Cohere's v2)
  whose documents (or query) hold images or parts: each API's rerank reply.

A request's ``input_type`` (Cohere's, Voyage's) picks the model's prompt of that name as
the instruction, where the model defines one (``prompts`` in its spec).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, StrictBool, StrictInt, field_validator
from starlette.requests import Request
from starlette.responses import Response

from blitz.codecs import ArrayLayout
from blitz.encoders.postprocess import OutputDtype
from blitz.errors import InvalidValue
from blitz.http import reply_bodies
from blitz.http.bodies import _Request
from blitz.http.responses import JSONBytesResponse
from blitz.http.routes.cohere import CohereEmbeddingType, by_type, prompt_named
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
    vectors,
)

_PARTS = ("documents, each a text, a part ({\"text\"}, {\"image\"}, {\"type\": \"text\" | "
          "\"image_url\" | \"image_base64\"}) or a list of parts, in order; an image is its "
          "bytes (msgpack), base64, a data URL, or an http(s) URL under images.url_allow")


def asks_parts(payload: Any) -> bool:
    """``/embed``'s body asks for documents of parts with ``parts``."""
    return isinstance(payload, dict) and "parts" in payload


def asks_chat_or_objects(payload: Any) -> bool:
    """OpenAI's embeddings body with ``messages`` (vLLM's), or ``input`` objects (Jina's)."""
    if not isinstance(payload, dict):
        return False
    items = payload.get("input")
    return "messages" in payload or (isinstance(items, list)
                                     and any(isinstance(x, dict) for x in items[:64]))


def asks_cohere_images(payload: Any) -> bool:
    """Cohere's embed body with ``inputs`` or ``images``."""
    return isinstance(payload, dict) and ("inputs" in payload or "images" in payload)


def asks_mixed_rerank(payload: Any) -> bool:
    """A rerank body whose query or documents are images or parts, not texts (a string,
    or Cohere's and Jina's ``{"text": ...}``)."""
    if not isinstance(payload, dict) or "images" in payload:
        return False
    documents = payload.get("documents")
    return not isinstance(payload.get("query", ""), str) or (
        isinstance(documents, list) and not all(map(_a_text, documents[:4096])))


def _a_text(document: Any) -> bool:
    return isinstance(document, str) or (isinstance(document, dict) and set(document) == {"text"})


class EmbedPartsRequest(_Request):
    """``POST /embed`` with ``parts``."""

    parts: list[Any] = Field(min_length=1, description=_PARTS)
    model: str | None = Field(None, description="a vl-embedding model id; header or default")
    instruction: str | None = Field(None, description="the system turn's instruction; "
                                    "default: the model's")
    normalize: StrictBool | None = Field(None, description="unit-length rows; default per model")
    dimensions: StrictInt | None = Field(None, gt=0, description="Matryoshka: keep the first N")
    dtype: OutputDtype = Field("float32", description="float32|float16|int8|uint8|binary|ubinary")
    layout: ArrayLayout | None = Field(None, description="msgpack reply's array layout")
    truncate: StrictBool = Field(True, description="cut an over-long document's texts (never "
                                 "an image); false: 413")


class ChatEmbeddingRequest(_Request):
    """``POST /v1/embeddings`` with ``messages`` (vLLM's) or ``input`` objects (Jina's)."""

    messages: list[dict[str, Any]] | None = Field(
        None, min_length=1, description="chat messages: system (the instruction), user (the "
        "document's parts), an empty assistant turn (ignored)")
    input: Any = Field(None, description="Jina's [{\"text\"} | {\"image\"}], one vector each")
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = Field(None, ge=0, description="0: the model's own")
    user: str | None = None
    normalized: StrictBool | None = Field(None, description="Jina's: unit-length rows")
    task: str | None = Field(None, description="Jina's task: its prompt of that name, if "
                             "the model defines one")
    add_generation_prompt: StrictBool | None = None  # vLLM's: the model's own template decides
    continue_final_message: StrictBool | None = None
    add_special_tokens: StrictBool | None = None

    def documents(self) -> tuple[list[Any], str | None]:
        """The documents and the instruction the body gives."""
        if self.messages is None:
            if not isinstance(self.input, list) or not self.input:
                raise InvalidValue("input must be a non-empty list", param="input")
            return list(self.input), None
        instruction: list[str] = []
        parts: list[Any] = []
        for i, message in enumerate(self.messages):
            role, content = message.get("role"), message.get("content")
            if role == "system":
                texts = content if isinstance(content, list) else [content]
                instruction.extend(p if isinstance(p, str) else str(p.get("text", ""))
                                   for p in texts if isinstance(p, (str, dict)))
            elif role == "user":
                parts.extend(content if isinstance(content, list) else [content])
            elif role == "assistant":  # vLLM's examples end with an empty one
                said = content if isinstance(content, list) else [content]
                if any(p if isinstance(p, str) else isinstance(p, dict) and p.get("text")
                       for p in said):
                    raise InvalidValue(f"messages[{i}]: an assistant turn with content is "
                                       "not served; send system and user turns",
                                       param="messages")
            else:
                raise InvalidValue(f"messages[{i}].role must be system, user or assistant",
                                   param="messages")
        if not parts:
            raise InvalidValue("messages hold no user content to embed", param="messages")
        return [parts], "".join(instruction) or None


class CohereMultimodalRequest(_Request):
    """``POST /v2/embed`` (and ``/v1/embed``) with ``inputs`` or ``images`` (Cohere's)."""

    inputs: list[Any] | None = Field(None, description="[{content: [{type: text | "
                                     "image_url}]}]: one vector each")
    images: list[Any] | None = Field(None, description="data URLs: one vector each")
    texts: list[str] | None = Field(None, description="not with inputs or images")
    model: str | None = None
    input_type: Literal["search_document", "search_query", "classification", "clustering",
                        "image"] | None = None
    embedding_types: list[CohereEmbeddingType] | None = Field(None, min_length=1, max_length=6)
    output_dimension: StrictInt | None = Field(None, gt=0)
    truncate: Literal["NONE", "END"] = "END"
    max_tokens: StrictInt | None = Field(None, gt=0)

    @field_validator("truncate", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        if isinstance(value, str) and value.upper() == "START":
            raise ValueError("START (cut the beginning) is not served; send END or NONE")
        return value.upper() if isinstance(value, str) else value

    def documents(self) -> list[Any]:
        if self.texts:
            raise InvalidValue("send texts, or inputs or images, not both", param="texts")
        if self.inputs and self.images:
            raise InvalidValue("send inputs or images, not both", param="inputs")
        items = self.inputs or [[image] for image in (self.images or [])]
        if not items:
            raise InvalidValue("inputs (or images) must be a non-empty list", param="inputs")
        return [[{"type": "image", "image": item[0]}] if isinstance(item, list) else item
                for item in items]


class VoyageRequest(_Request):
    """``POST /v1/multimodalembeddings`` (Voyage's)."""

    inputs: list[Any] = Field(min_length=1, description="[{content: [{type: text | image_url "
                              "| image_base64}]}]: one vector each")
    model: str | None = None
    input_type: Literal["query", "document"] | None = Field(
        None, description="the model's prompt of that name as the instruction, if defined")
    truncation: StrictBool = True
    output_encoding: Literal["base64"] | None = None
    encoding_format: Literal["base64", "float"] | None = Field(
        None, description="the voyageai client's name for output_encoding")
    output_dtype: Literal["float"] | None = None
    output_dimension: StrictInt | None = Field(None, gt=0)


class RerankPartsRequest(_Request):
    """A rerank body (Blitz's, Infinity's, Jina's, Cohere's) whose query or documents hold
    images or parts."""

    query: Any = Field(description="a text, a part or a list of parts")
    documents: list[Any] = Field(min_length=1, description=_PARTS)
    model: str | None = None
    top_n: StrictInt | None = Field(None, gt=0)
    instruction: str | None = None
    return_documents: StrictBool = False
    truncate: StrictBool = True


async def embed(kit: Kit, request: Request, payload: Payload) -> Response:
    fmt, accept_layout = reply_format(request)  # before work
    req = EmbedPartsRequest.parse(payload)
    result = await kit.parts.embed_parts(
        req.parts, model_id(request, req.model), instruction=req.instruction,
        normalize=req.normalize, dimensions=req.dimensions, dtype=req.dtype,
        truncate=req.truncate, record=record(request))
    return vectors(result, fmt, req.layout or accept_layout)


async def openai_embeddings(kit: Kit, request: Request, payload: Payload) -> Response:
    req = ChatEmbeddingRequest.parse(payload)
    documents, instruction = req.documents()
    model = model_id(request, req.model)
    if instruction is None and req.task:
        instruction = kit.service.spec(model).prompts.get(req.task)
    result = await kit.parts.embed_parts(
        documents, model, instruction=instruction, normalize=req.normalized,
        dimensions=req.dimensions or None, record=record(request))
    return JSONBytesResponse(reply_bodies.openai_embeddings_reply(result,
                                                                  req.encoding_format))


async def cohere_embed(kit: Kit, request: Request, payload: Payload) -> Response:
    speaking(request, "cohere")
    req = CohereMultimodalRequest.parse(payload)
    model = model_id(request, req.model)
    spec = kit.service.spec(model)
    name = prompt_named(req.input_type, spec.prompts)
    result = await kit.parts.embed_parts(
        req.documents(), model, instruction=spec.prompts[name] if name else None,
        dimensions=req.output_dimension, truncate=req.truncate == "END",
        record=record(request))
    body = reply_bodies.cohere_embed_reply(
        by_type(result.embeddings, req.embedding_types or ["float"]), [], request_id(request),
        result.usage.total_tokens, "2")
    body["meta"]["billed_units"].update(images=_images_in(req),
                                        image_tokens=result.usage.image_tokens)
    return JSONBytesResponse(body)


async def voyage_embeddings(kit: Kit, request: Request, payload: Payload) -> Response:
    speaking(request, "voyage")
    req = VoyageRequest.parse(payload)
    model = model_id(request, req.model)
    spec = kit.service.spec(model)
    instruction = spec.prompts.get(req.input_type) if req.input_type else None
    result = await kit.parts.embed_parts(
        req.inputs, model, instruction=instruction, dimensions=req.output_dimension,
        truncate=req.truncation, record=record(request))
    body = reply_bodies.openai_embeddings_reply(
        result, "base64" if "base64" in (req.output_encoding, req.encoding_format) else "float")
    usage = result.usage
    body["usage"] = {"text_tokens": usage.total_tokens - usage.image_tokens,
                     "image_pixels": usage.image_pixels, "video_pixels": 0,
                     "total_tokens": usage.total_tokens}
    return JSONBytesResponse(body)


async def rerank(kit: Kit, request: Request, payload: Payload) -> Response:
    """``/rerank``: Infinity's JSON reply, Blitz's msgpack."""
    fmt = reply_format(request)[0]  # before work
    result, req = await _reranked(kit, request, payload)
    return ranked(result, fmt, request_id(request))


async def rerank_v1(kit: Kit, request: Request, payload: Payload) -> Response:
    """``/v1/rerank``: Jina's and Cohere's v1 reply."""
    fmt = reply_format(request)[0]
    result, _ = await _reranked(kit, request, payload)
    return plain(reply_bodies.rerank_reply(result, request_id(request)), fmt)


async def rerank_v2(kit: Kit, request: Request, payload: Payload) -> Response:
    """``/v2/rerank``: Cohere's v2 reply."""
    speaking(request, "cohere")
    result, _ = await _reranked(kit, request, payload)
    return JSONBytesResponse(reply_bodies.cohere_rerank_reply(result, request_id(request)))


async def _reranked(kit: Kit, request: Request, payload: Payload) -> tuple[Any, Any]:
    req = RerankPartsRequest.parse(payload)
    result = await kit.parts.rerank_parts(
        req.query, req.documents, model_id(request, req.model), top_n=req.top_n,
        instruction=req.instruction, truncate=req.truncate, record=record(request))
    return result, req


def _images_in(req: CohereMultimodalRequest) -> int:
    if req.images:
        return len(req.images)
    return sum(1 for item in req.inputs or [] if isinstance(item, dict)
               for part in item.get("content") or [] if isinstance(part, dict)
               and part.get("type") == "image_url")

