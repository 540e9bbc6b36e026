"""Response classes: each sets its media type and renders one way, nothing else."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import numpy as np
from starlette.responses import Response

from blitz import codecs
from blitz.ingress.tokenizing import INLINE_VALUES


async def built(make: Callable[[], Response], values: int) -> Response:
    """``make()``: a reply body built and rendered (a ``Response`` renders as it is made),
    on the event loop when it holds at most ``INLINE_VALUES`` values, else in a thread, so
    the loop keeps serving other requests meanwhile."""
    if values <= INLINE_VALUES:
        return make()
    return await asyncio.to_thread(make)


def numbers(rows: list[Any]) -> int:
    """The numbers in ``rows``: arrays, or sparse vectors (indices and values)."""
    return sum(row.size if isinstance(row, np.ndarray) else 2 * row.values.size
               for row in rows)


class MsgpackResponse(Response):
    media_type = "application/msgpack"

    def render(self, content: Any) -> bytes:
        return codecs.pack(content)




class JSONBytesResponse(Response):
    """JSON through orjson; numpy arrays are written from their buffers."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        """A top-level list of rows (lists or arrays: one per text) is encoded a row at a
        time, to the same bytes: orjson holds the GIL for a whole call, so between rows the
        event loop gets its turns while a large reply is encoded in a thread (``built``)."""
        if (isinstance(content, list) and len(content) > 1
                and isinstance(content[0], list | np.ndarray)):
            return b"[" + b",".join([codecs.dumps_json(row) for row in content]) + b"]"
        return codecs.dumps_json(content)


class RawArrayResponse(Response):
    """Little-endian array bytes; shape and dtype travel in ``x-blitz-shape``/``x-blitz-dtype``."""

    media_type = codecs.RAW_TYPE

    def __init__(self, array: np.ndarray, status_code: int = 200):
        super().__init__(array, status_code=status_code, headers={
            "x-blitz-shape": ",".join(str(d) for d in array.shape),
            "x-blitz-dtype": str(array.dtype),
        })

    def render(self, content: Any) -> bytes:
        return bytes(codecs.to_raw(content))
