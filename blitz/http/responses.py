"""Response classes: each sets its media type and renders one way, nothing else."""

from __future__ import annotations

from typing import Any

import numpy as np
from starlette.responses import Response

from blitz import codecs


class MsgpackResponse(Response):
    media_type = "application/msgpack"

    def render(self, content: Any) -> bytes:
        return codecs.pack(content)


class JSONBytesResponse(Response):
    """JSON through orjson; numpy arrays are written from their buffers."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
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
