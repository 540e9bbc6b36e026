"""Hugging Face TEI's own routes: ``POST /`` (and SageMaker's ``/invocations``), the route
of the model's kind; ``/embed_all``, ``/embed_sparse``, ``/similarity``, ``/predict``,
``/tokenize`` and ``/decode``. TEI's ``/embed`` and ``/rerank`` are shared with Blitz
(``blitz_api``) and Infinity (``infinity``), which decide there which shape a request
gets."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from blitz.http import reply_bodies, responses
from blitz.http.bodies import (
    DecodeRequest,
    EmbedAllRequest,
    EmbedSparseRequest,
    PredictRequest,
    SimilarityRequest,
    TokenizeRequest,
)
from blitz.http.responses import JSONBytesResponse, MsgpackResponse
from blitz.http.routes.blitz_api import embed
from blitz.http.routes.infinity import rerank
from blitz.http.routes.kit import Kit, Payload, model_id, plain, record, reply_format, speaking
from blitz.settings.kinds import kind_of


async def tei_root(kit: Kit, request: Request, payload: Payload) -> Response:
    """Hugging Face TEI's ``POST /`` (and SageMaker's ``/invocations``): the route of
    the model's kind, as TEI serves it: an embedding model embeds, or scores
    ``{source_sentence, sentences}`` (``/similarity``, what ``InferenceClient.
    sentence_similarity`` sends); a cross-encoder or LLM reranker reranks, a classifier
    predicts, a sparse model answers ``/embed_sparse``. The model: the header's, else
    the default."""
    speaking(request, "tei")
    body_model = payload.get("model") if isinstance(payload, dict) else None
    root = kind_of(kit.service.spec(model_id(request, body_model)).kind).tei_root
    inputs = payload.get("inputs") if isinstance(payload, dict) else None
    if root == "rerank":
        return await rerank(kit, request, payload)
    if root == "predict":
        if isinstance(payload, dict) and isinstance(payload.get("parameters"), dict):
            return await _pipeline_classify(kit, request, payload)
        return await predict(kit, request, payload)
    if root == "embed_sparse":
        return await embed_sparse(kit, request, payload)
    if isinstance(inputs, dict):
        return await similarity(kit, request, payload)
    return await embed(kit, request, payload)


async def _pipeline_classify(kit: Kit, request: Request, payload: dict) -> Response:
    """The Hugging Face task API's envelope, ``{inputs, parameters: {top_k,
    function_to_apply}}`` (what ``InferenceClient.text_classification`` sends): its
    ``[[{label, score}]]`` reply, one list per input (TEI ignores ``parameters`` and
    answers a flat list, which that client cuts to one label)."""
    options = payload["parameters"]
    body = {"inputs": payload.get("inputs"), "top_k": options.get("top_k"),
            "raw_scores": options.get("function_to_apply") == "none"}
    req = PredictRequest.parse(body, kit.settings.limits)
    items, _single = req.batch()
    result = await kit.outputs.classify(
        items, model=model_id(request, None), raw_scores=req.raw_scores,
        top_k=req.top_k, truncate=req.truncate, record=record(request))
    return JSONBytesResponse(reply_bodies.predict_reply(result, False))


async def embed_all(kit: Kit, request: Request, payload: Payload) -> Response:
    return await _arrays(kit, request, payload, EmbedAllRequest, kit.outputs.embed_all,
                         reply_bodies.embed_all_reply)


async def embed_sparse(kit: Kit, request: Request, payload: Payload) -> Response:
    return await _arrays(kit, request, payload, EmbedSparseRequest, kit.outputs.embed_sparse,
                         reply_bodies.embed_sparse_reply)


async def _arrays(kit: Kit, request: Request, payload: Payload, body: type[EmbedAllRequest],
                  run: Any, reply: Any) -> Response:
    """A route of texts in, arrays out: JSON (TEI's lists) unless msgpack is asked for,
    then in the body's or Accept's array layout."""
    fmt, accept_layout = reply_format(request)
    req = body.parse(payload, kit.settings.limits)
    result = await run(req.texts, model=model_id(request, req.model),
                       truncate=req.truncate, prompt_name=req.prompt_name,
                       long_inputs=req.long_inputs, record=record(request))
    layout = req.layout or accept_layout or "numpy"
    return await responses.built(  # a large reply is encoded off the event loop
        lambda: MsgpackResponse(reply(result, layout)) if fmt == "msgpack"
        else JSONBytesResponse(reply(result, None)), responses.numbers(result.embeddings))


async def similarity(kit: Kit, request: Request, payload: Payload) -> Response:
    fmt = reply_format(request)[0]  # before work
    req = SimilarityRequest.parse(payload, kit.settings.limits)
    options = req.parameters
    result = await kit.outputs.similarity(
        req.inputs.source_sentence, req.inputs.sentences,
        model=model_id(request, req.model),
        truncate=True if options is None or options.truncate is None else options.truncate,
        prompt_name=options.prompt_name if options else None, record=record(request))
    return plain(reply_bodies.similarity_reply(result), fmt)


async def predict(kit: Kit, request: Request, payload: Payload) -> Response:
    fmt = reply_format(request)[0]  # before work
    req = PredictRequest.parse(payload, kit.settings.limits)
    items, single = req.batch()
    result = await kit.outputs.classify(
        items, model=model_id(request, req.model), raw_scores=req.raw_scores,
        top_k=req.top_k, truncate=req.truncate, record=record(request))
    return plain(reply_bodies.predict_reply(result, single), fmt)


async def tokenize(kit: Kit, request: Request, payload: Payload) -> Response:
    fmt = reply_format(request)[0]  # before work
    req = TokenizeRequest.parse(payload, kit.settings.limits)
    result = await kit.tokens.tokenize(
        req.texts, model=model_id(request, req.model),
        add_special_tokens=req.add_special_tokens, prompt_name=req.prompt_name,
        return_offsets=req.return_offsets, offsets=req.offsets, record=record(request))
    return await responses.built(  # a large reply is built off the event loop
        lambda: plain(reply_bodies.tokenize_reply(result), fmt),
        5 * sum(map(len, result.tokens)))


async def decode(kit: Kit, request: Request, payload: Payload) -> Response:
    fmt = reply_format(request)[0]  # before work
    req = DecodeRequest.parse(payload, kit.settings.limits)
    result = await kit.tokens.decode(
        req.ids, model=model_id(request, req.model),
        skip_special_tokens=req.skip_special_tokens, record=record(request))
    return plain(reply_bodies.decode_reply(result), fmt)
