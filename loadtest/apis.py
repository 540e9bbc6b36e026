"""The HTTP APIs the load generator speaks: how to ask for embeddings, how to read them.

Each API builds a request (path, body, headers) for a list of texts and turns a 200
reply into a float32 ``(n, d)`` array. Nothing here does I/O, so the asyncio runner and
the Locust file share it. A body that cannot be read raises
``VerificationError("malformed", ...)``.

=================  ===================  ==========================================
name               request              reply
=================  ===================  ==========================================
native-msgpack     POST /embed msgpack  msgpack map, msgpack-numpy array
native-json        POST /embed JSON     JSON map, embeddings as nested lists
raw                POST /embed msgpack  little-endian float32, ``x-blitz-shape``
openai-float       POST /v1/embeddings  OpenAI list, float lists
openai-base64      POST /v1/embeddings  OpenAI list, base64 little-endian float32
=================  ===================  ==========================================
"""

from __future__ import annotations

import base64
import binascii
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import orjson

from blitz import codecs
from blitz.errors import BadRequest
from loadtest.verify import VerificationError

MODEL_HEADER = "serve_multiplexed_model_id"


@dataclass(frozen=True)
class Request:
    path: str
    body: bytes
    headers: dict[str, str]


@dataclass(frozen=True)
class Reply:
    embeddings: np.ndarray
    tokens: int | None = None  # usage.total_tokens when the server reports it


def _malformed(detail: str) -> VerificationError:
    return VerificationError("malformed", detail)


def _tokens(usage: Any) -> int | None:
    if isinstance(usage, Mapping):
        total = usage.get("total_tokens", usage.get("prompt_tokens"))
        if isinstance(total, int):
            return total
    return None


def _float_rows(rows: Any) -> np.ndarray:
    try:
        array = np.asarray(rows, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise _malformed(f"embeddings are not a numeric matrix ({exc})") from exc
    if array.ndim == 1 and array.size == 0:
        return array.reshape(0, 0)
    return array


def _load_json(content: bytes) -> Any:
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError as exc:
        raise _malformed(f"reply is not JSON ({exc})") from exc


class Api(ABC):
    """One way of asking for embeddings."""

    name: ClassVar[str]
    default_path: ClassVar[str]

    def __init__(self, path: str | None = None):
        self.path = path or self.default_path

    @abstractmethod
    def request(self, texts: list[str], model: str) -> Request: ...

    @abstractmethod
    def parse(self, content: bytes, headers: Mapping[str, str]) -> Reply: ...


class NativeMsgpack(Api):
    name = "native-msgpack"
    default_path = "/embed"
    accept = "application/msgpack"
    content_type = "application/msgpack"
    dumps = staticmethod(codecs.pack)

    def request(self, texts: list[str], model: str) -> Request:
        body = self.dumps({"texts": texts, "model": model})
        return Request(self.path, body, {"content-type": self.content_type,
                                         "accept": self.accept, MODEL_HEADER: model})

    def parse(self, content: bytes, headers: Mapping[str, str]) -> Reply:
        try:
            reply = codecs.unpack(content)
        except BadRequest as exc:
            raise _malformed(str(exc)) from exc
        return self._from_map(reply)

    def _from_map(self, reply: Any) -> Reply:
        if not isinstance(reply, Mapping) or "embeddings" not in reply:
            raise _malformed("reply has no 'embeddings'")
        embeddings = reply["embeddings"]
        if not isinstance(embeddings, np.ndarray):
            embeddings = _float_rows(embeddings)
        return Reply(embeddings, _tokens(reply.get("usage")))


class NativeJson(NativeMsgpack):
    name = "native-json"
    accept = "application/json"
    content_type = "application/json"
    dumps = staticmethod(orjson.dumps)

    def parse(self, content: bytes, headers: Mapping[str, str]) -> Reply:
        return self._from_map(_load_json(content))


class Raw(NativeMsgpack):
    name = "raw"
    accept = "application/octet-stream"

    def parse(self, content: bytes, headers: Mapping[str, str]) -> Reply:
        shape_header = headers.get("x-blitz-shape")
        dtype = headers.get("x-blitz-dtype", "float32")
        if dtype != "float32":
            raise _malformed(f"x-blitz-dtype is {dtype!r}, expected float32")
        try:
            shape = tuple(int(d) for d in (shape_header or "").split(","))
        except ValueError as exc:
            raise _malformed(f"bad x-blitz-shape {shape_header!r}") from exc
        if len(shape) != 2 or len(content) != shape[0] * shape[1] * 4:
            raise _malformed(f"{len(content)} bytes do not fit x-blitz-shape {shape_header!r}")
        return Reply(np.frombuffer(content, dtype="<f4").reshape(shape))


class OpenAIFloat(Api):
    name = "openai-float"
    default_path = "/v1/embeddings"
    encoding_format = "float"

    def request(self, texts: list[str], model: str) -> Request:
        body = orjson.dumps({"input": texts, "model": model,
                             "encoding_format": self.encoding_format})
        return Request(self.path, body, {"content-type": "application/json",
                                         "accept": "application/json"})

    def parse(self, content: bytes, headers: Mapping[str, str]) -> Reply:
        reply = _load_json(content)
        data = reply.get("data") if isinstance(reply, Mapping) else None
        if not isinstance(data, list):
            raise _malformed("reply has no 'data' list")
        try:
            items = sorted(data, key=lambda item: item["index"])
        except (KeyError, TypeError) as exc:
            raise _malformed("a data item has no 'index'") from exc
        if [item["index"] for item in items] != list(range(len(items))):
            raise _malformed("data indices are not 0..n-1")
        tokens = _tokens(reply.get("usage"))
        if not items:
            return Reply(np.zeros((0, 0), np.float32), tokens)
        return Reply(self._matrix([item.get("embedding") for item in items]), tokens)

    def _matrix(self, rows: list[Any]) -> np.ndarray:
        if not all(isinstance(row, list) for row in rows):
            raise _malformed("an embedding is not a list of floats")
        if len({len(row) for row in rows}) != 1:
            raise VerificationError("dimension", "embeddings in one reply differ in size")
        return _float_rows(rows)


class OpenAIBase64(OpenAIFloat):
    name = "openai-base64"
    encoding_format = "base64"

    def _matrix(self, rows: list[Any]) -> np.ndarray:
        if not all(isinstance(row, str) for row in rows):
            raise _malformed("an embedding is not a base64 string")
        try:
            raw = [base64.b64decode(row, validate=True) for row in rows]
        except (binascii.Error, ValueError) as exc:
            raise _malformed("an embedding is not valid base64") from exc
        size = len(raw[0])
        if size % 4:
            raise _malformed(f"base64 embedding of {size} bytes is not float32")
        if any(len(row) != size for row in raw):
            raise VerificationError("dimension", "embeddings in one reply differ in size")
        return np.frombuffer(b"".join(raw), dtype="<f4").reshape(len(raw), size // 4)


APIS: dict[str, type[Api]] = {
    cls.name: cls for cls in (NativeMsgpack, NativeJson, Raw, OpenAIFloat, OpenAIBase64)
}
API_NAMES = tuple(APIS)


def get_api(name: str, path: str | None = None) -> Api:
    try:
        return APIS[name](path)
    except KeyError:
        raise ValueError(f"unknown API {name!r}; choose one of {', '.join(API_NAMES)}") from None


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {api_key}"} if api_key else {}
