"""The encoder contract every backend implements.

Encoders are synchronous and thread-safe: a pool runs them on its worker threads, never
on the event loop, and with ``workers`` above 1 several calls on one encoder run at once
(the model runtimes are reentrant; each backend serializes what is not, its tokenizer).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from blitz.errors import InputTooLong, InvalidValue
from blitz.settings.kinds import CAPABILITIES, Capability


@dataclass(frozen=True)
class Encoded:
    """Model output for one call: float32 rows (or scores) and the tokens they used."""

    values: np.ndarray
    token_counts: np.ndarray  # tokens per input after truncation, as billed in `usage`
    padded_tokens: int = 0  # tokens the model computed, padding included
    # where the call's time went, per hop, in seconds (blitz.timing): filled on the way out
    timings: dict[str, float] = field(default_factory=dict, compare=False)
    labels: tuple[str, ...] | None = None  # a classifier's: what each column of values is
    # sparse embeddings: ``values`` are the non-zero weights of every input in turn, at
    # vocabulary ids ``indices``; ``rows`` says how many belong to each input
    indices: np.ndarray | None = None
    rows: np.ndarray | None = None
    # chunk windows (``long_inputs`` chunk, each window asked for): each row's [start, end)
    # character offsets in its text, shape (rows, 2)
    offsets: np.ndarray | None = None
    # a hybrid (bge-m3) model's outputs by name ("dense", "sparse", "colbert"), each as
    # embed, embed_sparse and embed_all give them
    outputs: dict[str, Encoded] | None = None


def stacked(parts: list[Encoded]) -> np.ndarray:
    """The parts' rows as one array, in order (one part: its own)."""
    return parts[0].values if len(parts) == 1 else np.concatenate([p.values for p in parts])


@dataclass(frozen=True)
class MultiVectorReduce:
    """How a request shrinks its multi-vectors: ``pool_factor`` (hierarchical token
    pooling: about 1/pool_factor of a document's vectors kept) and ``muvera`` (MUVERA's
    parameters as a dict: one fixed-size vector per text instead of many)."""

    pool_factor: float | None = None
    muvera: dict[str, Any] | None = None


class TextJob(NamedTuple):
    """One request's texts for ``Encoder.embed_many_sided``."""

    texts: list[str]
    normalize: bool
    truncate: bool
    side: str | None = None  # left | right; None: the model's truncation_side
    long_inputs: str | None = None  # truncate | error | chunk; None: the model's
    each: bool = False  # chunked, with every window's own vector and offsets too


METHODS: dict[Capability, tuple[str, ...]] = {
    "embed": ("embed",), "embed_tokens": ("embed_tokens",), "embed_all": ("embed_all",),
    "embed_sparse": ("embed_sparse",), "embed_hybrid": ("embed_hybrid",),
    "classify": ("classify",), "score": ("score",),
    "embed_images": ("embed_image_bytes", "prepare_images", "embed_prepared"),
    "long_inputs": ("embed_many_sided",), "embed_parts": ("embed_parts",),
    "score_parts": ("score_parts",), "embed_multi": ("embed_multi",),
    "late_chunks": ("embed_late_chunks",)}
"""The encoder methods of each capability (``blitz.settings.kinds.CAPABILITIES``)."""

