"""Wire codecs: msgpack (two array layouts), JSON, base64 and raw bytes.

Safe for strangers' bytes: no pickle, an allow-list of numeric dtypes, a size check on
every array, ``max_buffer_size`` and ``strict_map_key`` on every unpack; nothing here
patches msgpack. A reply's array travels in one of two layouts (``ArrayLayout``):

- ``numpy`` (the default): msgpack-numpy's map ``{b"nd": True, b"type", b"kind",
  b"shape", b"data"}``, so ``msgpack_numpy.unpackb`` and ``unpack`` here rebuild the
  array. Its keys are msgpack *bin*, which decoders outside Python refuse as map keys
  (JavaScript's ``@msgpack/msgpack``: "The type of key must be string or number").
- ``portable``: string keys only; the array is its little-endian C-ordered bytes (bin)
  beside its ``shape`` (list of ints) and ``dtype`` (numpy's ``dtype.str``: ``"<f4"``,
  ``"<f2"``, ``"|i1"``, ``"|u1"``), so any msgpack decoder reads it
  (``portable_array``/``from_portable``).

A client picks the layout with ``Accept: application/msgpack; layout=portable``
(``choose_reply``) or a route's body field.
"""

from __future__ import annotations

import base64
import json
import math
from typing import Any, Literal

import msgpack
import numpy as np
import orjson

from blitz import body_scan
from blitz.errors import BadRequest, PayloadTooLarge, echo

MSGPACK_TYPES = ("application/msgpack", "application/x-msgpack", "application/vnd.msgpack")
JSON_TYPE = "application/json"
RAW_TYPE = "application/octet-stream"

ReplyFormat = Literal["msgpack", "json", "raw"]
ArrayLayout = Literal["numpy", "portable"]
ARRAY_LAYOUTS: tuple[ArrayLayout, ...] = ("numpy", "portable")

