"""What a model's per-token vectors give beyond one vector per text: a late-interaction
model's multi-vectors (``embed_multi``: ColBERT; pooled, as one MUVERA vector, in any
dtype) and a document's chunks embedded in its context (``embed_late_chunks``: late
chunking, Jina's ``late_chunking`` and Voyage's contextualized embeddings).

Both count their work before any model runs: a multi-vector request its vectors against
``limits.max_token_vectors_per_request`` (``OutputService``'s count, the model's length per
text, else its tokenizer), a late-chunking request its documents' windows against
``limits.max_windows_per_request`` (each document runs once, in windows when longer than
the model), its chunks against ``max_texts_per_request``.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import numpy as np

from blitz.encoders.base import MultiVectorReduce
from blitz.encoders.bi_encoder import LATE_POOLING
from blitz.encoders.postprocess import OutputDtype, quantize, truncate_dimensions
from blitz.errors import InvalidValue
from blitz.hop_messages import (
    ChunkedEmbedResult,
    LateChunkJob,
    MultiVectorJob,
    MultiVectorResult,
    Usage,
)
from blitz.ingress.limits import check_count, check_texts, over
from blitz.ingress.other_outputs import too_many_vectors
from blitz.loading.facts import read_facts
from blitz.multivector.muvera import MuveraParams
from blitz.settings.registry import ModelSpec, apply_prompt

if TYPE_CHECKING:
    from blitz.ingress.other_outputs import OutputService
    from blitz.ingress.service import RequestRecord

INPUT_TYPES = ("query", "document")
MAX_POOL_FACTOR = 64.0
MAX_MUVERA_NUMBERS = 65_536  # a MUVERA vector's numbers before any final projection
TOKEN_VECTOR_NUMBERS = 128  # a MUVERA vector counts as its numbers / this token vectors


class LateInteractionService:
    """``embed_multi`` and ``embed_late_chunks`` for HTTP and handle calls, through
    ``outputs``' pipeline (``EmbeddingService.run``) and its token-vector count."""

    def __init__(self, outputs: OutputService):
        self.outputs = outputs
        self.service = outputs.service

    async def embed_multi(self, texts: str | list[str], model: str | None = None, *,
                          input_type: str = "document", pool_factor: float | None = None,
                          muvera: bool | dict[str, Any] | None = None,
                          dtype: OutputDtype = "float32", truncate: bool = True,
                          record: RequestRecord | None = None) -> MultiVectorResult:
        """Each text's vectors from a late-interaction (multi-vector) model, as a query's
        or a document's (``input_type``); a document's pooled to about 1/``pool_factor``
        of them (hierarchical token pooling), or with ``muvera`` (true: the paper's
        parameters; or a dict of ``k_sim``, ``dim_proj``, ``r_reps``,
        ``fill_empty_partitions``, ``final_dim``, ``seed``) one fixed-size vector per text;
        each row in ``dtype`` (binary ones packed 8 per byte)."""
        with self.service.recorded(record, "handle.embed_multi") as record:
            record.model = model or ""
            if input_type not in INPUT_TYPES:
                raise InvalidValue("input_type must be query or document",
                                   param="input_type")
            reduce = MultiVectorReduce(check_pool_factor(pool_factor, input_type),
                                       muvera_options(muvera))
            items = [texts] if isinstance(texts, str) else list(texts or ())
            check_texts(items, self.service.settings.limits, "input")
            spec = self.service.spec(model)
            limit = self.service.settings.limits.max_token_vectors_per_request
            if reduce.muvera is None:  # one vector per token: counted before any work
                expanded = read_facts(spec).get("query_length") if (
                    input_type == "query") else None
                if isinstance(expanded, int) and len(items) * expanded > limit:
                    raise too_many_vectors(len(items) * expanded, limit)
                await self.outputs._check_vectors(spec, items)
            else:
                check_muvera_size(len(items), reduce.muvera, limit)
            record.texts = len(items)
            query = input_type == "query"
            spec, pool, parts = await self.service.run(
                record, model, lambda _: items,
                lambda _, chunk: MultiVectorJob(chunk, query, truncate, reduce),
                serves="embed_multi", other_kind="multi-vectors take a model of kind "
                "multi-vector (ColBERT)")
            rows: list[np.ndarray] = []
            vectors = 0
            for part in parts:
                if part.rows is None:  # MUVERA: one row a text
                    rows += list(quantize(part.values, dtype))
                    continue
                vectors += len(part.values)
                values = quantize(part.values, dtype)
                rows += np.split(values, np.cumsum(part.rows)[:-1])
            if vectors > limit:  # what the ingress could not count (no tokenizer here)
                raise too_many_vectors(vectors, limit)
            dimension = int(parts[0].values.shape[1]) if parts else 0
            return MultiVectorResult(rows, spec.id, Usage.of(record.tokens), dimension,
                                     reduce.muvera is not None, pool)

    async def embed_late_chunks(self, documents: list[list[str]], model: str | None = None,
                                *, normalize: bool = True, pooling: str | None = None,
                                dimensions: int | None = None,
                                dtype: OutputDtype = "float32", prompt_name: str | None = None,
                                truncate: bool = True,
                                record: RequestRecord | None = None) -> ChunkedEmbedResult:
        """Late chunking: each document (a list of its chunks, in order) runs through an
        embedding model once (in windows past the model's length), and each chunk's vector
        is pooled from its own tokens (``pooling``: mean, max, first, last; None: the
        model's own), so every chunk's vector sees the whole document. One row per chunk,
        per document; ``dimensions`` (Matryoshka) and ``dtype`` as for ``embed``. A
        ``prompt_name`` of the model's goes before each document's first chunk."""
        service = self.service
        with service.recorded(record, "handle.embed_late_chunks") as record:
            record.model = model or ""
            docs = check_documents(documents, service.settings.limits)
            if pooling is not None and pooling not in LATE_POOLING:
                raise InvalidValue(f"pooling must be one of {', '.join(LATE_POOLING)} (or "
                                   "left out: the model's own)", param="pooling")
            spec = service.spec(model)
            if prompt_name is not None:
                docs = [[apply_prompt(spec, doc[:1], prompt_name)[0], *doc[1:]]
                        for doc in docs]
            record.texts = sum(map(len, docs))
            limits = service.settings.limits

            async def cost(spec: ModelSpec, items: list[tuple[str, ...]]) -> list[int]:
                return await service.windows.units(spec, ["".join(doc) for doc in items],
                                                   limits)

            spec, pool, parts = await service.run(  # tuples: the budget keys on them
                record, model, lambda _: [tuple(doc) for doc in docs],
                lambda _, chunk: LateChunkJob([list(doc) for doc in chunk], normalize,
                                              pooling, truncate),
                serves="late_chunks", cost=cost,
                other_kind="late chunking takes a model of kind embedding")
            out: list[np.ndarray] = []
            for part in parts:
                assert part.rows is not None
                values = quantize(truncate_dimensions(part.values, dimensions, normalize),
                                  dtype)
                out += np.split(values, np.cumsum(part.rows)[:-1])
            return ChunkedEmbedResult(out, spec.id, Usage.of(record.tokens), pool)


