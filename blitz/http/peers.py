"""The peers' own routes on Blitz's HTTP API: Cohere's embed and rerank (``/v1/embed``,
``/v2/embed``, ``/v2/rerank``) and Hugging Face TEI's ``POST /`` (the route of the model's
kind), with Cohere's request bodies, defined once here as ``blitz.http.bodies`` defines
Blitz's, TEI's, Infinity's and OpenAI's. The routes the peers share with Blitz
(``/embed``, ``/rerank``, ...) live in ``blitz.http.api``, which decides there which shape
a request gets."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StrictInt, field_validator
from starlette.requests import Request
from starlette.responses import Response

from blitz import codecs
from blitz.encoders.postprocess import quantize
from blitz.http import reply_bodies
from blitz.http.bodies import PredictRequest, RerankRequest, _Request, _Texts
from blitz.http.middleware import record_of, request_id_of, speaks
from blitz.http.responses import JSONBytesResponse
from blitz.settings.kinds import kind_of

Payload = Any  # a decoded request body (blitz.codecs.decode_body)

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
        for name in _COHERE_PROMPTS.get(self.input_type or "", ()):
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
        root = kind_of(self.api.service.spec(self.api.model_id(request, body_model)).kind
                       ).tei_root
        inputs = payload.get("inputs") if isinstance(payload, dict) else None
        if root == "rerank":
            return await self.api.rerank(request, payload)
        if root == "predict":
            if isinstance(payload, dict) and isinstance(payload.get("parameters"), dict):
                return await self._pipeline_classify(request, payload)
            return await self.api.predict(request, payload)
        if root == "embed_sparse":
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
