"""The peers' own routes on Blitz's HTTP API: Cohere's embed and rerank (``/v1/embed``,
``/v2/embed``, ``/v2/rerank``) and Hugging Face TEI's ``POST /`` (the route of the model's
kind). The routes the peers share with Blitz (``/embed``, ``/rerank``, ...) live in
``blitz.http.api``, which decides there which shape a request gets."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from blitz import codecs
from blitz.encoders.postprocess import quantize
from blitz.http import reply_bodies
from blitz.http.bodies import PredictRequest
from blitz.http.middleware import record_of, request_id_of, speaks
from blitz.http.peer_bodies import CohereEmbedRequest, CohereRerankRequest
from blitz.http.responses import JSONBytesResponse
from blitz.settings.registry import RERANK_KINDS

Payload = Any  # a decoded request body (blitz.codecs.decode_body)


class PeerRoutes:
    """Routes of the peers' APIs, over the ``HttpApi`` that serves them (typed ``Any``:
    ``blitz.http.api`` imports this module, not the other way round)."""

    def __init__(self, api: Any):
        self.api = api

    async def cohere_v2_rerank(self, request: Request, payload: Payload) -> Response:
        speaks(request.scope, "cohere")
        result = await self.api.rerank_result(request, payload, CohereRerankRequest)
        return JSONBytesResponse(reply_bodies.cohere_rerank_reply(result, request_id_of(request.scope)))

    async def cohere_embed_v1(self, request: Request, payload: Payload) -> Response:
        return await self._cohere_embed(request, payload, "1")

    async def cohere_embed_v2(self, request: Request, payload: Payload) -> Response:
        return await self._cohere_embed(request, payload, "2")

    async def _cohere_embed(self, request: Request, payload: Payload,
                            version: str) -> Response:
        """Cohere's embed: ``input_type`` picks the model's prompt; one model call gives
        every ``embedding_types`` (Blitz's fixed-scale quantization, README "Output
        options"); v1 without ``embedding_types`` answers bare floats."""
        speaks(request.scope, "cohere")
        req = CohereEmbedRequest.parse(payload, self.api.settings.limits)
        model = self.api.model_id(request, req.model)
        result = await self.api.service.embed(
            req.texts, model=model, truncate=req.truncate == "END",
            dimensions=req.output_dimension,
            prompt_name=req.prompt_for(self.api.service.spec(model).prompts),
            record=record_of(request.scope))
        request_id = request_id_of(request.scope)
        tokens = result.usage.total_tokens
        if version == "1" and req.embedding_types is None:
            return JSONBytesResponse(reply_bodies.cohere_embed_reply(result.embeddings, req.texts,
                                                             request_id, tokens, version))
        by_type: dict[str, Any] = {}
        for kind in req.embedding_types or ["float"]:
            if kind == "base64":
                by_type[kind] = [codecs.to_base64(row) for row in result.embeddings]
            else:
                by_type[kind] = quantize(result.embeddings,
                                         "float32" if kind == "float" else kind)
        return JSONBytesResponse(reply_bodies.cohere_embed_reply(by_type, req.texts, request_id,
                                                         tokens, version))

    async def tei_root(self, request: Request, payload: Payload) -> Response:
        """Hugging Face TEI's ``POST /`` (and SageMaker's ``/invocations``): the route of
        the model's kind, as TEI serves it: an embedding model embeds, or scores
        ``{source_sentence, sentences}`` (``/similarity``, what ``InferenceClient.
        sentence_similarity`` sends); a cross-encoder or LLM reranker reranks, a classifier
        predicts, a sparse model answers ``/embed_sparse``. The model: the header's, else
        the default."""
        speaks(request.scope, "tei")
        body_model = payload.get("model") if isinstance(payload, dict) else None
        kind = self.api.service.spec(self.api.model_id(request, body_model)).kind
        inputs = payload.get("inputs") if isinstance(payload, dict) else None
        if kind in RERANK_KINDS:
            return await self.api.rerank(request, payload)
        if kind == "classifier":
            if isinstance(payload, dict) and isinstance(payload.get("parameters"), dict):
                return await self._pipeline_classify(request, payload)
            return await self.api.predict(request, payload)
        if kind == "sparse":
            return await self.api.embed_sparse(request, payload)
        if isinstance(inputs, dict):
            return await self.api.similarity(request, payload)
        return await self.api.embed(request, payload)

    async def _pipeline_classify(self, request: Request, payload: dict) -> Response:
        """The Hugging Face task API's envelope, ``{inputs, parameters: {top_k,
        function_to_apply}}`` (what ``InferenceClient.text_classification`` sends): its
        ``[[{label, score}]]`` reply, one list per input (TEI ignores ``parameters`` and
        answers a flat list, which that client cuts to one label)."""
        options = payload["parameters"]
        body = {"inputs": payload.get("inputs"), "top_k": options.get("top_k"),
                "raw_scores": options.get("function_to_apply") == "none"}
        req = PredictRequest.parse(body, self.api.settings.limits)
        items, _single = req.batch()
        result = await self.api.outputs.classify(
            items, model=self.api.model_id(request, None), raw_scores=req.raw_scores,
            top_k=req.top_k, truncate=req.truncate, record=record_of(request.scope))
        return JSONBytesResponse(reply_bodies.predict_reply(result, False))
