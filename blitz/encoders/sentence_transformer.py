"""Bi-encoder backend on sentence-transformers (torch; the ONNX backends load through it too).

Texts are tokenized once, sorted by length and run in micro-batches that fit a token
budget, so short texts are not padded to the longest one in the request.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from blitz.encoders.base import Encoded, Encoder, check_lengths, l2_normalize
from blitz.errors import InvalidValue


class SentenceTransformerEncoder(Encoder):
    kind = "embedding"

    def __init__(self, model_id: str, model: Any, *, max_seq_length: int | None = None,
                 token_budget: int):
        limit = max_seq_length or model.max_seq_length or 512
        model.max_seq_length = limit
        super().__init__(model_id, limit)
        self.model = model
        self.tokenizer = model.tokenizer
        self.device = str(model.device)
        self.token_budget = token_budget
        self._dimension = model.get_embedding_dimension()
        self._pad_id = self.tokenizer.pad_token_id or 0
        self._type_ids = "token_type_ids" in getattr(self.tokenizer, "model_input_names", ())
        self._specials = self.tokenizer.num_special_tokens_to_add(pair=False)

    @property
    def dimension(self) -> int:
        return self._dimension

    def token_ids(self, texts: list[str], truncate: bool) -> tuple[list[list[int]], np.ndarray]:
        """Ids with special tokens, truncated to max_seq_length, and billed token counts."""
        ids = self.tokenizer(texts, add_special_tokens=True, truncation=True,
                             max_length=self.max_seq_length, return_attention_mask=False,
                             return_token_type_ids=False)["input_ids"]
        lengths = np.fromiter((len(row) for row in ids), dtype=np.int64, count=len(ids))
        if not truncate:
            at_limit = np.flatnonzero(lengths >= self.max_seq_length)
            if at_limit.size:
                full = self.tokenizer([texts[i] for i in at_limit], add_special_tokens=True,
                                      truncation=False, return_attention_mask=False,
                                      return_token_type_ids=False)["input_ids"]
                lengths[at_limit] = [len(row) for row in full]
        return ids, check_lengths(lengths, self.max_seq_length, truncate)

    def embed(self, texts: list[str], *, normalize: bool, truncate: bool = True) -> Encoded:
        ids, counts = self.token_ids(texts, truncate)
        return self._run(ids, counts, normalize)

    def embed_many(self, jobs: list[tuple[list[str], bool, bool]]) -> list[Encoded | Exception]:
        """Tokenize each request alone, then run all of them as one length-sorted batch."""
        results: list[Encoded | Exception] = []
        good: list[tuple[int, list[list[int]], np.ndarray, bool]] = []
        for k, (texts, normalize, truncate) in enumerate(jobs):
            try:
                ids, counts = self.token_ids(texts, truncate)
            except Exception as exc:
                results.append(exc)
                continue
            results.append(exc_placeholder)
            good.append((k, ids, counts, normalize))
        if good:
            merged = self._run([row for _, ids, _, _ in good for row in ids],
                               np.zeros(0, np.int64), normalize=False)
            start = 0
            for k, ids, counts, normalize in good:
                values = merged.values[start:start + len(ids)]
                start += len(ids)
                share = merged.padded_tokens * len(ids) // max(len(merged.values), 1)
                results[k] = Encoded(l2_normalize(values) if normalize else values, counts,
                                     share)
        return results

    def embed_tokens(self, ids: list[list[int]], *, normalize: bool,
                     truncate: bool = True) -> Encoded:
        vocab = self.tokenizer.vocab_size
        room = self.max_seq_length - self._specials
        for i, row in enumerate(ids):
            if any(t < 0 or t >= vocab for t in row):
                raise InvalidValue(f"input {i} has token ids outside 0..{vocab - 1}",
                                   param="input")
        lengths = np.array([len(row) + self._specials for row in ids], dtype=np.int64)
        counts = check_lengths(lengths, self.max_seq_length, truncate)
        full = [self.tokenizer.build_inputs_with_special_tokens(list(row[:room])) for row in ids]
        return self._run(full, counts, normalize)

    def _run(self, ids: list[list[int]], counts: np.ndarray, normalize: bool) -> Encoded:
        out = np.empty((len(ids), self._dimension), dtype=np.float32)
        padded = 0
        for batch in length_batches([len(r) for r in ids], self.token_budget):
            width = max(len(ids[i]) for i in batch)
            padded += width * len(batch)
            out[batch] = self._forward([ids[i] for i in batch], width)
        if normalize and len(ids):
            out = l2_normalize(out)
        return Encoded(out, counts, padded)

    def _forward(self, rows: list[list[int]], width: int) -> np.ndarray:
        input_ids = np.full((len(rows), width), self._pad_id, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for j, row in enumerate(rows):
            input_ids[j, : len(row)] = row
            mask[j, : len(row)] = 1
        features = {"input_ids": torch.from_numpy(input_ids).to(self.device),
                    "attention_mask": torch.from_numpy(mask).to(self.device)}
        if self._type_ids:
            features["token_type_ids"] = torch.zeros_like(features["input_ids"])
        with torch.inference_mode():
            emb = self.model(features)["sentence_embedding"]
        return emb.float().cpu().numpy()

    def close(self) -> None:
        self.model = None
        self.tokenizer = None


exc_placeholder = RuntimeError("not computed")


def length_batches(lengths: list[int], token_budget: int) -> list[np.ndarray]:
    """Index groups of similar length whose padded size (count x longest) fits the budget."""
    if not lengths:
        return []
    order = np.argsort(np.asarray(lengths), kind="stable")
    batches, start = [], 0
    for end in range(1, len(order) + 1):
        if end == len(order) or lengths[order[end]] * (end + 1 - start) > token_budget:
            batches.append(order[start:end])
            start = end
    return batches
