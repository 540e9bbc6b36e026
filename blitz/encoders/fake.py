"""A deterministic fake encoder: API and routing tests without a model."""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import time
from typing import Any

import numpy as np

from blitz.encoders.base import Encoded, Encoder, check_lengths, l2_normalize
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
                              "embed_images"})
    """What a fake of any kind answers; images only where its kind takes them."""

    def __init__(self, model_id: str, dimension: int, max_seq_length: int = 128,
                 batch_s: float = 0.0, batches_at_once: int | None = None,
                 kind: str = "embedding"):
        super().__init__(model_id, max_seq_length)
        self.kind = kind
        if "embed_images" not in KINDS[kind].capabilities:
            self.capabilities = type(self).capabilities - {"embed_images"}
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
