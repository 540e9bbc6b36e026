"""A request's ``long_inputs`` and ``return_chunks`` (docs/models.md, "Long inputs"):
checked before any model work, and the chunks a pool gave back as ``TextChunks``.

``long_inputs`` (truncate | error | chunk; None: the model's setting) says what becomes of
an input past the model's ``max_seq_length``; ``return_chunks`` chunks it and answers
each window's vector and [start, end) character offsets beside the text's mean.
"""

from __future__ import annotations

import numpy as np

from blitz.encoders.base import Encoded
from blitz.encoders.postprocess import OutputDtype, quantize, truncate_dimensions
from blitz.errors import InvalidValue
from blitz.hop_messages import TextChunks

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
