"""Tiny random-weight decoder embedders (Qwen3, Gemma3, Llama, Mistral), built offline from
their transformers configs, with ``tests/tiny_tokenizer.py``'s tokenizer.

``build_decoder(directory, family)`` writes two folders under ``directory`` and returns
them as a ``TinyDecoder``:

- ``plain``: a plain transformers checkpoint (config, weights, tokenizer), served with
  ``pooling: lasttoken``;
- ``st``: the same weights as a sentence-transformers folder (Transformer, Pooling
  ``lasttoken``, Normalize) with ``PROMPTS`` in ``config_sentence_transformers.json``.

Each family keeps its real model's tokenizer habits that matter to last-token pooling:
the padding side, a BOS token in front, an EOS token appended by the tokenizer's
post-processor (as Qwen3-Embedding's does).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.tiny_tokenizer import VOCAB, VOCAB_SIZE, save_tiny_tokenizer

PROMPTS = {"query": "Instruct: Given a web search query, retrieve relevant passages that "
                    "answer the query\nQuery:", "document": ""}
INSTRUCTION_TEMPLATE = "Instruct: {instruction}\nQuery:"


@dataclass(frozen=True)
class Family:
    name: str
    padding_side: str
    add_bos: bool
    add_eos: bool


FAMILIES = {
    "qwen3": Family("qwen3", padding_side="left", add_bos=False, add_eos=True),
    "gemma3": Family("gemma3", padding_side="right", add_bos=True, add_eos=False),
    "llama": Family("llama", padding_side="left", add_bos=True, add_eos=True),
    "mistral": Family("mistral", padding_side="right", add_bos=True, add_eos=True),
}


@dataclass(frozen=True)
class TinyDecoder:
    family: Family
    plain: Path
    st: Path
    hidden: int


def decoder_config(family: str, hidden: int = 32) -> Any:
    """A two-layer config of ``family`` sized for the tiny tokenizer."""
    from transformers import Gemma3TextConfig, LlamaConfig, MistralConfig, Qwen3Config

    common = dict(vocab_size=VOCAB_SIZE, hidden_size=hidden, intermediate_size=2 * hidden,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=hidden // 4, max_position_embeddings=512, initializer_range=0.2,
                  pad_token_id=VOCAB["<|endoftext|>"], eos_token_id=VOCAB["<|endoftext|>"],
                  bos_token_id=VOCAB["<bos>"], tie_word_embeddings=True)
    if family == "qwen3":
        return Qwen3Config(**common)
    if family == "gemma3":
        return Gemma3TextConfig(**common, query_pre_attn_scalar=hidden // 4,
                                sliding_window=16)
    if family == "llama":
        return LlamaConfig(**common)
    if family == "mistral":
        return MistralConfig(**common, sliding_window=None)
    raise ValueError(f"unknown family {family!r}")


def save_decoder_tokenizer(directory: Path, family: Family) -> None:
    """The tiny tokenizer with ``family``'s padding side, BOS and EOS habits."""
    save_tiny_tokenizer(directory, padding_side=family.padding_side, add_bos=family.add_bos)
    if not family.add_eos:
        return
    path = directory / "tokenizer.json"
    data = json.loads(path.read_text())
    bos = "<bos> " if family.add_bos else ""
    specials = {"<bos>": VOCAB["<bos>"], "<|endoftext|>": VOCAB["<|endoftext|>"]}
    used = [t for t in specials if t in bos + "<|endoftext|>"]
    data["post_processor"] = {
        "type": "TemplateProcessing",
        "single": _template(f"{bos}$A <|endoftext|>"),
        "pair": _template(f"{bos}$A <|endoftext|> $B:1 <|endoftext|>:1"),
        "special_tokens": {t: {"id": t, "ids": [specials[t]], "tokens": [t]} for t in used}}
    path.write_text(json.dumps(data))
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["add_eos_token"] = True
    config_path.write_text(json.dumps(config))


def _template(spec: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for piece in spec.split():
        name, _, type_id = piece.partition(":")
        type_id_value = int(type_id or 0)
        if name.startswith("$"):
            items.append({"Sequence": {"id": name[1:], "type_id": type_id_value}})
        else:
            items.append({"SpecialToken": {"id": name, "type_id": type_id_value}})
    return items


def build_decoder(directory: str | Path, family: str, *, hidden: int = 32, seed: int = 0,
                  padding_side: str | None = None) -> TinyDecoder:
    """``family``'s tiny model as a plain checkpoint and a sentence-transformers folder
    (``padding_side`` overrides the family's)."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import (
        Normalize,
        Pooling,
        Transformer,
    )
    from transformers import AutoModel

    habits = FAMILIES[family]
    if padding_side is not None:
        habits = Family(habits.name, padding_side, habits.add_bos, habits.add_eos)
    root = Path(directory)
    plain, st = root / "plain", root / "st"
    torch.manual_seed(seed)
    model = AutoModel.from_config(decoder_config(family, hidden))
    model.save_pretrained(plain)
    save_decoder_tokenizer(plain, habits)
    word = Transformer(str(plain), max_seq_length=256)
    modules = [word, Pooling(word.get_embedding_dimension(), "lasttoken"), Normalize()]
    SentenceTransformer(modules=modules, device="cpu", prompts=dict(PROMPTS)).save(str(st))
    return TinyDecoder(habits, plain, st, hidden)
