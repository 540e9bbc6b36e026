"""Sparse embeddings (SPLADE) for hybrid search: a masked-language model's vocabulary
logits, ``log(1 + relu(logits))`` max-pooled over each text's tokens (padding masked out),
as Hugging Face TEI's ``/embed_sparse`` and sentence-transformers' ``SpladePooling``
compute them. A text's vector has one entry per vocabulary token; only its non-zero
entries leave the pool replica.

Texts are tokenized, length-sorted and micro-batched by tokens like dense embeddings
(``blitz.encoders.bi_encoder``); the model runs in torch (CPU fp32, GPU in the spec's
``gpu_dtype``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from blitz.encoders.base import Encoded
from blitz.encoders.bi_encoder import BiEncoder
from blitz.encoders.sentence_transformer import padded
from blitz.encoders.token_ids import HfTokenIds
from blitz.errors import InvalidValue
from blitz.runtime import model_threads


def vocabulary_weights(logits: Any, attention: Any) -> Any:
    """(rows, vocabulary) float32: the max over each row's tokens (``attention`` 1) of
    ``log(1 + relu(logits))``. The max is taken first, in place on the logits' own dtype,
    so no other (rows, tokens, vocabulary) tensor is made (the fp32 copy and the weights
    were two, 2 GiB each at 8192 tokens of a 30,522-token vocabulary); as log1p and relu
    never decrease and float32 holds every fp16/bf16 value, it is bit for bit the max of
    the weights, padding's zeros included (``tests/unit/test_embed_sparse.py``)."""
    padding = attention.unsqueeze(-1) == 0
    return logits.masked_fill_(padding, float("-inf")).amax(dim=1).float().relu_().log1p_()


def cap_token_budget(encoder: Any, budget: int) -> None:
    """A sparse model's micro-batches held to ``budget`` tokens (a pool's
    ``sparse_token_budget``): each of its calls holds tokens x vocabulary logits."""
    if isinstance(encoder, SparseEncoder):
        encoder.token_budget = min(encoder.token_budget, budget)


class SparseEncoder(BiEncoder):
    """A SPLADE model: ``embed_sparse`` gives each text's non-zero vocabulary weights."""

    kind = "sparse"

    def __init__(self, model_id: str, model: Any, tokenizer: Any, *,
                 max_seq_length: int | None, device: str, token_budget: int):
        limit = max_seq_length or min(int(tokenizer.model_max_length or 512), 512)
        vocab = int(model.config.vocab_size)
        super().__init__(model_id, HfTokenIds(tokenizer), max_seq_length=limit,
                         dimension=vocab, device=device, token_budget=token_budget)
        self.model: Any = model
        self._torch = model_threads.torch_module()

    def _forward(self, rows: list[list[int]], width: int) -> np.ndarray:
        """(len(rows), vocabulary) float32: the max over tokens of log(1 + relu(logits))."""
        torch = self._torch
        if self.model is None:
            raise RuntimeError(f"model {self.model_id!r} was closed")
        input_ids, mask = padded(rows, width, self.tokens.pad_id)
        ids = torch.from_numpy(input_ids).to(self.device)
        attention = torch.from_numpy(mask).to(self.device)
        features = {"input_ids": ids, "attention_mask": attention}
        if self.tokens.type_ids:
            features["token_type_ids"] = torch.zeros_like(ids)
        with torch.inference_mode():
            logits = self.model(**features).logits  # (rows, width, vocabulary), model dtype
            return vocabulary_weights(logits, attention).cpu().numpy()

    def embed_sparse(self, texts: list[str], *, truncate: bool = True) -> Encoded:
        """``values``: the non-zero weights of every text, one text after the other, in
        vocabulary order; ``indices``: their vocabulary ids; ``rows``: how many per text."""
        ids, counts = self.token_ids(texts, truncate)
        dense = self._embed_ids(ids, counts, normalize=False)
        rows, cols = np.nonzero(dense.values)
        return Encoded(dense.values[rows, cols].astype(np.float32), counts,
                       dense.padded_tokens, indices=cols.astype(np.int32),
                       rows=np.bincount(rows, minlength=len(texts)).astype(np.int64))

    def embed(self, texts: list[str], *, normalize: bool, truncate: bool = True) -> Encoded:
        raise InvalidValue(f"model {self.model_id!r} gives sparse embeddings; use "
                           "/embed_sparse", param="model")

    def warmup(self) -> None:
        self.embed_sparse(["warm up"])

    def close(self) -> None:
        self.model = None

