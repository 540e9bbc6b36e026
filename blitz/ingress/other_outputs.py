"""A model's other outputs, beside its sentence embedding: per-token vectors
(``/embed_all``, Hugging Face TEI's shape, for late-interaction retrieval), a sparse
model's vocabulary weights (``/embed_sparse``, TEI's shape, for hybrid search) and a
classifier's label scores (``/predict``, TEI's shape; ``/classify``, Infinity's), and
the similarity of one text to others (``/similarity``, TEI's).

Each runs as a job of its own kind (``blitz.hop_messages``) through the same queue, pool and
batcher as embeddings, routed and limited by the same rules, and answered one result per
text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from blitz.errors import InvalidValue, PayloadTooLarge
from blitz.hop_messages import (
    ClassifyJob,
    ClassifyResult,
    HybridEmbedJob,
    HybridResult,
    Prediction,
    SimilarityResult,
    SparseEmbedJob,
    SparseResult,
    SparseVector,
    TokenEmbeddingsResult,
    TokenEmbedJob,
    Usage,
)
from blitz.ingress.limits import KIND_COSTS, check_count, check_texts, over
from blitz.ingress.long_inputs import check_long_inputs, chunked
from blitz.ingress.tokenizing import TokenService, count_tokens, off_loop
from blitz.loading.facts import read_facts
from blitz.settings.registry import ModelSpec, apply_prompt

if TYPE_CHECKING:
    from blitz.ingress.service import EmbeddingService, RequestRecord

HYBRID_OUTPUTS = ("dense", "sparse", "colbert")  # /embed_hybrid's, in reply order
ALL_UNCHUNKED = ("/embed_all answers one vector per token, and overlapping windows would "
                 "give some tokens two")


class OutputService:
    """``embed_all``, ``embed_sparse``, ``embed_hybrid``, ``similarity`` and ``classify``
    for HTTP, gRPC and handle calls: each
    checks its inputs against the limits, then runs them through ``service``'s pipeline
    (``EmbeddingService.run``: the model's kind, routing, jobs of the pool's batch size)."""

    def __init__(self, service: EmbeddingService, tokens: TokenService):
        self.service = service
        # the models' tokenizers on the ingress (shared with /tokenize): they count an
        # /embed_all request's token vectors before any model work
        self.tokens = tokens
        self._longest: dict[str, int | None] = {}  # model id -> its max input length

    def forget(self, model_id: str) -> None:
        """Drop what is known of ``model_id`` (the admin API changed or removed it)."""
        self._longest.pop(model_id, None)
        self.tokens.tokenizers.forget(model_id)
        self.service.forget(model_id)

    def _texts(self, texts: str | list[str], model: str | None,
               prompt_name: str | None) -> list[str]:
        """``texts`` checked against the limits, behind the model's prompt if named."""
        items = [texts] if isinstance(texts, str) else list(texts or ())
        check_texts(items, self.service.settings.limits)
        return apply_prompt(self.service.spec(model), items, prompt_name)

    async def embed_all(self, texts: str | list[str], model: str | None = None, *,
                        truncate: bool = True, prompt_name: str | None = None,
                        long_inputs: str | None = None,
                        record: RequestRecord | None = None) -> TokenEmbeddingsResult:
        """Each text's token vectors (special tokens included, no padding) from an
        embedding model's last layer before pooling; ``long_inputs`` truncate or error
        (chunk is refused: overlapping windows would give some tokens two vectors)."""
        with self.service.recorded(record, "handle.embed_all") as record:
            record.model = model or ""
            check_long_inputs(long_inputs, chunks_here=ALL_UNCHUNKED)
            items = self._texts(texts, model, prompt_name)
            await self._check_vectors(self.service.spec(model), items)
            record.texts = len(items)
            spec, pool, parts = await self.service.run(
                record, model, lambda _: items,
                lambda _, chunk: TokenEmbedJob(chunk, truncate, long_inputs),
                serves="embed_all",
                other_kind="/embed_all takes a model of kind embedding or hybrid")
            limit = self.service.settings.limits.max_token_vectors_per_request
            if record.tokens > limit:  # what the ingress could not count (no tokenizer here)
                raise too_many_vectors(record.tokens, limit)
            rows: list[np.ndarray] = []
            for part in parts:
                rows += np.split(part.values, np.cumsum(part.token_counts)[:-1])
            return TokenEmbeddingsResult(rows, spec.id, Usage.of(record.tokens), pool)

    async def _check_vectors(self, spec: ModelSpec, items: list[str]) -> None:
        """413 before any model work when ``items`` give more token vectors than
        ``limits.max_token_vectors_per_request``: none to count when every text at the
        model's max input length fits; else counted with the model's tokenizer on the
        ingress, stopping past the limit. A model whose files are not on this machine (or
        a fake one) is counted from the pool's reply instead."""
        limit = self.service.settings.limits.max_token_vectors_per_request
        if not KIND_COSTS[spec.kind].token_vectors or spec.is_fake or (
                not spec.location().is_local):
            return
        if spec.id not in self._longest:
            longest = read_facts(spec).get("max_input_length")
            self._longest[spec.id] = longest if isinstance(longest, int) else None
        longest = self._longest[spec.id]
        if longest is not None and len(items) * longest <= limit:
            return
        tokenizer = await self.tokens.tokenizer(spec)
        counted = await off_loop(lambda: count_tokens(tokenizer, items, longest, limit),
                                 sum(map(len, items)))
        if counted > limit:
            raise too_many_vectors(counted, limit, counted_all=False)

    async def embed_sparse(self, texts: str | list[str], model: str | None = None, *,
                           truncate: bool = True, prompt_name: str | None = None,
                           long_inputs: str | None = None,
                           record: RequestRecord | None = None) -> SparseResult:
        """Each text's non-zero vocabulary weights from a sparse (SPLADE) model; chunked
        (``long_inputs`` chunk), each weight its largest over the text's windows."""
        with self.service.recorded(record, "handle.embed_sparse") as record:
            record.model = model or ""
            check_long_inputs(long_inputs)
            items = self._texts(texts, model, prompt_name)
            record.texts = len(items)
            limits = self.service.settings.limits

            async def cost(spec: ModelSpec, items: list[str]) -> list[int] | None:
                return (await self.service.windows.units(spec, items, limits)
                        if chunked(spec, long_inputs, False) else None)

            spec, pool, parts = await self.service.run(
                record, model, lambda _: items,
                lambda _, chunk: SparseEmbedJob(chunk, truncate, long_inputs),
                serves="embed_sparse", cost=cost,
                other_kind="/embed_sparse takes a model of kind sparse or hybrid")
            vectors: list[SparseVector] = []
            for part in parts:
                assert part.indices is not None and part.rows is not None
                ends = np.cumsum(part.rows)[:-1]
                vectors += [SparseVector(i, v) for i, v in zip(
                    np.split(part.indices, ends), np.split(part.values, ends), strict=True)]
            return SparseResult(vectors, self.service.dimension_of(spec), spec.id,
                                Usage.of(record.tokens), pool)

    async def embed_hybrid(self, texts: str | list[str], model: str | None = None, *,
                           outputs: tuple[str, ...] = HYBRID_OUTPUTS, truncate: bool = True,
                           prompt_name: str | None = None,
                           record: RequestRecord | None = None) -> HybridResult:
        """A hybrid (bge-m3) model's ``outputs`` per text, all from one forward pass."""
        with self.service.recorded(record, "handle.embed_hybrid") as record:
            record.model = model or ""
            items = self._texts(texts, model, prompt_name)
            if "colbert" in outputs:  # one vector per token: counted before any model work
                await self._check_vectors(self.service.spec(model), items)
            record.texts = len(items)
            spec, pool, parts = await self.service.run(
                record, model, lambda _: items,
                lambda _, chunk: HybridEmbedJob(chunk, outputs, truncate),
                serves="embed_hybrid", other_kind="/embed_hybrid takes a model of kind hybrid")
            found: dict[str, list] = {name: [] for name in outputs}
            for part in parts:
                assert part.outputs is not None
                for name, out in part.outputs.items():
                    if name == "dense":
                        found[name] += list(out.values)
                    elif name == "colbert":
                        found[name] += np.split(out.values, np.cumsum(out.token_counts)[:-1])
                    else:
                        assert out.indices is not None and out.rows is not None
                        ends = np.cumsum(out.rows)[:-1]
                        found[name] += [SparseVector(i, v) for i, v in zip(
                            np.split(out.indices, ends), np.split(out.values, ends),
                            strict=True)]
            limit = self.service.settings.limits.max_token_vectors_per_request
            if "colbert" in outputs and record.tokens > limit:  # not countable before
                raise too_many_vectors(record.tokens, limit)
            return HybridResult(found.get("dense"), found.get("sparse"), found.get("colbert"),
                                None, spec.id, Usage.of(record.tokens), pool)

    async def similarity(self, source: str, sentences: list[str],
                         model: str | None = None, *, truncate: bool = True,
                         prompt_name: str | None = None,
                         record: RequestRecord | None = None) -> SimilarityResult:
        """The cosine similarity of ``source`` to each of ``sentences`` (TEI's
        ``/similarity``): one embedding call for all of them, unit vectors dotted."""
        with self.service.recorded(record, "handle.similarity") as record:
            if not isinstance(sentences, list) or not sentences:
                raise InvalidValue("sentences must hold at least one text", param="sentences")
            result = await self.service.embed([source, *sentences], model=model,
                                              normalize=True, truncate=truncate,
                                              prompt_name=prompt_name, record=record)
            rows = result.embeddings
            scores = (rows[1:] @ rows[0]).astype(np.float32)
            return SimilarityResult([float(x) for x in scores], result.model, result.usage,
                                    result.pool)

    async def classify(self, inputs: str | list[str] | list[list[str]],
                       model: str | None = None, *, raw_scores: bool = False,
                       top_k: int | None = None, truncate: bool = True,
                       record: RequestRecord | None = None) -> ClassifyResult:
        """Each input's (a text, or a ``[text, text]`` pair) label scores, best first:
        softmax over the labels (a sigmoid for a one-label model), or the raw logits."""
        service = self.service
        with service.recorded(record, "handle.classify") as record:
            record.model = model or ""
            items = _classify_inputs(inputs)
            limits = service.settings.limits
            check_count(len(items), limits, "inputs", "inputs")
            check_texts([text for item in items for text in item], limits, "inputs")
            if top_k is not None and top_k < 1:
                raise InvalidValue("top_k must be at least 1", param="top_k")
            record.texts = len(items)
            spec, pool, parts = await service.run(
                record, model, lambda _: items, lambda _, chunk: ClassifyJob(chunk, truncate),
                serves="classify", other_kind="/predict and /classify takes a model of kind "
                "classifier")
            logits = np.concatenate([p.values for p in parts])
            labels = parts[0].labels or tuple(f"LABEL_{i}" for i in range(logits.shape[1]))
            scores = logits if raw_scores else probabilities(logits)
            order = np.argsort(-scores, axis=1, kind="stable")[:, :top_k]
            predictions = [[Prediction(float(row[j]), labels[j]) for j in ranks]
                           for row, ranks in zip(scores, order, strict=True)]
            return ClassifyResult(predictions, spec.id, Usage.of(record.tokens), pool)


