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
    RerankHit,
    RerankResult,
    Usage,
    image_units,
)
from blitz.images.decode import in_image_thread
from blitz.images.inputs import SizedImage, image_bytes, jobs_of, sized_images
from blitz.ingress.limits import check_count, check_texts, over
from blitz.ingress.other_outputs import too_many_vectors
from blitz.loading.facts import read_facts, read_json, resolve_source
from blitz.multivector import muvera
from blitz.multivector.muvera import MuveraParams
from blitz.settings.kinds import KINDS
from blitz.settings.registry import ModelSpec, apply_prompt
from blitz.vision_language.retriever import PROMPT_TOKENS
from blitz.vision_language.visual import read_image_shape

if TYPE_CHECKING:
    from blitz.ingress.other_outputs import OutputService
    from blitz.ingress.service import RequestRecord

INPUT_TYPES = ("query", "document")
OTHER_KIND = "multi-vectors take a model of kind multi-vector (ColBERT) or vl-multi-vector"
Images = list[Any]  # each an encoded file: bytes, base64, a data URL or an allowed URL
MAX_POOL_FACTOR = 64.0
MAX_MUVERA_NUMBERS = 65_536  # a MUVERA vector's numbers before any final projection
TOKEN_VECTOR_NUMBERS = 128  # a MUVERA vector counts as its numbers / this token vectors


