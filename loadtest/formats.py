"""Wire formats compared: server encode time, client decode time and bytes per reply.

In the spirit of the "serving numpy arrays" experiment, on the code paths Blitz really
runs: replies are built with ``blitz.codecs`` the way the server builds them, and read
back with the load generator's parsers in ``loadtest.apis`` (or, for the baselines,
what a plain client would write). Every format must give back the exact float32 array.

- ``json-naive``: ``json.dumps(array.tolist())`` / ``json.loads`` (the usual baseline);
- ``json-orjson``: ``codecs.dumps_json`` with ``OPT_SERIALIZE_NUMPY`` (native JSON reply);
- ``msgpack``: ``codecs.pack`` / ``codecs.unpack`` (the native default reply);
- ``msgpack-numpy-client``: the same bytes read by ``msgpack_numpy`` (a third-party client);
- ``raw``: little-endian float32 bytes with ``x-blitz-shape`` (``Accept: octet-stream``);
- ``openai-float`` / ``openai-base64``: the OpenAI reply, one item per row.
"""

from __future__ import annotations

import json
import statistics
import timeit
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import msgpack
import msgpack_numpy
import numpy as np

from blitz import codecs
from loadtest.apis import NativeJson, NativeMsgpack, OpenAIBase64, OpenAIFloat, Raw
from loadtest.report import environment, fmt, markdown_table

SHAPES: tuple[tuple[int, int], ...] = ((32, 384), (256, 1024))
Reply = tuple[bytes, dict[str, str]]  # body and headers, as the server would send them


@dataclass(frozen=True)
class Format:
    name: str
    encode: Callable[[np.ndarray], Reply]
    decode: Callable[[bytes, dict[str, str]], np.ndarray]


def _usage(a: np.ndarray) -> dict[str, int]:
    return {"prompt_tokens": 25 * len(a), "total_tokens": 25 * len(a)}


def _native_map(a: np.ndarray) -> dict[str, Any]:
    return {"model": "minilm", "embeddings": a, "shape": list(a.shape), "dtype": "float32",
            "usage": _usage(a)}


def _openai(a: np.ndarray, rows: Callable[[np.ndarray], Any]) -> Reply:
    data = [{"object": "embedding", "index": i, "embedding": rows(row)}
            for i, row in enumerate(a)]
    return codecs.dumps_json({"object": "list", "data": data, "model": "minilm",
                              "usage": _usage(a)}), {}


def _json_naive_encode(a: np.ndarray) -> Reply:
    return json.dumps({**_native_map(a), "embeddings": a.tolist()}).encode(), {}


def _json_naive_decode(body: bytes, headers: dict[str, str]) -> np.ndarray:
    return np.asarray(json.loads(body)["embeddings"], dtype=np.float32)


def _raw_encode(a: np.ndarray) -> Reply:
    headers = {"x-blitz-shape": f"{a.shape[0]},{a.shape[1]}", "x-blitz-dtype": "float32"}
    return bytes(codecs.to_raw(a)), headers


def _msgpack_numpy_decode(body: bytes, headers: dict[str, str]) -> np.ndarray:
    return msgpack.unpackb(body, object_hook=msgpack_numpy.decode, raw=False)["embeddings"]


FORMATS: tuple[Format, ...] = (
    Format("json-naive", _json_naive_encode, _json_naive_decode),
    Format("json-orjson", lambda a: (codecs.dumps_json(_native_map(a)), {}),
           lambda b, h: NativeJson().parse(b, h).embeddings),
    Format("msgpack", lambda a: (codecs.pack(_native_map(a)), {}),
           lambda b, h: NativeMsgpack().parse(b, h).embeddings),
    Format("msgpack-numpy-client", lambda a: (codecs.pack(_native_map(a)), {}),
           _msgpack_numpy_decode),
    Format("raw", _raw_encode, lambda b, h: Raw().parse(b, h).embeddings),
    Format("openai-float", lambda a: _openai(a, lambda row: row),
           lambda b, h: OpenAIFloat().parse(b, h).embeddings),
    Format("openai-base64", lambda a: _openai(a, codecs.to_base64),
           lambda b, h: OpenAIBase64().parse(b, h).embeddings),
)


@dataclass(frozen=True)
class FormatRow:
    format: str
    rows: int
    dim: int
    bytes: int
    encode_us: float
    decode_us: float

    @property
    def total_us(self) -> float:
        return self.encode_us + self.decode_us


def time_call(fn: Callable[[], Any], repeat: int = 5, min_time_s: float = 0.05) -> float:
    """Median seconds per call over ``repeat`` rounds of at least ``min_time_s`` each."""
    timer = timeit.Timer(fn)
    number = 1
    while timer.timeit(number) < min_time_s:
        number *= 2
    return statistics.median(timer.repeat(repeat, number)) / number


def example_embeddings(rows: int, dim: int, seed: int = 0) -> np.ndarray:
    a = np.random.default_rng(seed).standard_normal((rows, dim), dtype=np.float32)
    return a / np.linalg.norm(a, axis=1, keepdims=True)


def compare(shapes: Sequence[tuple[int, int]] = SHAPES,
            formats: Sequence[Format] = FORMATS, min_time_s: float = 0.05) -> list[FormatRow]:
    out = []
    for rows, dim in shapes:
        a = example_embeddings(rows, dim)
        for f in formats:
            body, headers = f.encode(a)
            decoded = f.decode(body, headers)
            if decoded.dtype != np.float32 or not np.array_equal(decoded, a):
                raise AssertionError(f"{f.name} does not round-trip a {rows}x{dim} array")
            out.append(FormatRow(
                f.name, rows, dim, len(body),
                1e6 * time_call(lambda f=f, a=a: f.encode(a), min_time_s=min_time_s),
                1e6 * time_call(lambda f=f, b=body, h=headers: f.decode(b, h),
                                min_time_s=min_time_s),
            ))
    return out


def document(rows: Sequence[FormatRow]) -> dict[str, Any]:
    return {"kind": "formats", "environment": environment(),
            "results": [{**asdict(r), "total_us": r.total_us} for r in rows]}


def markdown(rows: Sequence[FormatRow]) -> str:
    headers = ["shape", "format", "bytes", "x raw", "server encode us", "client decode us",
               "encode+decode us", "speed-up vs json-naive"]
    raw = {(r.rows, r.dim): r.bytes for r in rows if r.format == "raw"}
    naive = {(r.rows, r.dim): r.total_us for r in rows if r.format == "json-naive"}
    body = []
    for r in rows:
        key = (r.rows, r.dim)
        body.append([f"{r.rows}x{r.dim}", r.format, f"{r.bytes:,}",
                     fmt(r.bytes / raw[key], 2) if key in raw else "-",
                     fmt(r.encode_us), fmt(r.decode_us), fmt(r.total_us),
                     fmt(naive[key] / r.total_us, 1) if key in naive else "-"])
    return markdown_table(headers, body)