def too_many_vectors(count: int, limit: int, counted_all: bool = True) -> PayloadTooLarge:
    return over("max_token_vectors_per_request", f"the texts give "
                f"{'' if counted_all else 'at least '}{count} token vectors", limit, "texts")


def probabilities(logits: np.ndarray) -> np.ndarray:
    """Softmax over the labels; a sigmoid for a one-label model (as TEI and transformers'
    text-classification pipeline do)."""
    logits = logits.astype(np.float64)
    if logits.shape[1] == 1:
        return (1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return (shifted / shifted.sum(axis=1, keepdims=True)).astype(np.float32)


def _classify_inputs(inputs: object) -> list[list[str]]:
    """Inputs as a list of one-text or two-text lists: a string is one input, a list of
    strings one input each, a list of lists (one text or a pair each) as given."""
    if isinstance(inputs, str):
        return [[inputs]]
    if isinstance(inputs, list) and inputs and all(isinstance(i, str) for i in inputs):
        return [[text] for text in inputs]
    if (isinstance(inputs, list) and inputs and all(
            isinstance(i, list) and len(i) in (1, 2) and all(isinstance(t, str) for t in i)
            for i in inputs)):
        return [list(i) for i in inputs]
    raise InvalidValue("inputs must be a text, a list of texts, or a list of [text] and "
                       "[text, text] pairs", param="inputs")
