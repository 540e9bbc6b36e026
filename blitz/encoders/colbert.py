"""A late-interaction (ColBERT) model on torch: sentence-transformers 6's
``MultiVectorEncoder``, which opens its own folders and PyLate's and Stanford's (their
``[Q]``/``[D]`` markers, query expansion with ``[MASK]`` to a fixed length, the
punctuation skiplist for documents, the projection).

A query gives one vector per position up to its expanded length; a document one per token
kept (its padding and skiplisted tokens dropped). ``/rerank`` scores by MaxSim. A request
may shrink a document's vectors by hierarchical token pooling (``pool_factor``, as
sentence-transformers and PyLate do it) or ask for one MUVERA vector per text
(``blitz.multivector.muvera``).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np

from blitz.encoders.base import Encoded, Encoder, MultiVectorReduce, check_lengths
from blitz.errors import InvalidValue
from blitz.multivector import muvera
from blitz.runtime import model_threads


class ColbertEncoder(Encoder):
    """A ``MultiVectorEncoder`` held whole; its texts tokenized, expanded, masked and
    projected by its own modules, in batches that fit the pool's token budget."""

    kind = "multi-vector"
    capabilities = frozenset({"embed_multi", "score"})

    def __init__(self, model_id: str, model: Any, *, token_budget: int):
        first = model[0]
        expansion = getattr(first, "query_expansion", None) or {}
        limit = int(first.max_seq_length or 512)
        self.document_length = int(getattr(first, "document_length", None) or limit)
        self.query_length = int(expansion.get("length") or getattr(first, "query_length", None)
                                or limit)
        super().__init__(model_id, self.document_length)
        self.model = model
        self.device = str(model.device)
        self.token_budget = token_budget
        self._dimension = int(model.get_embedding_dimension())
        self._prompts = {task: str(model.prompts.get(task) or "") for task in
                         ("query", "document")}
        self._lock = threading.Lock()  # the tokenizer and the encode loop are not reentrant

    @property
    def dimension(self) -> int:
        return self._dimension

    def configure(self, *, max_batch_tokens: int, sparse_token_budget: int,
                  images: Any) -> None:
        self.token_budget = max_batch_tokens

    def counts(self, texts: list[str], query: bool, truncate: bool) -> np.ndarray:
        """Each text's tokens as the model reads it (its marker included), cut at its
        task's length; with ``truncate`` False an over-long text is a 413."""
        task = "query" if query else "document"
        prompt = self._prompts[task]
        ids = self.model.tokenizer([prompt + t for t in texts], add_special_tokens=True,
                                   truncation=False)["input_ids"]
        lengths = np.fromiter((len(row) for row in ids), dtype=np.int64, count=len(ids))
        return check_lengths(lengths, self.query_length if query else self.document_length,
                             truncate)

    def _encode(self, texts: list[str], query: bool) -> list[np.ndarray]:
        if self.model is None:
            raise RuntimeError(f"model {self.model_id!r} was closed")
        length = self.query_length if query else self.document_length
        batch = max(1, self.token_budget // max(length, 1))
        call = self.model.encode_query if query else self.model.encode_document
        with self._lock, model_threads.torch_module().inference_mode():
            rows = call(texts, batch_size=batch, convert_to_numpy=True,
                        show_progress_bar=False)
        return [np.asarray(r, dtype=np.float32) for r in rows]

    def embed_multi(self, texts: list[str], *, query: bool, truncate: bool = True,
                    reduce: MultiVectorReduce | None = None,
                    images: list[Any] | None = None) -> Encoded:
        if images:
            raise InvalidValue(f"model {self.model_id!r} is a text late-interaction model; "
                               "pages (images) need a model of kind vl-multi-vector "
                               "(ColPali, ColQwen2)", param="images")
        with self._lock:
            counts = self.counts(texts, query, truncate)
        return reduced(self._encode(texts, query), counts, query=query,
                       reduce=reduce or MultiVectorReduce(), dimension=self._dimension,
                       protected=1)

    def score(self, query: str, documents: list[str], *, truncate: bool = True) -> Encoded:
        """Each document's MaxSim against ``query``: the sum over the query's vectors of
        the largest dot product with any of the document's."""
        with self._lock:
            q_count = self.counts([query], True, truncate)
            counts = self.counts(documents, False, truncate)
        q = self._encode([query], True)[0]
        docs = self._encode(documents, False)
        scores = muvera.maxsim(q, docs).astype(np.float32)
        return Encoded(scores, counts + q_count[0], int(counts.sum() + q_count[0]))

    def warmup(self) -> None:
        self.score("warm up", ["warm up"])

    def close(self) -> None:
        self.model = None


def reduced(rows: list[np.ndarray], counts: np.ndarray, *, query: bool,
            reduce: MultiVectorReduce, dimension: int, protected: int) -> Encoded:
    """Each input's vectors as a request asks: pooled (a document's, ``pool_factor``:
    hierarchical token pooling as sentence-transformers 6 and PyLate do it, its first
    ``protected`` vectors kept), as one MUVERA vector each (``rows`` None), or whole."""
    if reduce.pool_factor is not None and reduce.pool_factor > 1:
        if query:
            raise InvalidValue("pool_factor pools a document's vectors; a query's are kept "
                               "whole (leave pool_factor out with input_type query)",
                               param="pool_factor")
        from sentence_transformers.multi_vector_encoder.modules.token_pooling import (
            HierarchicalTokenPooling,
        )

        torch = model_threads.torch_module()
        pooling = HierarchicalTokenPooling(pool_factor=reduce.pool_factor,
                                           num_protected_tokens=protected)
        rows = [pooling.pool_one(torch.from_numpy(r)).numpy() if len(r) else r for r in rows]
    if reduce.muvera is not None:
        params = muvera.MuveraParams(**reduce.muvera)
        encode = muvera.encode_query if query else muvera.encode_document
        values = (np.stack([encode(r, params) for r in rows]).astype(np.float32) if rows
                  else np.zeros((0, params.output_dim(dimension)), np.float32))
        return Encoded(values, counts, int(counts.sum()))
    values = np.concatenate(rows).astype(np.float32) if rows else np.zeros((0, dimension),
                                                                          np.float32)
    return Encoded(values, counts, int(counts.sum()),
                   rows=np.array([len(r) for r in rows], dtype=np.int64))


def open_colbert(model_id: str, path: Path, *, device: str, dtype: Any, token_budget: int,
                 max_seq_length: int | None, trust_remote_code: bool) -> ColbertEncoder:
    """A ColBERT folder (sentence-transformers 6's or PyLate's or Stanford's) on
    ``device``; a folder with no late-interaction head is refused (sentence-transformers
    would add a random projection to it)."""
    if not ((path / "modules.json").is_file() or (path / "artifact.metadata").is_file()):
        raise FileNotFoundError(
            f"{path} is not a late-interaction model: a multi-vector model's folder has "
            "modules.json (sentence-transformers or PyLate) or artifact.metadata (Stanford "
            "ColBERT); a plain transformer would get an untrained projection")
    model_threads.torch_module()
    from sentence_transformers import MultiVectorEncoder

    model = MultiVectorEncoder(str(path), device=device, trust_remote_code=trust_remote_code,
                               local_files_only=True, model_kwargs={"dtype": dtype})
    if max_seq_length:  # the spec's cap on a document's tokens
        transformer: Any = model[0]
        transformer.max_seq_length = max_seq_length
        if transformer.document_length:
            transformer.document_length = min(transformer.document_length, max_seq_length)
    model.eval()
    return ColbertEncoder(model_id, model, token_budget=token_budget)
