"""Cross-encoder backend on sentence-transformers' ``CrossEncoder``: scores (query, doc) pairs.

Token counts come from tokenizing the query once and the documents once (without special
tokens): a pair has ``query + document + num_special_tokens_to_add(pair=True)`` tokens.
A pair longer than ``max_seq_length`` loses the end of its document, never its query
(``truncation="only_second"``); a query that leaves no room for a document is refused.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from blitz.encoders.base import Encoded, Encoder, check_lengths
from blitz.errors import InvalidValue
from blitz.runtime import model_threads


class CrossEncoderEncoder(Encoder):
    kind = "cross-encoder"
    capabilities = frozenset({"score"})

    def __init__(self, model_id: str, model: Any, *, max_seq_length: int | None = None,
                 batch_size: int = 32):
        limit = max_seq_length or model.max_seq_length or 512
        model.max_seq_length = limit
        super().__init__(model_id, limit)
        self.model = model
        self.tokenizer = model.tokenizer
        self.device = str(model.device)
        self.batch_size = batch_size
        # the document is cut, the query kept; max_length as the counts assume
        self._processing = {"text": {"truncation": "only_second", "max_length": limit}}
        # predict() tokenizes with other truncation settings than _ids(): a fast tokenizer
        # changing its settings for one thread fails another ("Already borrowed"), so one
        # call at a time
        self._lock = threading.Lock()

    @property
    def dimension(self) -> None:
        return None

    def score(self, query: str, documents: list[str], *, truncate: bool = True) -> Encoded:
        with self._lock:
            return self._score(query, documents, truncate)

    def _score(self, query: str, documents: list[str], truncate: bool) -> Encoded:
        limit = self.max_seq_length
        specials = self.tokenizer.num_special_tokens_to_add(pair=True)
        query_tokens = len(self._ids([query])[0])
        if query_tokens + specials >= limit:  # not one document token would fit beside it
            raise InvalidValue(
                f"the query has {query_tokens} tokens; with {specials} special tokens and a "
                f"document it cannot fit in model {self.model_id!r}'s max_seq_length of "
                f"{limit}: shorten it to at most {limit - specials - 1} tokens",
                param="query")
        if not documents:
            return Encoded(np.zeros(0, np.float32), np.zeros(0, np.int64), 0)
        lengths = np.fromiter((len(ids) for ids in self._ids(documents)), dtype=np.int64,
                              count=len(documents)) + (query_tokens + specials)
        counts = check_lengths(lengths, limit, truncate)
        scores = self.model.predict([(query, d) for d in documents], batch_size=self.batch_size,
                                    convert_to_numpy=True, show_progress_bar=False,
                                    processing_kwargs=self._processing)
        scores = np.asarray(scores, dtype=np.float32).reshape(len(documents), -1)[:, 0]
        return Encoded(scores, counts, int(counts.sum()))

    def _ids(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text alone, without special tokens or truncation."""
        return self.tokenizer(texts, add_special_tokens=False, truncation=False,
                              return_attention_mask=False, return_token_type_ids=False,
                              verbose=False)["input_ids"]

    def close(self) -> None:
        self.model = None
        self.tokenizer = None


class ClassifierEncoder(CrossEncoderEncoder):
    """A sequence classifier (``AutoModelForSequenceClassification``, on sentence-transformers'
    ``CrossEncoder``, torch or ONNX): one text (or a text pair) in, one raw logit per label
    out. The labels are the model config's ``id2label``."""

    kind = "classifier"
    capabilities = frozenset({"score", "classify"})

    def __init__(self, model_id: str, model: Any, *, max_seq_length: int | None = None,
                 batch_size: int = 32):
        super().__init__(model_id, model, max_seq_length=max_seq_length, batch_size=batch_size)
        self._processing = {"text": {"truncation": True, "max_length": self.max_seq_length}}
        config = getattr(model, "config", None)
        id2label = dict(getattr(config, "id2label", None) or {})
        count = int(getattr(model, "num_labels", 0) or len(id2label) or 1)
        self.labels = tuple(str(id2label.get(i, id2label.get(str(i), f"LABEL_{i}")))
                            for i in range(count))

    def classify(self, inputs: list[list[str]], *, truncate: bool = True) -> Encoded:
        """Raw logits (len(inputs), labels), float32; each input is one text or a pair."""
        with self._lock:
            if self.model is None:
                raise RuntimeError(f"model {self.model_id!r} was closed")
            lengths = np.zeros(len(inputs), dtype=np.int64)
            for width in (1, 2):  # texts, then pairs: their special tokens differ
                rows = [i for i, item in enumerate(inputs) if len(item) == width]
                if not rows:
                    continue
                specials = self.tokenizer.num_special_tokens_to_add(pair=width == 2)
                for side in range(width):
                    ids = self._ids([inputs[i][side] for i in rows])
                    lengths[rows] += [len(row) for row in ids]
                lengths[rows] += specials
            counts = check_lengths(lengths, self.max_seq_length, truncate)
            values = np.empty((len(inputs), len(self.labels)), dtype=np.float32)
            for width in (1, 2):  # one tokenizer call takes texts or pairs, not both
                rows = [i for i, item in enumerate(inputs) if len(item) == width]
                for start in range(0, len(rows), self.batch_size):
                    part = rows[start:start + self.batch_size]
                    batch = [inputs[i][0] if width == 1 else tuple(inputs[i]) for i in part]
                    values[part] = self._logits(batch)
        return Encoded(values, counts, int(counts.sum()), labels=self.labels)

    def _logits(self, batch: list[Any]) -> np.ndarray:
        """One model call: ``batch`` (texts, or (text, text) pairs) to raw logits."""
        torch = model_threads.torch_module()
        from sentence_transformers.util import batch_to_device

        features = self.model.preprocess(batch, processing_kwargs=self._processing)
        features = batch_to_device(features, self.model.device)
        with torch.inference_mode():
            scores = self.model(features, processing_kwargs=self._processing)["scores"]
        return scores.float().cpu().numpy().reshape(len(batch), -1)

    def score(self, query: str, documents: list[str], *, truncate: bool = True) -> Encoded:
        raise InvalidValue(f"model {self.model_id!r} is a classifier; use /predict or "
                           "/classify", param="model")

    def warmup(self) -> None:
        self.classify([["warm up"]])