# dtype.str of every array the codecs accept; object, string and void dtypes never decode.
ALLOWED_DTYPES = frozenset(
    {"<f2", "<f4", "<f8", "|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "|b1"}
)
DEFAULT_MAX_BUFFER = 64 * 1024 * 1024
MAX_DIMS = 32  # numpy 1's limit (numpy 2 takes 64); an embedding has 2


def _encode_ndarray(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        if obj.dtype.str not in ALLOWED_DTYPES:
            obj = obj.astype(obj.dtype.newbyteorder("<"))
            if obj.dtype.str not in ALLOWED_DTYPES:
                raise TypeError(f"dtype {obj.dtype} cannot be sent")
        data = obj.data if obj.flags.c_contiguous else np.ascontiguousarray(obj).data
        return {b"nd": True, b"type": obj.dtype.str, b"kind": b"", b"shape": list(obj.shape),
                b"data": data}
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot serialize {type(obj).__name__}")


def _decode_ndarray(obj: dict) -> Any:
    if obj.get(b"nd") is not True:
        return obj
    kind = obj.get(b"kind")
    if not (kind is None or (isinstance(kind, (bytes, str)) and not kind)):
        raise BadRequest("array kind must be empty (object arrays are not accepted)")
    return _checked_array(obj.get(b"type"), obj.get(b"shape"), obj.get(b"data"))


def _checked_array(dtype_str: Any, shape: Any, data: Any) -> np.ndarray:
    """A read-only array over ``data``, after checking dtype, shape and size."""
    if isinstance(dtype_str, bytes):
        dtype_str = dtype_str.decode("ascii", "replace")
    if not isinstance(dtype_str, str) or dtype_str not in ALLOWED_DTYPES:
        shown = echo(dtype_str) if isinstance(dtype_str, str) else type(dtype_str).__name__
        raise BadRequest(f"array dtype {shown!r} is not allowed")
    if not isinstance(shape, (list, tuple)) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise BadRequest("array shape must be a list of non-negative integers")
    if len(shape) > MAX_DIMS:  # before the product: a long list of big ints is slow to multiply
        raise BadRequest(f"array shape has {len(shape)} dimensions, more than {MAX_DIMS}")
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise BadRequest("array data must be bytes")
    dtype = np.dtype(dtype_str)
    needs = math.prod(shape) * dtype.itemsize
    if needs != len(data):
        raise BadRequest(f"array data is {len(data)} bytes, shape {echo(list(shape))} of "
                         f"{dtype_str} needs {needs}")
    try:
        return np.frombuffer(data, dtype=dtype).reshape(shape)
    except ValueError as exc:  # an empty array with a dimension over numpy's size limit
        raise BadRequest(f"array shape {echo(list(shape))} is too large") from exc


def portable_array(array: np.ndarray) -> tuple[bytes | memoryview, list[int], str]:
    """``array`` in the portable layout: (little-endian bytes, shape, ``dtype.str``)."""
    data = to_raw(array)
    return data, list(array.shape), array.dtype.newbyteorder("<").str


def from_portable(data: Any, shape: Any, dtype: Any) -> np.ndarray:
    """The array a portable-layout reply carries, checked as on unpack (read-only view)."""
    return _checked_array(dtype, shape, data)


def pack(obj: Any) -> bytes:
    """msgpack bytes for ``obj``; numpy arrays travel without copies into Python lists."""
    return msgpack.packb(obj, default=_encode_ndarray, use_bin_type=True)


_BOUNDED_BY = ("max_texts_per_request and max_token_ids_per_request bound them (a text "
               "needs about one list or object and a string, a token id one value)")


def _too_many_containers(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"body has more than {limit} lists and objects; a request needs "
                           "about one per text (send fewer texts per request)")


def unpack(data: bytes, max_buffer_size: int = DEFAULT_MAX_BUFFER,
           max_containers: int | None = None, max_values: int | None = None) -> Any:
    """Decode msgpack from an untrusted peer; arrays come back as read-only numpy views.

    ``max_containers`` bounds the arrays and maps in the body: a few bytes each on the
    wire, tens of bytes and a Python call each once decoded, so a body of millions of
    empty ones is refused as soon as the bound is crossed, not after building them all.
    With it, the strings and the other values are counted before anything is built
    (``body_scan.msgpack_over``; ``max_values`` None: no bound but the body's size).
    """
    if len(data) > max_buffer_size:
        raise BadRequest(f"msgpack body is {len(data)} bytes, more than {max_buffer_size}")
    object_hook, list_hook = _decode_ndarray, None
    if max_containers is not None:
        seen = [0]

        def count(obj: Any) -> Any:
            seen[0] += 1
            if seen[0] > max_containers:
                raise _too_many_containers(max_containers)
            return obj

        def object_hook(obj: dict) -> Any:
            return _decode_ndarray(count(obj))

        list_hook = count
        crossed = body_scan.msgpack_over(data, max_containers,
                                         len(data) if max_values is None else max_values)
        if crossed is not None:
            raise PayloadTooLarge(f"body has {crossed}; {_BOUNDED_BY}")
    try:
        return msgpack.unpackb(
            data, raw=False, strict_map_key=True, object_hook=object_hook,
            list_hook=list_hook, use_list=True,
            max_bin_len=max_buffer_size, max_str_len=max_buffer_size,
            max_array_len=max_buffer_size, max_map_len=max_buffer_size // 2,
            max_ext_len=max_buffer_size,
        )
    except msgpack.ExtraData as exc:
        raise BadRequest(f"msgpack body has {len(exc.extra)} trailing bytes") from None
    except (BadRequest, PayloadTooLarge):
        raise
    except Exception as exc:  # msgpack raises many unrelated types on bad input
        raise BadRequest(f"body is not valid msgpack ({type(exc).__name__}: {exc})") from exc


def dumps_json(obj: Any) -> bytes:
    """JSON bytes; numpy arrays are written straight from their buffers by orjson."""
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY, default=_json_default)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):  # non-contiguous or non-native arrays
        return np.ascontiguousarray(obj, dtype=obj.dtype.newbyteorder("=")).tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot serialize {type(obj).__name__}")


def loads_json(data: bytes, max_containers: int | None = None,
               max_values: int | None = None) -> Any:
    """Parse JSON from an untrusted peer; ``max_containers`` as in ``unpack``, and at
    most ``max_values`` values (``body_scan.json_over``; None: no bound).

    orjson is the faster parser, but its parse tree costs about 50 bytes per value on
    top of the Python objects (a body of a million 3-digit token ids peaked at 21x its
    size). A body of more than ``_MANY_VALUES`` values and no escapes (where the two
    parsers agree byte for byte on what is valid) goes to the standard library's, which
    builds the objects alone (10x that body, 7x one of 5-digit ids: what Python ints and
    a list cost).
    """
    if max_containers is not None:
        crossed = body_scan.json_over(data, max_containers,
                                      len(data) + 1 if max_values is None else max_values)
        if crossed is not None:
            raise PayloadTooLarge(f"body has {crossed}; {_BOUNDED_BY}")
    if data.count(b",") > _MANY_VALUES and b"\\" not in data:
        return _loads_plain_json(data)
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"body is not valid JSON: {exc}") from exc


