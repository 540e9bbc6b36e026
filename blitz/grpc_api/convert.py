"""Each TEI gRPC method as a call of Blitz's services: its request message in, its reply
message out (``ANSWER``), with TEI's ``Metadata`` filled from the request's record."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from blitz.errors import InvalidValue
from blitz.grpc_api import tei_pb2 as pb
from blitz.grpc_api.rpc_table import Malformed
from blitz.hop_messages import EmbedOptions
from blitz.ingress import status
from blitz.ingress.other_outputs import OutputService
from blitz.ingress.service import EmbeddingService, RequestRecord
from blitz.ingress.tokenizing import INLINE_VALUES, TokenService, off_loop


class Services(Protocol):
    """What a method is answered with (``TeiServicer``)."""

    service: EmbeddingService
    tokens: TokenService
    outputs: OutputService


Answer = Callable[[Services, Any, "str | None", RequestRecord], Awaitable[Any]]

MODEL_TYPES = {"embedding": pb.MODEL_TYPE_EMBEDDING, "classifier": pb.MODEL_TYPE_CLASSIFIER,
               "reranker": pb.MODEL_TYPE_RERANKER}


def optional(request: Any, field: str) -> Any:
    return getattr(request, field) if request.HasField(field) else None


def _right_only(request: Any) -> None:
    """Where only the right end is cut (as the HTTP route of the same output), LEFT is
    refused, not silently cut the other way."""
    if request.truncation_direction != pb.TRUNCATION_DIRECTION_RIGHT:
        raise InvalidValue("truncation_direction LEFT is not supported here: this method "
                           "truncates on the right (Embed cuts either end)",
                           param="truncation_direction")


def side(request: Any) -> str | None:
    """``truncation_side`` of an Embed message: "left" for LEFT, the model's for RIGHT
    (proto3's default, as TEI's HTTP route takes a missing direction)."""
    if request.truncation_direction == pb.TRUNCATION_DIRECTION_LEFT:
        return "left"
    if request.truncation_direction != pb.TRUNCATION_DIRECTION_RIGHT:
        raise InvalidValue(f"truncation_direction {request.truncation_direction} is not "
                           "RIGHT or LEFT", param="truncation_direction")
    return None


async def info(s: Services, request: Any, model: str | None,
               record: RequestRecord) -> Any:
    facts: dict[str, Any] = status.info(s.service, model)
    record.model = facts["model_id"]
    return pb.InfoResponse(
        version=facts["version"], model_id=facts["model_id"],
        model_dtype=facts["model_dtype"], model_type=MODEL_TYPES[next(iter(facts["model_type"]))],
        max_concurrent_requests=facts["max_concurrent_requests"],
        max_input_length=facts["max_input_length"] or 0,
        max_batch_tokens=facts["max_batch_tokens"] or 0,
        max_batch_requests=facts["max_batch_requests"],
        max_client_batch_size=facts["max_client_batch_size"], tokenization_workers=0)


def embed_options(request: Any) -> EmbedOptions:
    """An Embed message's options (an ``EmbedStream``'s messages of equal options share one
    call: ``blitz.grpc_api.grouping``)."""
    return EmbedOptions(normalize=optional(request, "normalize"), truncate=request.truncate,
                        truncation_side=side(request), dimensions=optional(request, "dimensions"),
                        prompt_name=optional(request, "prompt_name"))


async def embed(s: Services, request: Any, model: str | None,
                record: RequestRecord) -> Any:
    result = await s.service.embed(request.inputs, model=model,
                                   **embed_options(request).keywords(), record=record)
    return pb.EmbedResponse(embeddings=result.embeddings[0].tolist())


async def embed_sparse(s: Services, request: Any, model: str | None,
                       record: RequestRecord) -> Any:
    _right_only(request)
    result = await s.outputs.embed_sparse(
        request.inputs, model=model, truncate=request.truncate,
        prompt_name=optional(request, "prompt_name"), record=record)
    vector = result.embeddings[0]
    return pb.EmbedSparseResponse(sparse_embeddings=[
        pb.SparseValue(index=i, value=v)
        for i, v in zip(vector.indices.tolist(), vector.values.tolist(), strict=True)])


async def embed_all(s: Services, request: Any, model: str | None,
                    record: RequestRecord) -> Any:
    _right_only(request)
    result = await s.outputs.embed_all(
        request.inputs, model=model, truncate=request.truncate,
        prompt_name=optional(request, "prompt_name"), record=record)
    rows = result.embeddings[0]
    return await off_loop(lambda: pb.EmbedAllResponse(token_embeddings=[
        pb.TokenEmbedding(embeddings=row) for row in rows.tolist()]), rows.size, INLINE_VALUES)


async def _predict(s: Services, item: str | list[str], request: Any, model: str | None,
                   record: RequestRecord) -> Any:
    _right_only(request)
    items: list[str] | list[list[str]] = [item] if isinstance(item, str) else [item]
    result = await s.outputs.classify(items, model=model, raw_scores=request.raw_scores,
                                      truncate=request.truncate, record=record)
    return pb.PredictResponse(predictions=[pb.Prediction(score=p.score, label=p.label)
                                           for p in result.predictions[0]])


async def predict(s: Services, request: Any, model: str | None,
                  record: RequestRecord) -> Any:
    return await _predict(s, request.inputs, request, model, record)


async def predict_pair(s: Services, request: Any, model: str | None,
                       record: RequestRecord) -> Any:
    inputs = list(request.inputs)
    if len(inputs) not in (1, 2):
        raise InvalidValue(f"`inputs` must have a single or two elements. Given: "
                           f"{len(inputs)}", param="inputs")
    return await _predict(s, inputs if len(inputs) == 2 else inputs[0], request, model,
                          record)


async def rerank(s: Services, request: Any, model: str | None,
                 record: RequestRecord) -> Any:
    _right_only(request)
    if request.raw_scores:
        raise InvalidValue("raw_scores is not supported on Rerank: scores are the model's "
                           "own (a cross-encoder's activation, or an embedding model's "
                           "cosine)", param="raw_scores")
    result = await s.service.rerank(request.query, list(request.texts), model=model,
                                    return_documents=request.return_text,
                                    truncate=request.truncate, record=record)
    return pb.RerankResponse(ranks=[
        pb.Rank(index=hit.index, score=hit.relevance_score, text=hit.document)
        for hit in result.results])


async def tokenize(s: Services, request: Any, model: str | None,
                   record: RequestRecord) -> Any:
    result = await s.tokens.tokenize(
        request.inputs, model=model, add_special_tokens=request.add_special_tokens,
        prompt_name=optional(request, "prompt_name"), offsets="bytes", record=record,
        param="inputs")
    tokens = result.tokens[0]
    return await off_loop(lambda: pb.EncodeResponse(tokens=[
        pb.SimpleToken(id=t.id, text=t.text, special=t.special, start=t.start, stop=t.stop)
        for t in tokens]), 5 * len(tokens), INLINE_VALUES)


async def decode(s: Services, request: Any, model: str | None,
                 record: RequestRecord) -> Any:
    result = await s.tokens.decode([list(request.ids)], model=model,
                                   skip_special_tokens=request.skip_special_tokens,
                                   record=record)
    return pb.DecodeResponse(text=result.texts[0])


def checked(answer: Answer) -> Answer:
    """``answer``, after refusing a message that did not parse."""
    async def run(s: Services, request: Any, model: str | None, record: RequestRecord) -> Any:
        if isinstance(request, Malformed):
            raise InvalidValue(f"the message is not a valid {request.expected}: "
                               f"{request.reason}")
        return await answer(s, request, model, record)

    return run


ANSWER: dict[str, Answer] = {
    "Info": info,
    "Embed": embed, "EmbedStream": embed,
    "EmbedSparse": embed_sparse, "EmbedSparseStream": embed_sparse,
    "EmbedAll": embed_all, "EmbedAllStream": embed_all,
    "Predict": predict, "PredictStream": predict,
    "PredictPair": predict_pair, "PredictPairStream": predict_pair,
    "Rerank": rerank,
    "Tokenize": tokenize, "TokenizeStream": tokenize,
    "Decode": decode, "DecodeStream": decode,
}
ANSWER = {method: checked(answer) for method, answer in ANSWER.items()}


def fill_metadata(reply: Any, request: Any, record: RequestRecord, seconds: float) -> None:
    """TEI's ``Metadata`` of a reply that has one: what was computed and times (ns)."""
    if "metadata" not in reply.DESCRIPTOR.fields_by_name:
        return
    times = record.timings
    texts = [request.query, *request.texts] if hasattr(request, "texts") else (
        [request.inputs] if isinstance(request.inputs, str) else list(request.inputs))
    reply.metadata.compute_chars = sum(len(text) for text in texts)
    reply.metadata.compute_tokens = record.tokens
    reply.metadata.total_time_ns = int(seconds * 1e9)
    reply.metadata.queue_time_ns = int((times.get("ingress-queue", 0.0)
                                        + times.get("pool-queue", 0.0)) * 1e9)
    reply.metadata.inference_time_ns = int(times.get("model", 0.0) * 1e9)