_REFUSALS: dict[str, tuple[str, str]] = {  # score: Encoder.score, by its vectors
    "embed": ("model {id!r} is a {kind} and cannot embed; use /rerank", "model"),
    "embed_tokens": ("model {id!r} does not take token ids", "input"),
    "embed_all": ("model {id!r} ({kind}, {backend}) does not give per-token embeddings; use "
                  "an embedding model", "model"),
    "embed_images": ("model {id!r} is a {kind} model; images need a dual-encoder (CLIP, "
                     "SigLIP) or a vision-language embedder (vl-embedding)", "model"),
    "embed_sparse": ("model {id!r} is a {kind}, not a sparse model; use a model of kind "
                     "sparse", "model"),
    "embed_hybrid": ("model {id!r} is a {kind}, not a hybrid model; use a model of kind "
                     "hybrid", "model"),
    "classify": ("model {id!r} is a {kind}, not a classifier; use a model of kind "
                 "classifier", "model"),
    "embed_parts": ("model {id!r} is a {kind} model; documents of text and image parts "
                    "need a vision-language embedder (kind vl-embedding)", "model"),
    "score_parts": ("model {id!r} is a {kind} model; documents with images are reranked by "
                    "a vision-language reranker (kind vl-reranker), or by cosine with a "
                    "dual-encoder or vl-embedding model", "model"),
    "embed_multi": ("model {id!r} is a {kind} model; multi-vectors need a late-interaction "
                    "model (kind multi-vector: ColBERT)", "model"),
    "late_chunks": ("model {id!r} is a {kind} model; late chunking needs an embedding model "
                    "(kind embedding)", "model"),
    "long_inputs": ("this model cannot chunk its inputs (it is not a bi-encoder); leave "
                    "long_inputs chunk and return_chunks out", "long_inputs"),
}
_SPARSE_ONLY = ("model {id!r} gives sparse embeddings; use /embed_sparse", "model")


def refusal(encoder: Encoder, capability: Capability) -> InvalidValue:
    """The one refusal of a call ``encoder`` does not answer (a 422 naming the model, or
    the field the call needs): what every encoder says, whatever its kind."""
    message, param = (_SPARSE_ONLY if capability == "embed" and "embed_sparse" in
                      encoder.capabilities else _REFUSALS[capability])
    return InvalidValue(message.format(id=encoder.model_id, kind=encoder.kind,
                                       backend=encoder.backend), param=param)


