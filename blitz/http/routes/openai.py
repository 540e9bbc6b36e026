"""OpenAI's routes: ``POST /v1/embeddings`` (and ``/embeddings``, Infinity's and TEI's
OpenAI-style route) and ``GET /v1/models``."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from blitz.hop_messages import EmbedOptions
from blitz.http import reply_bodies
from blitz.http.bodies import OpenAIEmbeddingRequest
from blitz.http.responses import JSONBytesResponse
from blitz.http.routes.kit import Kit, Payload, model_id, record
from blitz.ingress import status


async def openai_embeddings(kit: Kit, request: Request, payload: Payload) -> Response:
    """OpenAI's ``/v1/embeddings``, and Infinity's and TEI's ``/embeddings``."""
    req = OpenAIEmbeddingRequest.parse(payload, kit.settings.limits)
    texts, token_ids = req.texts_or_token_ids()
    options = EmbedOptions(long_inputs=req.long_inputs, dimensions=req.dimensions,
                           prompt_name=req.prompt_name, instruction=req.instruction)
    result = await kit.service.embed_with(texts, model_id(request, req.model), options,
                                          token_ids=token_ids, record=record(request))
    return JSONBytesResponse(reply_bodies.openai_embeddings_reply(result, req.encoding_format))


async def openai_models(kit: Kit, request: Request) -> Response:
    created = kit.service.started
    return JSONBytesResponse({"object": "list", "data": [
        {"id": m["id"], "object": "model", "created": created, "owned_by": "blitz",
         "kind": m["kind"], "dimension": m["dimension"],
         "max_seq_length": m["max_seq_length"]}
        for m in status.describe_models(kit.service)]})
