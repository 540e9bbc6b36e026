"""Sparse embeddings (SPLADE) for hybrid search: a masked-language model's vocabulary
logits, ``log(1 + relu(logits))`` max-pooled over each text's tokens (padding masked out),
as Hugging Face TEI's ``/embed_sparse`` and sentence-transformers' ``SpladePooling``
compute them. A text's vector has one entry per vocabulary token; only its non-zero
entries leave the pool replica.

Texts are tokenized, length-sorted and micro-batched by tokens like dense embeddings
(``blitz.encoders.bi_encoder``); the model runs in torch (CPU fp32, GPU in the spec's
``gpu_dtype``).

``HybridEncoder`` (kind ``hybrid``) is BGE-M3: one XLM-R forward pass and two small heads
give a dense vector, lexical (sparse) weights and ColBERT token vectors per text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from blitz.encoders.base import Encoded, l2_normalize
from blitz.encoders.bi_encoder import BiEncoder
from blitz.encoders.sentence_transformer import padded
from blitz.encoders.token_ids import HfTokenIds
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
    capabilities = frozenset({"embed_tokens", "embed_sparse", "long_inputs"})  # no dense

    def __init__(self, model_id: str, model: Any, tokenizer: Any, *,
                 max_seq_length: int | None, device: str, token_budget: int):
        limit = max_seq_length or min(int(tokenizer.model_max_length or 512), 512)
        vocab = int(model.config.vocab_size)
        super().__init__(model_id, HfTokenIds(tokenizer), max_seq_length=limit,
                         dimension=vocab, device=device, token_budget=token_budget)
        self.model: Any = model
        self._torch = model_threads.torch_module()

    def configure(self, *, max_batch_tokens: int, sparse_token_budget: int,
                  images: Any) -> None:
        super().configure(max_batch_tokens=max_batch_tokens,
                          sparse_token_budget=sparse_token_budget, images=images)
        cap_token_budget(self, sparse_token_budget)

    def _forward(self, rows: list[list[int]], width: int) -> np.ndarray:
        """(len(rows), vocabulary) float32: the max over tokens of log(1 + relu(logits))."""
        torch = self._torch
        ids, attention = _tensors(self, rows, width)
        features = {"input_ids": ids, "attention_mask": attention}
        if self.tokens.type_ids:
            features["token_type_ids"] = torch.zeros_like(ids)
        with torch.inference_mode():
            logits = self.model(**features).logits  # (rows, width, vocabulary), model dtype
            return vocabulary_weights(logits, attention).cpu().numpy()

    def embed_sparse(self, texts: list[str], *, truncate: bool = True,
                     long_inputs: str | None = None) -> Encoded:
        """``values``: the non-zero weights of every text, one text after the other, in
        vocabulary order; ``indices``: their vocabulary ids; ``rows``: how many per text.
        Chunked (``long_inputs`` chunk; None: the model's setting), a weight is its largest
        over the text's windows: SPLADE's own max over tokens, carried across windows."""
        windows = None
        if (long_inputs or self.long_inputs) == "chunk":
            windows = self.chunks(texts)
            ids, counts = windows.ids, windows.counts
        else:
            ids, counts = self.token_ids(texts, truncate, long_inputs=long_inputs)
        dense = self._embed_ids(ids, counts, normalize=False)
        weights = dense.values
        if windows is not None and texts:
            firsts = np.concatenate([[0], np.cumsum(windows.spans)[:-1]]).astype(np.int64)
            weights = np.maximum.reduceat(weights, firsts, axis=0)
        rows, cols = np.nonzero(weights)
        return Encoded(weights[rows, cols].astype(np.float32), counts,
                       dense.padded_tokens, indices=cols.astype(np.int32),
                       rows=np.bincount(rows, minlength=len(texts)).astype(np.int64))

    def warmup(self) -> None:
        self.embed_sparse(["warm up"])

    def close(self) -> None:
        self.model = None



@dataclass(frozen=True)
class HybridEncoded:
    """A bge-m3 model's three outputs for one call, from one forward pass per micro-batch:
    ``dense`` (texts, hidden), L2-normalized CLS vectors; ``sparse`` (``values``,
    ``indices``, ``rows`` as ``embed_sparse`` gives them); ``colbert`` each text's
    normalized token vectors one text after the other, ``colbert.token_counts`` how many
    per text (every token but the leading CLS, the closing ``</s>`` included)."""

    dense: Encoded
    sparse: Encoded
    colbert: Encoded


class HybridEncoder(BiEncoder):
    """BGE-M3 (FlagEmbedding's ``BGEM3``): one XLM-R forward pass gives the last hidden
    state H; dense is H's CLS row, sparse each token id's largest
    ``relu(sparse_linear(H))`` (special tokens dropped, zeros left out), ColBERT
    ``colbert_linear(H[:, 1:])`` per token, normalized. ``embed`` gives dense,
    ``embed_sparse`` sparse, ``embed_all`` the ColBERT vectors, ``hybrid`` all three."""

    kind = "hybrid"
    capabilities = frozenset({"embed", "embed_tokens", "embed_all", "embed_sparse",
                              "embed_hybrid", "score", "long_inputs"})

    def __init__(self, model_id: str, model: Any, sparse_linear: Any, colbert_linear: Any,
                 tokenizer: Any, *, max_seq_length: int | None, device: str,
                 token_budget: int):
        limit = max_seq_length or min(int(tokenizer.model_max_length or 8192), 8192)
        super().__init__(model_id, HfTokenIds(tokenizer), max_seq_length=limit,
                         dimension=int(model.config.hidden_size), device=device,
                         token_budget=token_budget)
        self.model: Any = model
        self.sparse_linear: Any = sparse_linear
        self.colbert_linear: Any = colbert_linear
        self.unused = np.array(sorted({t for t in (
            tokenizer.cls_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id,
            tokenizer.unk_token_id) if t is not None}), dtype=np.int64)
        self._torch = model_threads.torch_module()

    def _heads(self, rows: list[list[int]], width: int,
               colbert: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """One forward pass: CLS rows (len(rows), hidden), sparse token weights
        (len(rows), width) and, when asked, normalized ColBERT vectors
        (len(rows), width - 1, hidden), all float32."""
        torch = self._torch
        ids, attention = _tensors(self, rows, width)
        with torch.inference_mode():
            hidden = self.model(input_ids=ids, attention_mask=attention).last_hidden_state
            dense = hidden[:, 0].float().cpu().numpy()
            weights = torch.relu(self.sparse_linear(hidden)).squeeze(-1).float().cpu().numpy()
            vectors = None
            if colbert:
                tokens = self.colbert_linear(hidden[:, 1:]) * attention[:, 1:, None]
                vectors = torch.nn.functional.normalize(tokens.float(), dim=-1).cpu().numpy()
        return dense, weights, vectors

    def _forward(self, rows: list[list[int]], width: int) -> np.ndarray:
        return self._heads(rows, width, colbert=False)[0]

    def hybrid(self, texts: list[str], *, truncate: bool = True, colbert: bool = True,
               long_inputs: str | None = None) -> HybridEncoded:
        """All three outputs of ``texts`` (ColBERT's left empty unless ``colbert``)."""
        ids, counts = self.token_ids(texts, truncate, long_inputs=long_inputs)
        return self._hybrid_ids(ids, counts, colbert)

    def _hybrid_ids(self, ids: list[list[int]], counts: np.ndarray,
                    colbert: bool) -> HybridEncoded:
        lengths = [len(row) for row in ids]
        dense = np.empty((len(ids), self._dimension), dtype=np.float32)
        weights: list[np.ndarray] = [np.empty(0, np.float32)] * len(ids)
        tokens: list[np.ndarray] = [np.empty((0, self._dimension), np.float32)] * len(ids)
        padded_tokens = 0
        for batch in self._calls(lengths, math.inf):
            width = max(lengths[i] for i in batch)
            padded_tokens += width * len(batch)
            cls, row_weights, vectors = self._heads([ids[i] for i in batch], width, colbert)
            dense[batch] = cls
            for j, i in enumerate(batch):
                weights[i] = row_weights[j, :lengths[i]]
                if vectors is not None:
                    tokens[i] = vectors[j, :lengths[i] - 1]
        sparse = [self._lexical(np.asarray(row, np.int64), w) for row, w in zip(
            ids, weights, strict=True)]
        dense_part = Encoded(l2_normalize(dense) if len(ids) else dense, counts, padded_tokens)
        sparse_part = Encoded(
            np.concatenate([v for _, v in sparse]).astype(np.float32) if ids
            else np.empty(0, np.float32), counts, padded_tokens,
            indices=np.concatenate([i for i, _ in sparse]).astype(np.int32) if ids
            else np.empty(0, np.int32),
            rows=np.array([len(i) for i, _ in sparse], dtype=np.int64))
        colbert_part = Encoded(np.concatenate(tokens) if ids else np.empty(
            (0, self._dimension), np.float32),
            np.array([len(t) for t in tokens], dtype=np.int64), padded_tokens)
        return HybridEncoded(dense_part, sparse_part, colbert_part)

    def _lexical(self, ids: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(vocabulary ids in order, weights): each id's largest weight, special tokens
        and zero weights left out."""
        keep = ~np.isin(ids, self.unused)
        unique, inverse = np.unique(ids[keep], return_inverse=True)
        best = np.zeros(len(unique), dtype=np.float32)
        np.maximum.at(best, inverse, weights[keep])
        nonzero = best > 0
        return unique[nonzero], best[nonzero]

    def embed_sparse(self, texts: list[str], *, truncate: bool = True,
                     long_inputs: str | None = None) -> Encoded:
        """The lexical weights; chunked (``long_inputs`` chunk, None: the model's), each
        vocabulary id's largest weight over the text's windows, as over its tokens."""
        if (long_inputs or self.long_inputs) != "chunk":
            return self.hybrid(texts, truncate=truncate, colbert=False,
                               long_inputs=long_inputs).sparse
        windows = self.chunks(texts)
        sparse = self._hybrid_ids(windows.ids, windows.counts, colbert=False).sparse
        assert sparse.indices is not None and sparse.rows is not None
        ends = np.cumsum(sparse.rows)
        per_text = np.cumsum(windows.spans)
        indices, values, rows = [], [], []
        for first, last in zip([0, *per_text[:-1]], per_text, strict=True):
            lo, hi = (int(ends[first - 1]) if first else 0), int(ends[last - 1])
            unique, inverse = np.unique(sparse.indices[lo:hi], return_inverse=True)
            best = np.zeros(len(unique), dtype=np.float32)
            np.maximum.at(best, inverse, sparse.values[lo:hi])
            indices.append(unique.astype(np.int32))
            values.append(best)
            rows.append(len(unique))
        return Encoded(np.concatenate(values) if texts else np.empty(0, np.float32),
                       windows.counts, sparse.padded_tokens,
                       indices=np.concatenate(indices) if texts else np.empty(0, np.int32),
                       rows=np.array(rows, dtype=np.int64))

    def embed_all(self, texts: list[str], *, truncate: bool = True,
                  long_inputs: str | None = None) -> Encoded:
        """The ColBERT vectors (normalized; no CLS row): ``token_counts`` how many per text.
        Never chunked (``long_inputs`` chunk truncates, as ``BiEncoder.embed_all``)."""
        return self.hybrid(texts, truncate=truncate, long_inputs=long_inputs).colbert

    def score(self, query: str, documents: list[str], *, truncate: bool = True) -> Encoded:
        """ColBERT MaxSim (FlagEmbedding's ``colbert_score``): per document, the mean over
        the query's token vectors of their largest dot product with the document's."""
        result = self.hybrid([query, *documents], truncate=truncate)
        colbert, counts = result.colbert, result.dense.token_counts
        rows = np.split(colbert.values, np.cumsum(colbert.token_counts)[:-1])
        scores = np.array([(rows[0] @ doc.T).max(axis=1).mean() for doc in rows[1:]],
                          dtype=np.float32)
        return Encoded(scores, counts[1:] + counts[0], colbert.padded_tokens)

    def embed_hybrid(self, texts: list[str], outputs: tuple[str, ...], *,
                     truncate: bool = True) -> Encoded:
        result = self.hybrid(texts, truncate=truncate, colbert="colbert" in outputs)
        parts = {"dense": result.dense, "sparse": result.sparse, "colbert": result.colbert}
        return Encoded(np.empty(0, np.float32), result.dense.token_counts,
                       result.dense.padded_tokens,
                       outputs={name: parts[name] for name in outputs})

    def warmup(self) -> None:
        self.hybrid(["warm up"])

    def close(self) -> None:
        self.model = self.sparse_linear = self.colbert_linear = None


def open_hybrid(model_id: str, path: Path, *, max_seq_length: int | None, device: str,
                dtype: Any, token_budget: int, trust_remote_code: bool) -> HybridEncoder:
    """A bge-m3 folder in torch: the XLM-R model with ``sparse_linear.pt`` (hidden -> 1)
    and ``colbert_linear.pt`` (hidden -> hidden) state dicts beside it."""
    torch = model_threads.torch_module()
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    model = AutoModel.from_pretrained(str(path), trust_remote_code=trust_remote_code,
                                      add_pooling_layer=False)  # bge-m3 reads H alone
    hidden = int(model.config.hidden_size)
    heads = []
    for name, size in (("sparse_linear.pt", 1), ("colbert_linear.pt", hidden)):
        if not (path / name).is_file():
            raise FileNotFoundError(f"a hybrid (bge-m3) model folder needs {name} beside "
                                    f"the model; {path} has none")
        head = torch.nn.Linear(hidden, size)
        head.load_state_dict(torch.load(path / name, map_location="cpu", weights_only=True))
        heads.append(head)
    moved = [m.to(device=device, dtype=dtype).eval() for m in (model, *heads)]
    return HybridEncoder(model_id, moved[0], moved[1], moved[2], tokenizer,
                         max_seq_length=max_seq_length, device=device,
                         token_budget=token_budget)


def _tensors(encoder: Any, rows: list[list[int]], width: int) -> tuple[Any, Any]:
    """``rows`` padded to ``width`` as the model's input ids and attention mask, on its
    device; an encoder already closed says so."""
    if encoder.model is None:
        raise RuntimeError(f"model {encoder.model_id!r} was closed")
    input_ids, mask = padded(rows, width, encoder.tokens.pad_id)
    torch = encoder._torch
    return (torch.from_numpy(input_ids).to(encoder.device),
            torch.from_numpy(mask).to(encoder.device))
