"""The encoder contract every backend implements.

Encoders are synchronous and thread-safe: a pool runs them on its worker threads, never
on the event loop, and with ``workers`` above 1 several calls on one encoder run at once
(the model runtimes are reentrant; each backend serializes what is not, its tokenizer).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from blitz.errors import InputTooLong, InvalidValue


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


class Encoder(ABC):
    """A loaded model. ``kind`` says which of ``embed`` and ``score`` it answers."""

    kind: str = "embedding"
    device: str = "cpu"
    backend: str = "torch"  # what serves it: a cpu_backend, "fake", or "auto(<winner>)"
    # cpu_backend auto: the winner, its rates, "cached" or "measured", when (blitz/loading/auto.py)
    auto_choice: dict[str, Any] | None = None

    def __init__(self, model_id: str, max_seq_length: int):
        self.model_id = model_id
        self.max_seq_length = max_seq_length

    @property
    @abstractmethod
    def dimension(self) -> int | None:
        """Embedding size (None for cross-encoders)."""

    def embed(self, texts: list[str], *, normalize: bool, truncate: bool = True) -> Encoded:
        """Embeddings for ``texts``, float32, shape (len(texts), dimension)."""
        raise InvalidValue(
            f"model {self.model_id!r} is a {self.kind} and cannot embed; use /rerank",
            param="model",
        )

    def embed_tokens(self, ids: list[list[int]], *, normalize: bool,
                     truncate: bool = True) -> Encoded:
        """Embeddings for pre-tokenized inputs (the model's own token ids, no specials)."""
        raise InvalidValue(
            f"model {self.model_id!r} does not take token ids", param="input")

    def embed_all(self, texts: list[str], *, truncate: bool = True) -> Encoded:
        """Per-token vectors: ``values`` holds each text's tokens' rows one text after the
        other (special tokens included, no padding), ``token_counts`` how many per text."""
        raise InvalidValue(
            f"model {self.model_id!r} ({self.kind}, {self.backend}) does not give per-token "
            "embeddings; use an embedding model", param="model")

    def embed_image_bytes(self, images: list[bytes], *, normalize: bool) -> Encoded:
        """Encoded images' vectors (a dual encoder's); other kinds refuse."""
        raise self._no_images()

    def prepare_images(self, images: list[Any]) -> Any:
        """Decoded images (``PIL.Image``) as this model's input, resized and normalized:
        run off the model call's thread (``blitz.pool.image_prep``); other kinds refuse."""
        raise self._no_images()

    def embed_prepared(self, prepared: Any, *, normalize: bool) -> Encoded:
        """The vectors of ``prepare_images``' output (its rows, in order)."""
        raise self._no_images()

    def _no_images(self) -> InvalidValue:
        return InvalidValue(f"model {self.model_id!r} is a {self.kind} model; images need a "
                            "dual-encoder (CLIP, SigLIP)", param="model")

    def embed_sparse(self, texts: list[str], *, truncate: bool = True) -> Encoded:
        """A sparse (SPLADE) model's non-zero vocabulary weights per text (``indices``,
        ``rows`` set)."""
        raise InvalidValue(f"model {self.model_id!r} is a {self.kind}, not a sparse model; "
                           "use a model of kind sparse", param="model")

    def embed_hybrid(self, texts: list[str], outputs: tuple[str, ...], *,
                     truncate: bool = True) -> Encoded:
        """A hybrid (bge-m3) model's ``outputs`` of ``texts`` from one forward pass."""
        raise InvalidValue(f"model {self.model_id!r} is a {self.kind}, not a hybrid model; "
                           "use a model of kind hybrid", param="model")

    def classify(self, inputs: list[list[str]], *, truncate: bool = True) -> Encoded:
        """A classifier's raw logits per input (one text or a pair), ``labels`` set."""
        raise InvalidValue(f"model {self.model_id!r} is a {self.kind}, not a classifier; "
                           "use a model of kind classifier", param="model")

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

    def warmup(self) -> None:
        """Run one small batch so the first request does not pay for lazy initialisation."""
        if self.kind == "embedding":
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


def l2_normalize(values: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(values, axis=1, keepdims=True)
    np.maximum(norms, 1e-12, out=norms)
    return values / norms