class LateInteractionService:
    """``embed_multi`` and ``embed_late_chunks`` for HTTP and handle calls, through
    ``outputs``' pipeline (``EmbeddingService.run``) and its token-vector count."""

    def __init__(self, outputs: OutputService):
        self.outputs = outputs
        self.service = outputs.service

    async def embed_multi(self, texts: str | list[str] | None = None,
                          model: str | None = None, *, images: Images | None = None,
                          input_type: str = "document", pool_factor: float | None = None,
                          muvera: bool | dict[str, Any] | None = None,
                          dtype: OutputDtype = "float32", truncate: bool = True,
                          record: RequestRecord | None = None) -> MultiVectorResult:
        """Each text's vectors from a late-interaction (multi-vector) model, as a query's
        or a document's (``input_type``), or each page's (``images``: encoded files,
        base64, data URLs or allowed URLs; a visual retriever's, ColPali, ColQwen2, whose
        texts are queries); a document's pooled to about 1/``pool_factor`` of them
        (hierarchical token pooling), or with ``muvera`` (true: the paper's parameters; or
        a dict of ``k_sim``, ``dim_proj``, ``r_reps``, ``fill_empty_partitions``,
        ``final_dim``, ``seed``) one fixed-size vector per input; each row in ``dtype``
        (binary ones packed 8 per byte)."""
        with self.service.recorded(record, "handle.embed_multi") as record:
            record.model = model or ""
            if input_type not in INPUT_TYPES:
                raise InvalidValue("input_type must be query or document",
                                   param="input_type")
            if (texts is None) == (images is None):
                raise InvalidValue("send texts or images (pages), one of them",
                                   param="texts")
            pages = images is not None
            reduce = MultiVectorReduce(
                check_pool_factor(pool_factor, "document" if pages else input_type),
                muvera_options(muvera))
            limit = self.service.settings.limits.max_token_vectors_per_request
            spec = self.service.spec(model)
            record.model = spec.id
            query = input_type == "query" and not pages
            if images is not None:
                run = await self._pages(spec, images, reduce, record)
            else:
                items = [texts] if isinstance(texts, str) else list(texts or ())
                check_texts(items, self.service.settings.limits, "texts")
                if reduce.muvera is None:  # one vector per token: counted before any work
                    expanded = read_facts(spec).get("query_length") if query else None
                    if isinstance(expanded, int) and len(items) * expanded > limit:
                        raise too_many_vectors(len(items) * expanded, limit)
                    await self.outputs._check_vectors(spec, items)
                else:
                    check_muvera_size(len(items), reduce.muvera, limit)
                record.texts = len(items)
                run = await self.service.run(
                    record, model, lambda _: items,
                    lambda _, chunk: MultiVectorJob(chunk, query, truncate, reduce),
                    serves="embed_multi", other_kind=OTHER_KIND)
            rows: list[np.ndarray] = []
            vectors = 0
            for part in run.parts:
                if part.rows is None:  # MUVERA: one row an input
                    rows += list(quantize(part.values, dtype))
                    continue
                vectors += len(part.values)
                rows += np.split(quantize(part.values, dtype), np.cumsum(part.rows)[:-1])
            if vectors > limit:  # what the ingress could not count (no tokenizer here)
                raise too_many_vectors(vectors, limit)
            dimension = int(run.parts[0].values.shape[1]) if run.parts else 0
            return MultiVectorResult(rows, run.spec.id, Usage.of(record.tokens), dimension,
                                     reduce.muvera is not None, run.pool)

    async def rerank_pages(self, query: str, images: Images, model: str | None = None, *,
                           top_n: int | None = None,
                           record: RequestRecord | None = None) -> RerankResult:
        """Pages (``images``) scored against the text ``query`` by MaxSim, best first: a
        visual retriever's (ColPali, ColQwen2) query vectors against each page's."""
        with self.service.recorded(record, "handle.rerank_pages") as record:
            if not isinstance(query, str):
                raise InvalidValue("the query must be a text", param="query")
            if top_n is not None and top_n < 1:
                raise InvalidValue("top_n must be at least 1", param="top_n")
            pages = await self.embed_multi(model=model, images=images, record=record)
            asked = await self.embed_multi([query], model=pages.model, input_type="query",
                                           record=record)
            scores = muvera.maxsim(asked.embeddings[0], pages.embeddings).astype(np.float32)
            order = np.argsort(-scores, kind="stable")[: top_n or len(scores)]
            return RerankResult([RerankHit(int(i), float(scores[i])) for i in order],
                                pages.model, Usage.of(pages.usage.total_tokens
                                                      + asked.usage.total_tokens), pages.pool)

    async def _pages(self, spec: ModelSpec, images: Images, reduce: MultiVectorReduce,
                     record: RequestRecord) -> Any:
        """Pages through the pipeline: the model's kind, the images' headers and pixels,
        their vectors counted from their declared sizes, all before any model work."""
        row = KINDS[spec.kind]
        if not (row.cost.pixels and "embed_multi" in row.serves):
            raise InvalidValue(f"model {spec.id!r} is a {spec.kind}; pages (images) need a "
                               "model of kind vl-multi-vector (ColPali, ColQwen2)",
                               param="images" if "embed_multi" in row.serves else "model")
        limits = self.service.settings.images
        data = await image_bytes(images, limits)
        sized = await in_image_thread(sized_images, data, limits, param="images",
                                      timeout_s=limits.decode_timeout_s, what="check")
        record.images = len(sized)
        budget = self.service.settings.limits.max_token_vectors_per_request
        if reduce.muvera is not None:
            check_muvera_size(len(sized), reduce.muvera, budget)
        else:
            counted = page_vectors(spec, sized)
            if counted is not None and counted > budget:
                raise too_many_vectors(counted, budget)

        def job(_: ModelSpec, chunk: list[SizedImage]) -> MultiVectorJob:
            pixels = sum(image.pixels for image in chunk)
            return MultiVectorJob([], False, True, reduce, images=[i.data for i in chunk],
                                  pixels=pixels, first=chunk[0].index,
                                  units=image_units(len(chunk), pixels))

        return await self.service.run(
            record, spec.id, lambda _: sized, job, serves="embed_multi",
            other_kind=OTHER_KIND,
            split=lambda items, size: jobs_of(items, size, limits.max_job_bytes,
                                              limits.max_job_pixels))

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


def page_vectors(spec: ModelSpec, sized: list[SizedImage]) -> int | None:
    """The vectors ``sized`` pages give at most (their image tokens by the model's resize
    rule, from their declared sizes, and their prompts'), read from the folder's
    ``preprocessor_config.json``; None where the files are not on this machine."""
    if spec.is_fake or not spec.location().is_local:
        return None
    path = resolve_source(spec)
    config = read_json(path / "preprocessor_config.json") or {}
    size = config.get("size") or {}
    if size.get("height") and size.get("width"):  # ColPali: every page alike
        patch = int(config.get("patch_size") or 14)
        per = int(config.get("image_seq_length")
                  or (int(size["height"]) // patch) * (int(size["width"]) // patch))
        return len(sized) * (per + PROMPT_TOKENS)
    shape = read_image_shape(path)
    return sum(shape.tokens(*image.size) + PROMPT_TOKENS for image in sized)


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
