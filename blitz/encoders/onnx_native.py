"""ONNX bi-encoders on onnxruntime and ``tokenizers`` alone: no torch, no transformers.

Running the graph in a sentence-transformers model (``blitz.encoders.onnx_module``) needs
torch and transformers around it (~400 MiB of a replica's memory and seconds of
imports, docs/benchmarks-history.md "Idle memory"). A sentence-transformers model made of a
transformer, a pooling and an optional normalization needs none of them: the graph gives
the token embeddings, pooling and normalization are a few numpy lines, and the folder's
``tokenizer.json`` gives the ids.

Which builds run here is decided when the build is made (``blitz.loading.onnx_export``), where
torch is at hand anyway: ``verify`` opens the build both ways and requires the same ids,
special tokens, limits and vectors; the verdict is recorded in the build's cache entry.
A build that fails it (another layout, a tokenizer the ``tokenizers`` library cannot run
alone, a cross-encoder) keeps running through sentence-transformers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from blitz.encoders.base import l2_normalize
from blitz.encoders.bi_encoder import LATE_POOLING_OF, BiEncoder
from blitz.encoders.sentence_transformer import padded
from blitz.encoders.token_ids import FastTokenIds, UnsupportedTokenizer
from blitz.runtime import model_threads

# sentence-transformers' pooling modes this module computes, and their keys in folders
# saved before sentence-transformers 5.7 (one boolean per mode)
POOLING_MODES = ("mean", "cls", "max", "mean_sqrt_len_tokens", "lasttoken")
LEGACY_POOLING_KEYS = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls",
                       "pooling_mode_max_tokens": "max",
                       "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                       "pooling_mode_lasttoken": "lasttoken"}
# the rows and tolerances ``verify`` holds the two paths to
VERIFY_EXTRA_TEXTS = ("", " ", "Ünïcödé ÀÉÎ façade naïve", "日本語のテキスト 中文文本",
                      "emoji 🙂🚀 and symbols ©®™ \t tabs\nnewlines", "UPPER lower MiXeD",
                      "word " * 600, "https://example.com/a?b=c&d=e#f", "can't won't it's")
VERIFY_MAX_ABS = 1e-4


class UnsupportedLayout(ValueError):
    """The folder's model is not one this module runs."""


@dataclass(frozen=True)
class Layout:
    """What a sentence-transformers folder's modules do after the transformer."""

    pooling: str  # one of POOLING_MODES
    normalize: bool
    dimension: int
    max_seq_length: int
    type_ids: bool  # whether the graph takes token_type_ids


