"""A model's facts, read from its files without loading weights: the one reader of its
``config.json`` (a dual encoder's text tower included), shared by the memory budget (the
model's ``ModelShape``), the ONNX export (its ``model_type``) and ``/info`` and the ingress
(its dimension, max input length, pooling and labels).

Facts are estimates and descriptions: where the files do not say, or are not on this
machine, a reader answers None (or leaves the fact out), and the load says what is wrong.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blitz.loading.fetch import resolve_source
from blitz.settings.kinds import kind_of
from blitz.settings.registry import ModelSpec

GATED = ("llama", "mistral", "qwen", "gemma", "phi3")  # model_type prefixes with a gated MLP
POOLING_MODES = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
                 "pooling_mode_max_tokens": "max", "pooling_mode_lasttoken": "last_token"}


def read_json(path: Path) -> Any:
    """A JSON file's content; {} where there is no such file."""
    return json.loads(path.read_text()) if path.is_file() else {}


def read_config(folder: Path) -> dict[str, Any]:
    """The ``config.json`` of a model folder; {} where there is none."""
    config = read_json(folder / "config.json")
    return config if isinstance(config, dict) else {}


def text_tower(config: dict[str, Any]) -> dict[str, Any]:
    """The config that describes the text transformer: a dual encoder's ``text_config``
    (its top level has no ``hidden_size``), else the config itself."""
    text = config.get("text_config")
    return text if isinstance(text, dict) and "hidden_size" not in config else config


def model_type(folder: Path) -> str | None:
    """The ``model_type`` a model folder's config names (None: no config)."""
    return read_config(folder).get("model_type")


@dataclass(frozen=True)
class ModelShape:
    """What the memory budget's rule needs of a transformer, from its ``config.json``."""

    hidden: int
    layers: int
    intermediate: int
    vocab: int
    max_positions: int = 512
    gated: bool = False  # a decoder's gate + up projections: 3 MLP matrices, not 2
    query_width: int = 0  # heads x head size (0: hidden)
    kv_width: int = 0  # key/value heads x head size: fewer with grouped queries (0: query's)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ModelShape | None:
        config = text_tower(config)
        try:
            hidden, heads = int(config["hidden_size"]), int(config.get("num_attention_heads") or 1)
            head = int(config.get("head_dim") or hidden // heads)
            kv_heads = int(config.get("num_key_value_heads") or heads)
            return cls(hidden=hidden, query_width=heads * head, kv_width=kv_heads * head,
                       layers=int(config["num_hidden_layers"]),
                       intermediate=int(config.get("intermediate_size") or 4 * hidden),
                       vocab=int(config.get("vocab_size") or 0),
                       max_positions=int(config.get("max_position_embeddings") or 512),
                       gated=str(config.get("model_type", "")).startswith(GATED))
        except (KeyError, TypeError, ValueError):
            return None

    @property
    def parameters(self) -> int:
        """About the model's parameter count: embeddings, then per layer the attention's
        query, key, value and output projections and the MLP's two (three when gated)."""
        query = self.query_width or self.hidden
        attention = 2 * self.hidden * (query + (self.kv_width or query))
        mlp = (3 if self.gated else 2) * self.hidden * self.intermediate
        return self.vocab * self.hidden + self.layers * (attention + mlp)


def read_shape(path: Path) -> ModelShape | None:
    """The shape in a model folder's ``config.json``; None where there is none."""
    try:
        return ModelShape.from_config(json.loads((path / "config.json").read_text()))
    except (OSError, ValueError, AttributeError):
        return None


def model_shape(spec: ModelSpec, cache_dir: Path | None = None,
                fetched: bool = False) -> ModelShape | None:
    """``spec``'s shape from its files: a local source's (a cheap read), or once its load
    has fetched it (``fetched``: off the event loop) any source's; None for a fake, or
    where the files give none (an ONNX-only folder)."""
    if spec.is_fake or not (fetched or spec.location().is_local):
        return None
    try:
        return read_shape(resolve_source(spec, cache_dir))
    except Exception:  # a shape is an estimate: the load says what is wrong
        return None


def read_dimension(spec: ModelSpec) -> int | None:
    """The embedding size, from the spec or the model's files, without loading weights."""
    if spec.dimension:
        return spec.dimension
    if spec.is_fake:
        return spec.fake_params()[0]
    source = kind_of(spec.kind).dimension
    if source is None or not spec.location().is_local:
        return None
    try:
        path = resolve_source(spec)
        if source == "projection":  # CLIP's projection_dim; SigLIP's text projection
            config = read_config(path)
            text = config.get("text_config") or {}
            return int(config.get("projection_dim") or text.get("projection_size")
                       or text["hidden_size"])
        if source == "decoder":  # a vision-language decoder's last hidden state
            config = read_config(path)
            return int((config.get("text_config") or config)["hidden_size"])
        if source == "embedding_dim":  # a late-interaction retriever's projection
            return int(read_config(path)["embedding_dim"])
        if source == "vocabulary":  # one weight per vocabulary token
            return int(read_config(path)["vocab_size"])
        modules = read_json(path / "modules.json") or []
        for module in reversed(modules):
            cfg = path / module.get("path", "") / "config.json"
            if module.get("type", "").endswith("Dense") and cfg.exists():
                return int(json.loads(cfg.read_text())["out_features"])
        return int(read_config(path)["hidden_size"])
    except Exception:
        return None


def read_facts(spec: ModelSpec) -> dict[str, object]:
    """A local model's max input length and pooling (and a classifier's labels), from its
    files (no weights loaded); None where the files do not say or are not on this machine."""
    facts: dict[str, object] = {"max_input_length": spec.max_seq_length,
                                "pooling": spec.pooling}
    if spec.is_fake or not spec.location().is_local:
        return facts
    try:
        path = resolve_source(spec)
        sbert = read_json(path / "sentence_bert_config.json")
        config = read_config(path)
        facts["max_input_length"] = (spec.max_seq_length or sbert.get("max_seq_length")
                                     or _shortest(config.get("max_position_embeddings"),
                                                  read_json(path / "tokenizer_config.json")
                                                  .get("model_max_length")))
        expansion = sbert.get("query_expansion") or {}
        query_length = (expansion.get("length") or sbert.get("query_length")
                        or read_json(path / "config_sentence_transformers.json")
                        .get("query_length"))
        if query_length:  # a late-interaction model's queries: this many vectors each
            facts["query_length"] = int(query_length)
        if isinstance(config.get("id2label"), dict):
            facts["id2label"] = {str(k): str(v) for k, v in config["id2label"].items()}
        if facts["pooling"] is None:
            modules = read_json(path / "modules.json") or []
            pool_dir = next((m.get("path", "") for m in modules
                             if str(m.get("type", "")).endswith("Pooling")), None)
            pooling = read_json(path / pool_dir / "config.json") if pool_dir else {}
            facts["pooling"] = next((name for key, name in POOLING_MODES.items()
                                     if pooling.get(key)), None)
    except Exception:  # facts for /info: never worth failing a request over
        pass
    return facts


def _shortest(*lengths: object) -> int | None:
    """The least of the lengths that are sane ints (a tokenizer without a limit says 1e30),
    as sentence-transformers takes a model's max_seq_length where its config names none."""
    sane = [n for n in lengths if isinstance(n, int) and 0 < n < 1_000_000]
    return min(sane) if sane else None
