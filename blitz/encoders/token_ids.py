"""Text to token ids, for the bi-encoders: one interface over two tokenizer libraries.

``HfTokenIds`` wraps a transformers tokenizer (what sentence-transformers models carry);
``FastTokenIds`` reads the same model's ``tokenizer.json`` with the ``tokenizers`` library
alone, so an ONNX model can run without importing transformers or torch. An ONNX build
uses ``FastTokenIds`` only when its ids were found equal to transformers' on the build's
checks (``blitz.encoders.onnx_native.verify``).

Both are thread-safe: a fast tokenizer whose truncation settings change between calls
changes its state, and two threads doing that at once fail ("Already borrowed"), so
``HfTokenIds`` serializes its calls and ``FastTokenIds`` keeps one tokenizer per setting.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from blitz.errors import InvalidValue


class TokenIds(Protocol):
    vocab_size: int  # ids a caller may send: 0 .. vocab_size - 1
    pad_id: int
    specials: int  # special tokens added to one sequence
    type_ids: bool  # whether the model takes token_type_ids

    def ids(self, texts: list[str], max_length: int | None) -> list[list[int]]:
        """Ids with special tokens; truncated to ``max_length`` (None: not truncated)."""

    def with_specials(self, rows: list[list[int]]) -> list[list[int]]:
        """``rows`` (ids without specials) with the special tokens added."""

    def ids_offsets(self, texts: list[str]) -> tuple[list[list[int]], list[list[tuple[int, int]]]]:
        """Ids with special tokens, not truncated, and each token's [start, end) character
        offsets in its text ((0, 0) for a special token)."""


class HfTokenIds:
    """A transformers tokenizer (a sentence-transformers model's ``tokenizer``)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.vocab_size = int(tokenizer.vocab_size)
        self.pad_id = tokenizer.pad_token_id or 0
        self.specials = tokenizer.num_special_tokens_to_add(pair=False)
        self.type_ids = "token_type_ids" in getattr(tokenizer, "model_input_names", ())
        self._lock = threading.Lock()
        # A slow (Python) tokenizer places special tokens with its own method. A fast one
        # places them in its post-processor: learned once as the prefix and suffix it puts
        # around one sequence (transformers 5's fast tokenizers have no such method, and
        # in 4.x one whose specials come from the post-processor alone, Qwen3's EOS or a
        # template's BOS, added none through it).
        self._build = getattr(tokenizer, "build_inputs_with_special_tokens", None)
        self._affixes: tuple[list[int], list[int]] | None = None
        self._unplaced = ""  # why the specials cannot be placed around given ids
        if self._build is None or len(self._build([0])) != 1 + self.specials:
            try:
                self._affixes = affixes(lambda text, special: tokenizer(
                    text, add_special_tokens=special)["input_ids"])
            except UnsupportedTokenizer as exc:
                self._unplaced = str(exc)  # the slow tokenizer's own method, as before

    def ids(self, texts: list[str], max_length: int | None) -> list[list[int]]:
        with self._lock:
            return self.tokenizer(texts, add_special_tokens=True,
                                  truncation=max_length is not None, max_length=max_length,
                                  return_attention_mask=False,
                                  return_token_type_ids=False)["input_ids"]

    def ids_offsets(self, texts: list[str]) -> tuple[list[list[int]], list[list[tuple[int, int]]]]:
        with self._lock:
            try:
                out = self.tokenizer(texts, add_special_tokens=True, return_offsets_mapping=True,
                                     return_attention_mask=False, return_token_type_ids=False)
            except NotImplementedError as exc:  # a slow (Python) tokenizer has no offsets
                raise InvalidValue("this model's tokenizer gives no character offsets (it is "
                                   "not a fast tokenizer): per-chunk offsets need one",
                                   param="return_chunks") from exc
        return out["input_ids"], [[tuple(o) for o in row] for row in out["offset_mapping"]]

    def with_specials(self, rows: list[list[int]]) -> list[list[int]]:
        if self._affixes is not None:
            prefix, suffix = self._affixes
            return [[*prefix, *row, *suffix] for row in rows]
        if self._build is None:
            raise InvalidValue(f"this model's tokenizer cannot add its special tokens to token "
                               f"ids ({self._unplaced}): send the text instead", param="input")
        with self._lock:
            return [self._build(list(row)) for row in rows]


class FastTokenIds:
    """A model folder's ``tokenizer.json`` on the ``tokenizers`` library (no transformers).

    Special tokens are placed as the tokenizer's own post-processor places them around one
    sequence, learned once from a one-token probe; ``UnsupportedTokenizer`` when they are
    not simply a prefix and a suffix.
    """

    def __init__(self, folder: Path, max_length: int, type_ids: bool):
        from tokenizers import Tokenizer

        path = folder / "tokenizer.json"
        if not path.is_file():
            raise UnsupportedTokenizer("no tokenizer.json")
        config = _json(folder / "tokenizer_config.json")
        side = config.get("truncation_side", "right")
        self._truncating = Tokenizer.from_file(str(path))
        self._truncating.no_padding()
        self._truncating.enable_truncation(max_length, direction=side)
        self._full = Tokenizer.from_file(str(path))
        self._full.no_padding()
        self._full.no_truncation()
        self.max_length = max_length
        self.vocab_size = self._full.get_vocab_size(with_added_tokens=False)
        self.pad_id = self._pad_id(folder, config)
        self.type_ids = type_ids
        self._prefix, self._suffix = affixes(lambda text, special: self._full.encode(
            text, add_special_tokens=special).ids)
        self.specials = len(self._prefix) + len(self._suffix)

    def ids(self, texts: list[str], max_length: int | None) -> list[list[int]]:
        if max_length is not None and max_length != self.max_length:
            raise ValueError(f"this tokenizer truncates to {self.max_length}, not {max_length}")
        tokenizer = self._full if max_length is None else self._truncating
        return [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=True)]

    def ids_offsets(self, texts: list[str]) -> tuple[list[list[int]], list[list[tuple[int, int]]]]:
        encodings = self._full.encode_batch(texts, add_special_tokens=True)
        return [e.ids for e in encodings], [e.offsets for e in encodings]

    def with_specials(self, rows: list[list[int]]) -> list[list[int]]:
        return [[*self._prefix, *row, *self._suffix] for row in rows]

    def _pad_id(self, folder: Path, config: dict[str, Any]) -> int:
        token = _json(folder / "special_tokens_map.json").get("pad_token", config.get("pad_token"))
        if isinstance(token, dict):
            token = token.get("content")
        found = self._full.token_to_id(token) if isinstance(token, str) else None
        return found or 0


def affixes(encode: Callable[[str, bool], list[int]]) -> tuple[list[int], list[int]]:
    """The ids a tokenizer's post-processor puts before and after one sequence's own ids,
    learned from ``encode(text, add_special_tokens)`` on a one-word probe;
    ``UnsupportedTokenizer`` when they are not simply a prefix and a suffix."""
    probe = "hello"
    bare, full = encode(probe, False), encode(probe, True)
    for start in range(len(full) - len(bare) + 1):
        if full[start:start + len(bare)] == bare:
            prefix, suffix = full[:start], full[start + len(bare):]
            if bare and encode("", True) == [*prefix, *suffix]:
                return prefix, suffix
    raise UnsupportedTokenizer("its special tokens are not a fixed prefix and suffix")


class UnsupportedTokenizer(ValueError):
    """The folder's tokenizer cannot run on the ``tokenizers`` library alone."""


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    value = json.loads(path.read_text(encoding="utf-8"))
    return value if isinstance(value, dict) else {}
