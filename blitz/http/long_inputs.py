"""What a request body says of inputs past the model's length, and how the windows of a
chunked text are written in a reply (docs/models.md, "Long inputs").

- ``TruncationSide``: Hugging Face TEI's ``truncation_direction`` (either case).
- ``LongInputs``: ``long_inputs`` (truncate | error | chunk; absent: the model's setting).
- ``chunks_body``: ``/embed``'s ``chunks`` with ``return_chunks``: per text
  ``{"embeddings": array, "offsets": [[start, end], ...]}``, the array in the reply's
  layout (msgpack-numpy's map or nested lists on JSON; portable: ``{data, shape, dtype}``),
  the offsets characters of the text as sent.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field, field_validator

from blitz import codecs
from blitz.codecs import ArrayLayout
from blitz.hop_messages import TextChunks

LONG_INPUTS_HELP = ("an input past max_seq_length: truncate (as `truncate` says), error "
                    "(413), or chunk (windows of max_seq_length, their token-weighted "
                    "mean); default: the model's long_inputs")


class TruncationSide(BaseModel):
    """Hugging Face TEI's ``truncation_direction`` (either case): where ``_sides`` has only
    ``right`` (TEI's default), ``left`` is refused, not silently cut the other way."""

    _sides: ClassVar[tuple[str, ...]] = ("right",)
    truncation_direction: str | None = None

    @field_validator("truncation_direction")
    @classmethod
    def _served(cls, value: str | None) -> str | None:
        if value is not None and value.lower() not in cls._sides:
            raise ValueError(f"only {' or '.join(cls._sides)} (the end of an over-long input "
                             "that is cut) is served; leave it out or send right")
        return None if value is None else value.lower()


class LongInputs(BaseModel):
    """A request's ``long_inputs``."""

    long_inputs: Literal["truncate", "error", "chunk"] | None = Field(
        None, description=LONG_INPUTS_HELP)


def chunks_body(chunks: list[TextChunks], layout: ArrayLayout | None) -> list[dict[str, Any]]:
    """``layout`` None: JSON's nested lists; else the msgpack array layout."""
    out = []
    for text in chunks:
        rows: Any = text.embeddings
        if layout == "portable":
            rows = dict(zip(("data", "shape", "dtype"), codecs.portable_array(rows),
                            strict=True))
        out.append({"embeddings": rows, "offsets": text.offsets.tolist()})
    return out