_MANY_VALUES = 65_536


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def _loads_plain_json(data: bytes) -> Any:
    """``data`` (no backslash in it) by the standard library's parser, refusing what
    orjson refuses: NaN and Infinity, numbers out of a double's range, bytes that are not
    UTF-8. An integer past 64 bits stays an int (orjson makes it a float): the field that
    reads it refuses either."""
    try:
        return json.loads(data.decode("utf-8"), parse_constant=_refuse_constant,
                          parse_float=_finite)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError
        raise BadRequest(f"body is not valid JSON: {exc}") from exc


def to_base64(array: np.ndarray) -> str:
    """Little-endian bytes of ``array`` in base64 (OpenAI's ``encoding_format=base64``)."""
    return base64.b64encode(to_raw(array)).decode("ascii")


def to_raw(array: np.ndarray) -> bytes | memoryview:
    """Little-endian C-ordered bytes of ``array``, without a copy when already so."""
    le = array.dtype.newbyteorder("<")
    if array.dtype != le and array.dtype.byteorder not in ("|", "="):
        array = array.astype(le)
    elif array.dtype.byteorder == "=" and not np.little_endian:
        array = array.astype(le)
    return np.ascontiguousarray(array).data.cast("B")


def is_msgpack(content_type: str | None) -> bool:
    base = (content_type or "").split(";")[0].strip().lower()
    return base in MSGPACK_TYPES


def decode_body(body: bytes, content_type: str | None, max_bytes: int,
                max_containers: int | None = None, max_values: int | None = None) -> Any:
    """The request body as Python objects, from msgpack or JSON by its content type.

    A missing content type is sniffed: JSON starts with ``{`` or ``[``, msgpack otherwise.
    ``max_containers`` and ``max_values`` bound what a body may build (``loads_json``).
    """
    if not body:
        raise BadRequest("request body is empty")
    base = (content_type or "").split(";")[0].strip().lower()
    if base in MSGPACK_TYPES:
        return unpack(body, max_bytes, max_containers, max_values)
    if base in (JSON_TYPE, "text/json") or base.endswith("+json"):
        return loads_json(body, max_containers, max_values)
    if base in ("", RAW_TYPE, "application/x-www-form-urlencoded", "text/plain"):
        if body.lstrip()[:1] in (b"{", b"["):
            return loads_json(body, max_containers, max_values)
        return unpack(body, max_bytes, max_containers, max_values)
    raise BadRequest(f"unsupported content type {echo(base)!r}; send application/msgpack or "
                     "application/json")


def choose_reply(accept: str | None,
                 default: ReplyFormat = "msgpack") -> tuple[ReplyFormat, ArrayLayout | None]:
    """The format the client's Accept header prefers (``default`` when it names none) and
    the ``layout`` parameter of the msgpack range it chose (None when it names none)."""
    best: tuple[float, int, ReplyFormat, ArrayLayout | None] | None = None
    for position, part in enumerate((accept or "").split(",")):
        fields = [f.strip() for f in part.split(";")]
        media = fields[0].lower()
        quality, layout = 1.0, None
        for f in fields[1:]:
            name, _, value = f.partition("=")
            name, value = name.strip().lower(), value.strip().strip('"')
            if name == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
            elif name == "layout" and media in MSGPACK_TYPES:
                layout = _layout(value)
        fmt: ReplyFormat | None = (
            "msgpack" if media in MSGPACK_TYPES
            else "json" if media in (JSON_TYPE, "text/json")
            else "raw" if media == RAW_TYPE
            else None
        )
        if fmt and quality > 0 and (best is None or (quality, -position) > (best[0], -best[1])):
            best = (quality, position, fmt, layout)
    return (best[2], best[3]) if best else (default, None)


def _layout(value: str) -> ArrayLayout:
    for layout in ARRAY_LAYOUTS:
        if value.lower() == layout:
            return layout
    raise BadRequest(f"Accept names layout={echo(value)!r}; the msgpack layouts are "
                     f"{', '.join(ARRAY_LAYOUTS)}", param="accept")