def check_documents(documents: object, limits: Any) -> list[list[str]]:
    """``documents`` as lists of chunks: at least one document, each at least one chunk,
    every chunk a non-blank text within the text limits, all chunks together at most
    ``max_texts_per_request``."""
    if not isinstance(documents, list) or not documents or not all(
            isinstance(doc, list) and doc for doc in documents):
        raise InvalidValue("inputs must be a list of documents, each a non-empty list of "
                           "its chunks (texts), in order", param="input")
    check_count(sum(map(len, documents)), limits, "chunks", "input")
    for doc in documents:
        check_texts(doc, limits, "input")
    return [list(doc) for doc in documents]


def check_pool_factor(pool_factor: float | None, input_type: str) -> float | None:
    """``pool_factor`` as asked: a number from 1 (no pooling) to ``MAX_POOL_FACTOR``, for
    documents."""
    if pool_factor is None:
        return None
    if isinstance(pool_factor, bool) or not isinstance(pool_factor, (int, float)) or not (
            1 <= pool_factor <= MAX_POOL_FACTOR):
        raise InvalidValue(f"pool_factor must be a number from 1 to {MAX_POOL_FACTOR:g} "
                           "(about 1/pool_factor of a document's vectors kept)",
                           param="pool_factor")
    if input_type == "query" and pool_factor > 1:
        raise InvalidValue("pool_factor pools a document's vectors; a query's are kept "
                           "whole (leave pool_factor out with input_type query)",
                           param="pool_factor")
    return float(pool_factor) if pool_factor > 1 else None


def muvera_options(muvera: bool | dict[str, Any] | None) -> dict[str, Any] | None:
    """``muvera`` as asked (true: the defaults; a dict of ``MuveraParams``' fields),
    checked; None when not asked."""
    if muvera is None or muvera is False:
        return None
    if muvera is True:
        return asdict(MuveraParams())
    if not isinstance(muvera, dict):
        raise InvalidValue("muvera must be true or an object of k_sim, dim_proj, r_reps, "
                           "fill_empty_partitions, final_dim, seed", param="muvera")
    fields = set(MuveraParams.__dataclass_fields__)
    unknown = sorted(set(muvera) - fields)
    if unknown:
        raise InvalidValue(f"muvera has unknown fields {unknown}; it takes "
                           f"{', '.join(sorted(fields))}", param="muvera")
    try:
        params = MuveraParams(**muvera)
        params.check()
    except (TypeError, ValueError) as exc:
        raise InvalidValue(f"muvera: {exc}", param="muvera") from None
    if params.num_partitions * params.dim_proj * params.r_reps > MAX_MUVERA_NUMBERS:
        raise InvalidValue(f"muvera: 2**k_sim x dim_proj x r_reps is over "
                           f"{MAX_MUVERA_NUMBERS} numbers per text; lower one of them",
                           param="muvera")
    return asdict(params)


def check_muvera_size(texts: int, options: dict[str, Any], limit: int) -> None:
    """413 when ``texts`` MUVERA vectors hold more numbers than ``limit`` token vectors of
    ``TOKEN_VECTOR_NUMBERS`` each (``limits.max_token_vectors_per_request``)."""
    params = MuveraParams(**options)
    numbers = params.final_dim or params.num_partitions * params.dim_proj * params.r_reps
    if texts * numbers > limit * TOKEN_VECTOR_NUMBERS:
        raise over("max_token_vectors_per_request", f"{texts} MUVERA vectors of {numbers} "
                   f"numbers count as {-(-texts * numbers // TOKEN_VECTOR_NUMBERS)} token "
                   f"vectors of {TOKEN_VECTOR_NUMBERS}", limit, "input")