class Encoder(ABC):
    """A loaded model. ``capabilities`` says which calls it answers (``METHODS``); every
    other call is refused alike (``refusal``): a subclass that does not declare a
    capability gets this class's refusing methods back, whatever it inherits."""

    kind: str = "embedding"
    capabilities: frozenset[Capability] = frozenset()
    device: str = "cpu"
    backend: str = "torch"  # what serves it: a cpu_backend, "fake", or "auto(<winner>)"
    # cpu_backend auto: the winner, its rates, "cached" or "measured", when (blitz/loading/auto.py)
    auto_choice: dict[str, Any] | None = None

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        unknown = set(cls.capabilities) - set(CAPABILITIES)
        if unknown:
            raise TypeError(f"{cls.__name__} declares {sorted(unknown)}: not in CAPABILITIES")
        for capability, names in METHODS.items():
            if capability not in cls.capabilities:
                for name in names:  # what a parent answers, this class may not
                    if getattr(cls, name) is not getattr(Encoder, name):
                        setattr(cls, name, getattr(Encoder, name))

    def __init__(self, model_id: str, max_seq_length: int):
        self.model_id = model_id
        self.max_seq_length = max_seq_length

    @property
    @abstractmethod
    def dimension(self) -> int | None:
        """Embedding size (None for cross-encoders)."""

    def refusal(self, capability: Capability) -> InvalidValue:
        """This encoder's refusal of ``capability`` (``blitz.encoders.base.refusal``)."""
        return refusal(self, capability)

    # ---- the calls: each refuses here, answered where a subclass declares it ----------

    def embed(self, texts: list[str], *, normalize: bool, truncate: bool = True) -> Encoded:
        """Embeddings for ``texts``, float32, shape (len(texts), dimension)."""
        raise self.refusal("embed")

    def embed_tokens(self, ids: list[list[int]], *, normalize: bool,
                     truncate: bool = True) -> Encoded:
        """Embeddings for pre-tokenized inputs (the model's own token ids, no specials)."""
        raise self.refusal("embed_tokens")

    def embed_all(self, texts: list[str], *, truncate: bool = True,
                  long_inputs: str | None = None) -> Encoded:
        """Per-token vectors: ``values`` holds each text's tokens' rows one text after the
        other (special tokens included, no padding), ``token_counts`` how many per text."""
        raise self.refusal("embed_all")

    def embed_image_bytes(self, images: list[bytes], *, normalize: bool) -> Encoded:
        """Encoded images' vectors (a dual encoder's)."""
        raise self.refusal("embed_images")

    def prepare_images(self, images: list[Any]) -> Any:
        """Decoded images (``PIL.Image``) as this model's input, resized and normalized:
        run off the model call's thread (``blitz.pool.image_prep``)."""
        raise self.refusal("embed_images")

    def embed_prepared(self, prepared: Any, *, normalize: bool) -> Encoded:
        """The vectors of ``prepare_images``' output (its rows, in order)."""
        raise self.refusal("embed_images")

    def embed_parts(self, documents: list[tuple], *, normalize: bool,
                    instruction: str | None = None, truncate: bool = True) -> Encoded:
        """One vector per document, a tuple of parts in order: a text (``str``), an encoded
        image (``bytes``) or an image prepared ahead (a vision-language embedder's)."""
        raise self.refusal("embed_parts")

    def score_parts(self, query: tuple, documents: list[tuple], *,
                    instruction: str | None = None, truncate: bool = True) -> Encoded:
        """Each document's score against ``query``, both tuples of parts as for
        ``embed_parts`` (a vision-language reranker's)."""
        raise self.refusal("score_parts")

    def embed_multi(self, texts: list[str], *, query: bool, truncate: bool = True,
                    reduce: MultiVectorReduce | None = None,
                    images: list[Any] | None = None) -> Encoded:
        """A late-interaction model's vectors per text, as a query's (``query``) or a
        document's, or per page (``images``: decoded ahead, ``prepare_part``, a visual
        retriever's): ``values`` each text's rows one text after the other, ``rows`` how many
        per text; with ``reduce`` pooled (``pool_factor``) or one MUVERA vector per text
        (``rows`` None)."""
        raise self.refusal("embed_multi")

    def embed_late_chunks(self, documents: list[list[str]], *, normalize: bool,
                          pooling: str | None = None, truncate: bool = True) -> Encoded:
        """Late chunking: each document (its chunks in order) run once, in windows past the
        model's length, and each chunk's vector pooled from its own tokens (``pooling``:
        mean, max, first, last; None: the model's). ``values`` one row per chunk, ``rows``
        chunks per document."""
        raise self.refusal("late_chunks")

    def embed_sparse(self, texts: list[str], *, truncate: bool = True,
                     long_inputs: str | None = None) -> Encoded:
        """A sparse (SPLADE) model's non-zero vocabulary weights per text (``indices``,
        ``rows`` set)."""
        raise self.refusal("embed_sparse")

    def embed_hybrid(self, texts: list[str], outputs: tuple[str, ...], *,
                     truncate: bool = True) -> Encoded:
        """A hybrid (bge-m3) model's ``outputs`` of ``texts`` from one forward pass."""
        raise self.refusal("embed_hybrid")

    def classify(self, inputs: list[list[str]], *, truncate: bool = True) -> Encoded:
        """A classifier's raw logits per input (one text or a pair), ``labels`` set."""
        raise self.refusal("classify")

    def score(self, query: str, documents: list[str], *, truncate: bool = True) -> Encoded:
        """Relevance of each document to ``query``; embedding models use cosine similarity."""
        encoded = self.embed([query, *documents], normalize=True, truncate=truncate)
        q, docs = encoded.values[0], encoded.values[1:]
        scores = docs @ q
        counts = encoded.token_counts
        return Encoded(scores.astype(np.float32), counts[1:] + counts[0], encoded.padded_tokens)

    def embed_many(self, jobs: list[tuple[list[str], bool, bool]]) -> list[Encoded | Exception]:
        """Embed several requests' ``(texts, normalize, truncate)`` in one go.

        One request's error (an over-long input, say) is returned in its place and does
        not fail the others. Backends override this to share one padded forward pass.
        """
        results: list[Encoded | Exception] = []
        for texts, normalize, truncate in jobs:
            try:
                results.append(self.embed(texts, normalize=normalize, truncate=truncate))
            except Exception as exc:  # handed back to that request alone
                results.append(exc)
        return results

    def embed_many_sided(self, jobs: list[tuple]) -> list[Encoded | Exception]:
        """Several requests' texts (``TextJob``s) in one go, each cut at its own side or
        chunked as it asks: answered by the encoders that declare ``long_inputs``. Here,
        ``embed_many`` of them all, truncating unless a request's ``long_inputs`` is
        error, and a request that asks for windows (chunk, ``each``) refused alone."""
        texts = [TextJob(*job) for job in jobs]
        return [self.refusal("long_inputs") if job.each or job.long_inputs == "chunk"
                else result for job, result in zip(texts, self.embed_many(
                    [(job.texts, job.normalize, job.truncate and job.long_inputs != "error")
                     for job in texts]), strict=True)]

    def warmup(self) -> None:
        """Run one small batch so the first request does not pay for lazy initialisation:
        an embedding, or where the model does not embed, a score."""
        if "embed" in self.capabilities:
            self.embed(["warm up"], normalize=True)
        else:
            self.score("warm up", ["warm up"])

    def calibrate(self) -> None:  # noqa: B027 - backends without micro-batches keep the default
        """Measure what the backend needs to size its micro-batches (once, after loading)."""

    def configure(self, *, max_batch_tokens: int, sparse_token_budget: int,  # noqa: B027
                  images: Any) -> None:
        """The pool's limits, set once after the load: tokens in one model call (the
        memory budget's), a sparse model's cap on them, the ``images:`` settings. Backends
        without such limits keep the default: nothing."""

    def weight_bytes(self) -> int | None:
        """Bytes of the loaded weights: the parameters and buffers of the torch modules it
        holds (or their ``model``); None where it holds none (ONNX, a fake), and the pool
        keeps its estimate from the model's config (``blitz.pool.memory_budget``)."""
        tensors: dict[int, int] = {}
        for value in vars(self).values():
            for module in (value, getattr(value, "model", None)):
                parameters, buffers = (getattr(module, "parameters", None),
                                       getattr(module, "buffers", None))
                if callable(parameters) and callable(buffers):
                    for t in (*parameters(), *buffers()):
                        tensors[id(t)] = t.numel() * t.element_size()
        return sum(tensors.values()) if tensors else None

    def close(self) -> None:  # noqa: B027 - backends without resources keep the default
        """Drop the weights; idempotent."""


def check_lengths(lengths: np.ndarray, limit: int, truncate: bool) -> np.ndarray:
    """Token counts after truncation; with ``truncate=False`` an over-long input is a 413."""
    if not truncate:
        over = np.flatnonzero(lengths > limit)
        if over.size:
            i = int(over[0])
            raise InputTooLong.at(i, int(lengths[i]), limit)
    return np.minimum(lengths, limit)


def by_length(lengths: list[int], budget: int) -> list[list[int]]:
    """Indices of ``lengths`` sorted by length, in consecutive groups whose padded size
    (count x the group's longest) is at most ``budget`` tokens; one longer is a group
    alone. What a decoder's micro-batches hold (padding the least the budget allows)."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    groups: list[list[int]] = []
    start = 0
    while start < len(order):
        end = start + 1  # at least one row per group, however long
        while end < len(order) and (end + 1 - start) * lengths[order[end]] <= budget:
            end += 1
        groups.append(order[start:end])
        start = end
    return groups


def l2_normalize(values: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(values, axis=1, keepdims=True)
    np.maximum(norms, 1e-12, out=norms)
    return values / norms
