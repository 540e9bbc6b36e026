"""Bi-encoder backend on sentence-transformers: torch, and the ONNX builds that
``blitz.encoders.onnx_native`` cannot run on onnxruntime alone.

The model runs whole (its own modules: transformer, pooling, normalization...) on ids
that ``BiEncoder`` tokenized and micro-batched (``blitz.encoders.bi_encoder``). torch is
imported only when such a model is opened (``blitz.runtime.model_threads``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from blitz.encoders.bi_encoder import LATE_POOLING_OF, BiEncoder
from blitz.encoders.token_ids import HfTokenIds
from blitz.errors import InvalidValue
from blitz.runtime import model_threads


class SentenceTransformerEncoder(BiEncoder):
    def __init__(self, model_id: str, model: Any, *, max_seq_length: int | None = None,
                 token_budget: int, rows_per_call: int = 0):
        limit = max_seq_length or model.max_seq_length or 512
        model.max_seq_length = limit
        super().__init__(model_id, HfTokenIds(model.tokenizer), max_seq_length=limit,
                         dimension=model.get_embedding_dimension(), device=str(model.device),
                         token_budget=token_budget, rows_per_call=rows_per_call)
        self.model = model
        self._torch = model_threads.torch_module()

    def _forward(self, rows: list[list[int]], width: int) -> np.ndarray:
        return self._run_model(rows, width, "sentence_embedding")

    def _forward_tokens(self, rows: list[list[int]], width: int) -> np.ndarray:
        return self._run_model(rows, width, "token_embeddings")

    def late_pooling(self) -> str:
        names = [type(m).__name__ for m in self.model]
        pooling = next((m for m in self.model if type(m).__name__ == "Pooling"), None)
        extra = [n for n in names[1:] if n not in ("Pooling", "Normalize")]
        if pooling is None or extra:
            raise InvalidValue(f"model {self.model_id!r} has {', '.join(extra) or 'no Pooling'}"
                               " after its transformer; late chunking pools a chunk's tokens "
                               "alone and would miss it", param="model")
        mode = str(getattr(pooling, "pooling_mode", "mean"))
        return LATE_POOLING_OF.get(mode, "mean")

    def _run_model(self, rows: list[list[int]], width: int, output: str) -> np.ndarray:
        torch = self._torch
        if self.model is None:
            raise RuntimeError(f"model {self.model_id!r} was closed")
        input_ids, mask = padded(rows, width, self.tokens.pad_id)
        features = {"input_ids": torch.from_numpy(input_ids).to(self.device),
                    "attention_mask": torch.from_numpy(mask).to(self.device)}
        if self.tokens.type_ids:
            features["token_type_ids"] = torch.zeros_like(features["input_ids"])
        with torch.inference_mode():
            emb = self.model(features)[output]
        return emb.float().cpu().numpy()

    def close(self) -> None:
        self.model = None


def padded(rows: list[list[int]], width: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` as one (len(rows), width) int64 id matrix padded with ``pad_id``, and its
    attention mask."""
    input_ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for j, row in enumerate(rows):
        input_ids[j, : len(row)] = row
        mask[j, : len(row)] = 1
    return input_ids, mask
