"""A deterministic fake encoder: API and routing tests without a model."""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import time
from typing import Any

import numpy as np

from blitz.encoders.base import (
    Encoded,
    Encoder,
    MultiVectorReduce,
    check_lengths,
    l2_normalize,
)
from blitz.multivector import muvera
from blitz.settings.kinds import KINDS


class FakeEncoder(Encoder):
    """Hash-seeded vectors; tokens are whitespace-separated words plus two specials.

    ``batch_s`` makes each batch (``embed_many``) take that long, like a busy model: it
    blocks the calling thread, which in a pool is the worker thread, never the event loop,
    and releases the GIL meanwhile. ``batches_at_once`` makes it a device: at most that
    many of those delays run at once (1: a GPU-like stand-in, one batch on the device at a
    time whatever its size up to the pool's batch limit; the vectors are made on the
    calling thread first, as a real model tokenizes before its device runs).
    """

    backend = "fake"
    capabilities = frozenset({"embed", "embed_tokens", "embed_sparse", "classify", "score",
                              "embed_images", "embed_multi", "late_chunks"})
    """What a fake of any kind answers; images, multi-vectors and late chunking only where
    its kind does."""

    def __init__(self, model_id: str, dimension: int, max_seq_length: int = 128,
                 batch_s: float = 0.0, batches_at_once: int | None = None,
                 kind: str = "embedding"):
        super().__init__(model_id, max_seq_length)
        self.kind = kind
        self.capabilities = type(self).capabilities - (
            {"embed_images", "embed_multi", "late_chunks"} - KINDS[kind].capabilities)
        self._dimension = dimension
        self._batch_s = batch_s
        self._device = (threading.BoundedSemaphore(batches_at_once)
                        if batches_at_once is not None else None)

    @property
    def dimension(self) -> int:
        return self._dimension

    def _vector(self, text: str) -> np.ndarray:
        seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
        return np.random.default_rng(seed).standard_normal(self._dimension).astype(np.float32)

    def embed(self, texts: list[str], *, normalize: bool, truncate: bool = True) -> Encoded:
        lengths = np.array([len(t.split()) + 2 for t in texts], dtype=np.int64)
        counts = check_lengths(lengths, self.max_seq_length, truncate)
        values = np.stack([self._vector(t) for t in texts]) if texts else np.zeros(
            (0, self._dimension), np.float32)
        if normalize and len(texts):
            values = l2_normalize(values)
        return Encoded(values.astype(np.float32), counts, int(counts.sum()))

    def prepare_images(self, images: list[Any]) -> Any:
        """A fake dual encoder's "pixels": each image's size and pixels, hashed."""
        if "embed_images" not in self.capabilities:
            raise self.refusal("embed_images")
        return [f"image:{i.size}:{hashlib.sha256(i.tobytes()).hexdigest()}" for i in images]

    def prepare_part(self, picture: Any) -> str:
        """A fake page's (or part's) model input: its size and pixels, hashed."""
        return f"image:{picture.size}:{hashlib.sha256(picture.tobytes()).hexdigest()}"

    def embed_prepared(self, prepared: Any, *, normalize: bool) -> Encoded:
        values = np.stack([self._vector(key) for key in prepared])
        counts = np.zeros(len(prepared), dtype=np.int64)
        return Encoded(l2_normalize(values) if normalize else values, counts)

    def embed_many(self, jobs: list[tuple[list[str], bool, bool]]) -> list[Encoded | Exception]:
        if self._device is None:
            if self._batch_s:
                time.sleep(self._batch_s)
            return super().embed_many(jobs)
        results = super().embed_many(jobs)
        with self._device:
            time.sleep(self._batch_s)
        return results

    def embed_multi(self, texts: list[str], *, query: bool, truncate: bool = True,
                    reduce: MultiVectorReduce | None = None,
                    images: list[Any] | None = None) -> Encoded:
        """As a late-interaction model: one unit vector per word plus two (a query's
        padded to 8), hash-seeded; ``reduce`` as a real one does it (MUVERA; pooling keeps
        every ``pool_factor``-th vector)."""
        if "embed_multi" not in self.capabilities:
            raise self.refusal("embed_multi")
        texts = [f"page {key}" for key in images] if images else texts
        counts = check_lengths(np.array([len(t.split()) + 2 for t in texts], np.int64),
                               self.max_seq_length, truncate)
        rows = []
        for text, count in zip(texts, counts, strict=True):
            words = ["[CLS]", *text.split()[:int(count) - 2], "[SEP]"]
            words += ["[MASK]"] * (max(8 - len(words), 0) if query else 0)
            rows.append(l2_normalize(np.stack([self._vector(f"{text}|{i}|{w}")
                                               for i, w in enumerate(words)])))
        reduce = reduce or MultiVectorReduce()
        if reduce.pool_factor and not query:
            rows = [r[::max(int(reduce.pool_factor), 1)] for r in rows]
        if reduce.muvera is not None:
            params = muvera.MuveraParams(**reduce.muvera)
            encode = muvera.encode_query if query else muvera.encode_document
            return Encoded(np.stack([encode(r, params) for r in rows]).astype(np.float32),
                           counts, int(counts.sum()))
        return Encoded(np.concatenate(rows).astype(np.float32), counts, int(counts.sum()),
                       rows=np.array([len(r) for r in rows], np.int64))

    def embed_late_chunks(self, documents: list[list[str]], *, normalize: bool,
                          pooling: str | None = None, truncate: bool = True) -> Encoded:
        """As an embedding model late-chunking: each chunk's vector seeded by its document
        and its place in it."""
        if "late_chunks" not in self.capabilities:
            raise self.refusal("late_chunks")
        rows = [self._vector(f"{'|'.join(doc)}#{j}#{pooling}") for doc in documents
                for j in range(len(doc))]
        counts = np.array([len(c.split()) + 1 for doc in documents for c in doc], np.int64)
        values = np.stack(rows) if rows else np.zeros((0, self._dimension), np.float32)
        return Encoded((l2_normalize(values) if normalize and rows else values)
                       .astype(np.float32), counts, int(counts.sum()),
                       rows=np.array([len(doc) for doc in documents], np.int64))

    @property
    def labels(self) -> tuple[str, ...]:
        """As a classifier: one label per dimension."""
        return tuple(f"LABEL_{i}" for i in range(self._dimension))

    def classify(self, inputs: list[list[str]], *, truncate: bool = True) -> Encoded:
        """As a classifier: the text's (or pair's joined) fake vector as logits."""
        out = self.embed([" ".join(item) for item in inputs], normalize=False, truncate=truncate)
        return dataclasses.replace(out, labels=self.labels)

    def embed_sparse(self, texts: list[str], *, truncate: bool = True,
                     long_inputs: str | None = None) -> Encoded:
        """As a sparse model: each text's fake vector's positive entries, log1p'd (it takes
        no ``long_inputs``: never handed one)."""
        dense = self.embed(texts, normalize=False, truncate=truncate)
        rows, cols = np.nonzero(dense.values > 0)
        return dataclasses.replace(
            dense, values=np.log1p(dense.values[rows, cols]).astype(np.float32),
            indices=cols.astype(np.int32),
            rows=np.bincount(rows, minlength=len(texts)).astype(np.int64))

    def embed_tokens(self, ids: list[list[int]], *, normalize: bool,
                     truncate: bool = True) -> Encoded:
        return self.embed([" ".join(map(str, row)) for row in ids], normalize=normalize,
                          truncate=truncate)
