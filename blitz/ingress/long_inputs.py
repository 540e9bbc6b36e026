"""A request's ``long_inputs`` and ``return_chunks`` (docs/models.md, "Long inputs"):
checked before any model work, and the chunks a pool gave back as ``TextChunks``.

``long_inputs`` (truncate | error | chunk; None: the model's setting) says what becomes of
an input past the model's ``max_seq_length``; ``return_chunks`` chunks it and answers
each window's vector and [start, end) character offsets beside the text's mean. A request
may chunk only a model whose spec opts in (``request_chunking``), and its windows are
counted against ``limits.max_windows_per_request`` before any model work
(``WindowCounter``); its jobs then count windows in the queues, not texts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from blitz.encoders.base import Encoded
from blitz.encoders.postprocess import OutputDtype, quantize, truncate_dimensions
from blitz.errors import InvalidValue, ModelLoadFailed
from blitz.hop_messages import TextChunks
from blitz.ingress.limits import KIND_COSTS, Window, count_windows
from blitz.loading.facts import read_facts

if TYPE_CHECKING:
    from blitz.settings.config import Limits
    from blitz.settings.registry import ModelSpec

UNKNOWN_LENGTH = 512  # a model's max input length where its files do not say (counted by bytes)
INLINE_CHARS = 4096  # windows of more characters than this are counted in a thread

LONG_INPUTS = ("truncate", "error", "chunk")


def check_long_inputs(long_inputs: str | None, return_chunks: bool = False, *,
                      token_ids: bool = False, chunks_here: str = "") -> None:
    """422 for a value outside ``LONG_INPUTS``, ``return_chunks`` with another value than
    chunk, chunking token ids, or chunk where the route cannot (``chunks_here``: why)."""
    if long_inputs is not None and long_inputs not in LONG_INPUTS:
        raise InvalidValue(f"long_inputs must be one of {', '.join(LONG_INPUTS)} (or left "
                           "out: the model's setting)", param="long_inputs")
    if return_chunks and long_inputs not in (None, "chunk"):
        raise InvalidValue(f"return_chunks answers the windows of a chunked text; it takes "
                           f"long_inputs chunk (or left out), not {long_inputs}",
                           param="return_chunks")
    chunked = return_chunks or long_inputs == "chunk"
    if chunked and token_ids:
        raise InvalidValue("long_inputs chunk and return_chunks take texts, not token ids "
                           "(the offsets are characters of a text)", param="long_inputs")
    if chunked and chunks_here:
        raise InvalidValue(f"long_inputs chunk is not served here: {chunks_here}; send "
                           "truncate or error", param="long_inputs")


def text_chunks(parts: list[Encoded], prefix: int, dimensions: int | None, normalized: bool,
                dtype: OutputDtype) -> list[TextChunks]:
    """Each text's windows from the pool's parts (``outputs["chunks"]``), their vectors cut
    to ``dimensions`` and in ``dtype`` as the texts' own, their offsets moved back by the
    prompt's ``prefix`` characters (a window that starts in the prompt starts at 0)."""
    out: list[TextChunks] = []
    for part in parts:
        chunks = (part.outputs or {}).get("chunks")
        assert chunks is not None and chunks.rows is not None and chunks.offsets is not None
        ends = np.cumsum(chunks.rows)[:-1]
        vectors = quantize(truncate_dimensions(chunks.values, dimensions, normalized), dtype)
        offsets = np.maximum(chunks.offsets - prefix, 0)
        out += [TextChunks(rows, marks) for rows, marks in zip(
            np.split(vectors, ends), np.split(offsets, ends), strict=True)]
    return out


def chunked(spec: ModelSpec, long_inputs: str | None, return_chunks: bool) -> bool:
    """Whether a request's texts are cut into windows: it asks (``long_inputs`` chunk or
    ``return_chunks``: only where the model's spec sets ``request_chunking``, else a 422) or
    leaves it to a model that chunks."""
    asked = return_chunks or long_inputs == "chunk"
    if asked and spec.long_inputs != "chunk" and not spec.request_chunking:
        raise InvalidValue(
            f"model {spec.id!r} does not chunk per request (its spec sets no request_chunking); "
            "send long_inputs truncate or error, without return_chunks",
            param="long_inputs" if long_inputs == "chunk" else "return_chunks")
    return (asked or (long_inputs is None and spec.long_inputs == "chunk")) and (
        KIND_COSTS[spec.kind].windows)


class WindowCounter:
    """A chunked request's windows, counted on the ingress before any model work
    (``blitz.ingress.limits.count_windows``) with the model's own tokenizer (``tokenizer``:
    the ingress's, opened once per model), each model's window read once from its files."""

    def __init__(self, tokenizer: Callable[[ModelSpec], Awaitable[Any]]):
        self._tokenizer = tokenizer
        self._windows: dict[str, Window] = {}

    def forget(self, model_id: str) -> None:
        self._windows.pop(model_id, None)

    async def units(self, spec: ModelSpec, texts: list[str], limits: Limits) -> list[int]:
        """Each text's windows; 413 past ``limits.max_windows_per_request``."""
        tokenizer: Any = (await self._tokenizer(spec)
                          if not spec.is_fake and spec.location().is_local else None)
        window = self._windows.get(spec.id) or self._window(spec, tokenizer)

        def own_tokens(group: list[str]) -> list[int]:
            return [len(e.ids) for e in tokenizer.encode_batch_fast(
                group, add_special_tokens=False)]

        def count() -> list[int]:
            return count_windows(texts, window, limits,
                                 own_tokens if tokenizer is not None else None)

        return count() if sum(map(len, texts)) <= INLINE_CHARS else await asyncio.to_thread(count)

    def _window(self, spec: ModelSpec, tokenizer: Any) -> Window:
        """``spec``'s window: its max input length less its special tokens; a chunk_overlap
        that leaves no room is the spec's fault, a 424 naming it."""
        longest = read_facts(spec).get("max_input_length")
        longest = longest if isinstance(longest, int) else spec.max_seq_length or UNKNOWN_LENGTH
        specials = (len(tokenizer.encode("", add_special_tokens=True).ids)
                    if tokenizer is not None else 2)
        room = longest - specials
        if spec.chunk_overlap >= room:
            raise ModelLoadFailed(
                f"model {spec.id!r}: its chunk_overlap {spec.chunk_overlap} is not less than "
                f"its window's {room} tokens (max_seq_length {longest} less {specials} "
                "special tokens); the model's spec must be fixed", param="model",
                model=spec.id)
        window = self._windows[spec.id] = Window(room, room - spec.chunk_overlap)
        return window
