"""``/tokenize`` and ``/decode``: each model's own tokenizer, on the ingress
(``blitz.ingress.tokenizers``).

The ingress answers these itself, with no pool call: tokenizing a sentence costs tens of
microseconds, a hop to a pool replica a few milliseconds (docs/ray-notes.md, "Request
path cost").

It is the tokenizer the model runs with, untruncated and unpadded: ``/tokenize`` with
``add_special_tokens: false`` gives the ids ``/v1/embeddings`` takes as token-id input
for the same vector. Offsets are character offsets into the text (the prompt included
when ``prompt_name`` is given), or, with ``offsets: "bytes"``, UTF-8 byte offsets as
Hugging Face TEI counts them.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from blitz.errors import InvalidValue, PayloadTooLarge
from blitz.hop_messages import DecodeResult, Token, TokenizeResult
from blitz.ingress.limits import check_texts, check_token_ids
from blitz.ingress.tokenizers import Tokenizers
from blitz.settings.registry import ModelSpec, apply_prompt

if TYPE_CHECKING:
    from blitz.ingress.service import EmbeddingService, RequestRecord

OffsetUnit = Literal["chars", "bytes"]
# tokenize or decode more than this many characters (ids) in a thread, not on the loop
INLINE_WORK = 4096
# a reply of more numbers (and strings) than this is built and encoded in a thread: a large
# /tokenize or /embed_all reply held the event loop for hundreds of ms
INLINE_VALUES = 32_768
# texts are tokenized in groups of about this many characters; the token count is checked
# after each group, so a request over its token limit stops within one group of it
GROUP_CHARS = 65_536


async def off_loop(work: Callable[[], Any], size: int, inline: int = INLINE_WORK) -> Any:
    """``work()`` inline when ``size`` is at most ``inline``, else in a thread: the loop
    keeps serving."""
    if size <= inline:
        return work()
    return await asyncio.to_thread(work)


def groups(texts: list[str], chars: int = GROUP_CHARS) -> list[list[str]]:
    """``texts`` in order, cut into runs of about ``chars`` characters (at least one text
    each)."""
    out: list[list[str]] = [[]]
    held = 0
    for text in texts:
        if out[-1] and held + len(text) > chars:
            out.append([])
            held = 0
        out[-1].append(text)
        held += len(text)
    return out


def too_many_tokens(limit: int, param: str = "texts") -> PayloadTooLarge:
    return PayloadTooLarge(f"the texts give more than {limit} tokens; the limit "
                           f"max_tokens_per_request is {limit}", param=param)


def tokenize(tokenizer: Any, texts: list[str], add_special_tokens: bool,
             offsets: OffsetUnit | None = "chars", max_tokens: int | None = None,
             param: str = "texts") -> list[list[Token]]:
    """Each text's tokens: id, text (the text's own characters; a special token's name),
    whether it is special, and its offsets (None for special tokens, and for all with
    ``offsets=None``). Past ``max_tokens`` in all (``limits.max_tokens_per_request``):
    413, raised within one group of texts (``GROUP_CHARS``) of the limit."""
    out: list[list[Token]] = []
    total = 0
    for group in groups(texts):
        encodings = tokenizer.encode_batch(group, add_special_tokens=add_special_tokens)
        total += sum(len(encoding.ids) for encoding in encodings)
        if max_tokens is not None and total > max_tokens:
            raise too_many_tokens(max_tokens, param)
        out += _rows(group, encodings, offsets)
    return out


def count_tokens(tokenizer: Any, texts: list[str], longest: int | None, limit: int) -> int:
    """The tokens a model reads of ``texts`` (special tokens in, each text cut to
    ``longest`` when given), counted group by group: past ``limit`` it stops and answers
    the count so far (over ``limit``)."""
    total = 0
    for group in groups(texts):
        encodings = tokenizer.encode_batch_fast(group, add_special_tokens=True)
        total += sum(len(e.ids) if longest is None else min(len(e.ids), longest)
                     for e in encodings)
        if total > limit:
            break
    return total


def _rows(texts: list[str], encodings: list[Any],
          offsets: OffsetUnit | None) -> list[list[Token]]:
    out = []
    for text, encoding in zip(texts, encodings, strict=True):
        to_bytes = _byte_offsets(text) if offsets == "bytes" else None
        row = []
        for tid, (start, stop), special, name in zip(
                encoding.ids, encoding.offsets, encoding.special_tokens_mask, encoding.tokens,
                strict=True):
            if special:
                row.append(Token(tid, name, True, None, None))
            elif offsets is None:
                row.append(Token(tid, text[start:stop], False, None, None))
            elif to_bytes is None:
                row.append(Token(tid, text[start:stop], False, start, stop))
            else:
                row.append(Token(tid, text[start:stop], False, to_bytes[start], to_bytes[stop]))
        out.append(row)
    return out


def _byte_offsets(text: str) -> list[int]:
    """The UTF-8 byte offset of each character position of ``text`` (and its end)."""
    if text.isascii():
        return list(range(len(text) + 1))
    out, at = [0], 0
    for char in text:
        at += len(char.encode("utf-8", "surrogatepass"))
        out.append(at)
    return out


def decode(tokenizer: Any, rows: list[list[int]], skip_special_tokens: bool) -> list[str]:
    """The text of each row of ids; an id outside the vocabulary is a 422 naming it."""
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    try:
        flat = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64)
        bad = np.flatnonzero((flat < 0) | (flat >= size))
        first = int(bad[0]) if bad.size else None
    except OverflowError:  # an id past int64 (a body may carry up to 2^64 - 1): found here
        first = next(k for k, t in enumerate(itertools.chain.from_iterable(rows))
                     if not 0 <= t < size)
    if first is not None:
        ends = np.cumsum([len(row) for row in rows])
        i = int(np.searchsorted(ends, first, side="right"))
        j = first - (int(ends[i - 1]) if i else 0)
        raise InvalidValue(f"ids[{i}][{j}] = {rows[i][j]} is not a token id of this "
                           f"model (0 to {size - 1})", param="ids")
    return list(tokenizer.decode_batch(rows, skip_special_tokens=skip_special_tokens))


class TokenService:
    """``tokenize`` and ``decode`` for HTTP and handle calls: the model id, limits and
    metrics as ``EmbeddingService`` does them, then the model's tokenizer (the service's:
    one per model on the ingress) here."""

    def __init__(self, service: EmbeddingService, tokenizers: Tokenizers | None = None):
        self.service = service
        self.tokenizers = tokenizers or service.tokenizers

    async def tokenizer(self, spec: ModelSpec) -> Any:
        """``spec``'s tokenizer, opened on first use (a 424 when it cannot be)."""
        return await self.tokenizers.checked(spec)

    async def tokenize(self, texts: str | list[str], model: str | None = None, *,
                       add_special_tokens: bool = True, prompt_name: str | None = None,
                       return_offsets: bool = True, offsets: OffsetUnit = "chars",
                       record: RequestRecord | None = None,
                       param: str = "texts") -> TokenizeResult:
        """Each text's tokens with ``model``'s tokenizer (the default model when None);
        more than ``limits.max_tokens_per_request`` in all is a 413 naming ``param``."""
        with self.service.recorded(record, "handle.tokenize") as record:
            items = [texts] if isinstance(texts, str) else list(texts or ())
            record.texts, record.model = len(items), model or ""
            spec = self.service.spec(model)
            record.model = spec.id
            check_texts(items, self.service.settings.limits)
            items = apply_prompt(spec, items, prompt_name)
            tokenizer = await self.tokenizer(spec)
            limit = self.service.settings.limits.max_tokens_per_request
            rows = await off_loop(lambda: tokenize(tokenizer, items, add_special_tokens,
                                                   offsets if return_offsets else None,
                                                   limit, param),
                                  sum(map(len, items)))
            record.tokens = sum(map(len, rows))
            return TokenizeResult(rows, spec.id)

    async def decode(self, ids: list[int] | list[list[int]], model: str | None = None, *,
                     skip_special_tokens: bool = True,
                     record: RequestRecord | None = None) -> DecodeResult:
        """The text of each row of ``ids`` (one row: a list of ints) with ``model``'s
        tokenizer."""
        with self.service.recorded(record, "handle.decode") as record:
            rows = _id_rows(ids)
            record.texts, record.model = len(rows), model or ""
            spec = self.service.spec(model)
            record.model = spec.id
            check_token_ids(rows, self.service.settings.limits, "ids")
            tokenizer = await self.tokenizer(spec)
            texts = await off_loop(lambda: decode(tokenizer, rows, skip_special_tokens),
                                   sum(map(len, rows)))
            record.tokens = sum(map(len, rows))
            return DecodeResult(texts, spec.id)


def _id_rows(ids: Any) -> list[list[int]]:
    """``ids`` as rows: one list of ints is one row; anything else is a 422."""
    if isinstance(ids, list) and ids and all(type(i) is int for i in ids):
        return [ids]
    if (isinstance(ids, list) and ids and all(isinstance(row, list) for row in ids)
            and all(type(i) is int for row in ids for i in row)):
        return ids
    raise InvalidValue("ids must be a non-empty list of token ids (integers) or of such "
                       "lists", param="ids")
