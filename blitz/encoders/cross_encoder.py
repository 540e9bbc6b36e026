"""Cross-encoder backend on sentence-transformers' ``CrossEncoder``: scores (query, doc) pairs."""

from __future__ import annotations

from typing import Any

import numpy as np

from blitz.encoders.base import Encoded, Encoder, check_lengths


class CrossEncoderEncoder(Encoder):
    kind = "cross-encoder"

    def __init__(self, model_id: str, model: Any, *, max_seq_length: int | None = None,
                 batch_size: int = 32):
        limit = max_seq_length or model.max_length or 512
        model.max_length = limit
        super().__init__(model_id, limit)
        self.model = model
        self.tokenizer = model.tokenizer
        self.device = str(model.device)
        self.batch_size = batch_size

    @property
    def dimension(self) -> None:
        return None

    def score(self, query: str, documents: list[str], *, truncate: bool = True) -> Encoded:
        ids = self.tokenizer([query] * len(documents), documents, add_special_tokens=True,
                             truncation=False, return_attention_mask=False,
                             return_token_type_ids=False)["input_ids"]
        lengths = np.fromiter((len(r) for r in ids), dtype=np.int64, count=len(ids))
        counts = check_lengths(lengths, self.max_seq_length, truncate)
        if not documents:
            return Encoded(np.zeros(0, np.float32), counts, 0)
        scores = self.model.predict([(query, d) for d in documents], batch_size=self.batch_size,
                                    convert_to_numpy=True, show_progress_bar=False)
        scores = np.asarray(scores, dtype=np.float32).reshape(len(documents), -1)[:, 0]
        return Encoded(scores, counts, int(counts.sum()))

    def close(self) -> None:
        self.model = None
        self.tokenizer = None