class NativeOnnxModel:
    """An ONNX graph of a bi-encoder, open on onnxruntime, with its folder's layout."""

    def __init__(self, folder: Path, file_name: str):
        layout = read_layout(folder)
        self.session = model_threads.onnx_session(folder / file_name)
        inputs = {i.name for i in self.session.get_inputs()}
        if not {"input_ids", "attention_mask"} <= inputs:
            raise UnsupportedLayout(f"the graph takes {sorted(inputs)}")
        outputs = [o.name for o in self.session.get_outputs()]
        self.output = "last_hidden_state" if "last_hidden_state" in outputs else outputs[0]
        self.layout = Layout(layout.pooling, layout.normalize, layout.dimension,
                             layout.max_seq_length, "token_type_ids" in inputs)
        self.position_ids = "position_ids" in inputs  # a decoder's graph takes them (graph_export)
        self.folder = folder

    def forward(self, input_ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        hidden = self.hidden(input_ids, mask)
        return pool(hidden, mask, self.layout.pooling, self.layout.normalize)

    def hidden(self, input_ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """The graph's token vectors (rows, width, hidden), before pooling."""
        feed = {"input_ids": input_ids, "attention_mask": mask}
        if self.layout.type_ids:
            feed["token_type_ids"] = np.zeros_like(input_ids)
        if self.position_ids:  # rows are padded on the right: each starts at position 0
            feed["position_ids"] = np.ascontiguousarray(np.broadcast_to(
                np.arange(input_ids.shape[1], dtype=np.int64), input_ids.shape))
        return self.session.run([self.output], feed)[0]


class OnnxEncoder(BiEncoder):
    """``NativeOnnxModel`` as an Encoder (CPU)."""

    def __init__(self, model_id: str, model: NativeOnnxModel, *,
                 max_seq_length: int | None = None, token_budget: int, rows_per_call: int = 0):
        limit = max_seq_length or model.layout.max_seq_length
        tokens = FastTokenIds(model.folder, limit, model.layout.type_ids)
        super().__init__(model_id, tokens, max_seq_length=limit,
                         dimension=model.layout.dimension, device="cpu",
                         token_budget=token_budget, rows_per_call=rows_per_call)
        self.model: NativeOnnxModel | None = model

    def _forward(self, rows: list[list[int]], width: int) -> np.ndarray:
        if self.model is None:
            raise RuntimeError(f"model {self.model_id!r} was closed")
        input_ids, mask = padded(rows, width, self.tokens.pad_id)
        return self.model.forward(input_ids, mask)

    def _forward_tokens(self, rows: list[list[int]], width: int) -> np.ndarray:
        if self.model is None:
            raise RuntimeError(f"model {self.model_id!r} was closed")
        input_ids, mask = padded(rows, width, self.tokens.pad_id)
        return self.model.hidden(input_ids, mask).astype(np.float32, copy=False)

    def late_pooling(self) -> str:
        assert self.model is not None
        return LATE_POOLING_OF.get(self.model.layout.pooling, "mean")

    def close(self) -> None:
        self.model = None


def pool(hidden: np.ndarray, mask: np.ndarray, mode: str, normalize: bool) -> np.ndarray:
    """Token embeddings (rows, width, dim) to sentence embeddings, as sentence-transformers'
    ``Pooling`` and ``Normalize`` compute them (their formulas, clamps included)."""
    hidden = hidden.astype(np.float32, copy=False)
    weights = mask[..., None].astype(np.float32)
    if mode == "cls":
        out = hidden[:, 0]
    elif mode == "lasttoken":  # the last position the mask covers, whichever side pads
        width = mask.shape[1]
        last = width - 1 - np.argmax(mask[:, ::-1], axis=1)
        rows = np.arange(len(mask))
        out = hidden[rows, last] * weights[rows, last]
    elif mode == "max":
        out = np.where(weights > 0, hidden, np.float32(-1e9)).max(axis=1)
    else:
        sums = (hidden * weights).sum(axis=1)
        counts = np.maximum(weights.sum(axis=1), np.float32(1e-9))
        out = sums / (counts if mode == "mean" else np.sqrt(counts))
    out = np.ascontiguousarray(out, dtype=np.float32)
    return l2_normalize(out) if normalize else out


def read_layout(folder: Path) -> Layout:
    """The folder's modules, if they are a transformer, one supported pooling and
    optionally a normalization; ``UnsupportedLayout`` otherwise."""
    modules = sorted(_json(folder / "modules.json", list), key=lambda m: m.get("idx", 0))
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        raise UnsupportedLayout(f"its modules are {kinds or 'not listed'}")
    if modules[0].get("path", "") not in ("", "."):
        raise UnsupportedLayout("its transformer is not at the folder's top")
    transformer = _json(folder / "sentence_bert_config.json", dict)
    if transformer.get("do_lower_case"):
        raise UnsupportedLayout("it lowercases texts before tokenizing")
    limit = max_seq_length(folder, transformer)
    pooling = _json(folder / str(modules[1].get("path", "")) / "config.json", dict)
    mode = pooling_mode(pooling)
    dimension = pooling.get("embedding_dimension", pooling.get("word_embedding_dimension"))
    if not isinstance(dimension, int):
        raise UnsupportedLayout("its pooling names no dimension")
    return Layout(mode, len(kinds) == 3, dimension, limit, False)


def pooling_mode(config: dict[str, Any]) -> str:
    """The one pooling mode a Pooling module's config names (``pooling_mode``, or the
    booleans of older folders, none meaning mean, as sentence-transformers reads them)."""
    mode = config.get("pooling_mode")
    if mode is None:
        modes = [m for key, m in LEGACY_POOLING_KEYS.items() if config.get(key)]
        others = [key for key, on in config.items()
                  if key.startswith("pooling_mode") and on and key not in LEGACY_POOLING_KEYS]
        mode = others or (modes if len(modes) != 1 else modes[0]) or "mean"
    if isinstance(mode, list) and len(mode) == 1:
        mode = mode[0]
    if mode not in POOLING_MODES:
        raise UnsupportedLayout(f"its pooling is {mode}")
    return mode


def max_seq_length(folder: Path, transformer: dict[str, Any]) -> int:
    """The transformer's input limit as sentence-transformers reads it: its own config's
    ``max_seq_length`` (sentence-transformers < 5.7 folders), else the tokenizer's
    ``model_max_length`` capped by the model's position embeddings."""
    if isinstance(transformer.get("max_seq_length"), int):
        return transformer["max_seq_length"]
    tokenizer = _json(folder / "tokenizer_config.json", dict).get("model_max_length")
    positions = _json(folder / "config.json", dict).get("max_position_embeddings")
    limits = [n for n in (tokenizer, positions) if isinstance(n, int) and n > 0]
    if not isinstance(tokenizer, int):
        raise UnsupportedLayout("it names no max_seq_length")
    return min(limits)


def open_native(folder: Path, file_name: str) -> NativeOnnxModel:
    return NativeOnnxModel(folder, file_name)


def verify(reference: BiEncoder, folder: Path, file_name: str) -> str | None:
    """Why the build at ``folder/file_name`` cannot run here, or None when it can:
    ``reference`` (the same build through sentence-transformers) and the native encoder
    must agree on limits, vocabulary, special tokens, every id of the probe texts and
    some harder ones (truncated or not), and every vector of them."""
    from blitz.encoders.probes import PROBE_TEXTS

    try:
        native = OnnxEncoder(reference.model_id, open_native(folder, file_name),
                             max_seq_length=reference.max_seq_length,
                             token_budget=reference.token_budget,
                             rows_per_call=reference.rows_per_call)
    except (UnsupportedLayout, UnsupportedTokenizer) as exc:
        return str(exc)
    try:
        texts = [*PROBE_TEXTS, *VERIFY_EXTRA_TEXTS]
        pairs = [("dimension", native.dimension, reference.dimension),
                 ("max_seq_length", native.max_seq_length, reference.max_seq_length),
                 ("vocabulary size", native.tokens.vocab_size, reference.tokens.vocab_size),
                 ("special tokens", native.tokens.with_specials([[7]]),
                  reference.tokens.with_specials([[7]])),
                 ("token type ids", native.tokens.type_ids, reference.tokens.type_ids)]
        for limit in (native.max_seq_length, None):
            pairs.append((f"token ids (truncated to {limit})", native.tokens.ids(texts, limit),
                          reference.tokens.ids(texts, limit)))
        for what, mine, theirs in pairs:
            if mine != theirs:
                return f"its {what} differ from sentence-transformers'"
        mine = native.embed(texts, normalize=False).values
        theirs = reference.embed(texts, normalize=False).values
        gap = float(np.abs(mine - theirs).max())
        if not gap <= VERIFY_MAX_ABS:
            return f"its vectors differ from sentence-transformers' by up to {gap:.2e}"
        return None
    finally:
        native.close()


def _json(path: Path, kind: type) -> Any:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UnsupportedLayout(f"{path.name} is missing or unreadable") from exc
    if not isinstance(value, kind):
        raise UnsupportedLayout(f"{path.name} is not a JSON {kind.__name__}")
    return value
