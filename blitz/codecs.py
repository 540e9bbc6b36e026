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
import math
from typing import Any, Literal

import msgpack
import numpy as np
import orjson

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


def _too_many_containers(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"body has more than {limit} lists and objects; a request needs "
                           "about one per text (send fewer texts per request)")


def unpack(data: bytes, max_buffer_size: int = DEFAULT_MAX_BUFFER,
           max_containers: int | None = None) -> Any:
    """Decode msgpack from an untrusted peer; arrays come back as read-only numpy views.

    ``max_containers`` bounds the arrays and maps in the body: a few bytes each on the
    wire, tens of bytes and a Python call each once decoded, so a body of millions of
    empty ones is refused as soon as the bound is crossed, not after building them all.
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


# JSON's string delimiter, escape and container openers, as byte values
_QUOTE, _BACKSLASH, _OPENERS, _COMMA = ord('"'), ord("\\"), (ord("["), ord("{")), ord(",")
# bytes per vectorized pass: its temporary arrays stay small (under glibc's threshold for
# mapping memory afresh on each allocation) and in the CPU's caches
_SCAN_CHUNK = 16 * 1024


def _json_over(data: bytes, max_containers: int, max_values: int) -> str | None:
    """Which bound ``data`` crosses, if any: more than ``max_containers`` lists and
    objects (``[`` and ``{`` outside strings), more than ``max_values`` values (commas
    outside strings, plus the containers) or more than ``2 * max_containers + 64``
    strings. Each decoded value costs tens of bytes for a few on the wire (a 3-byte
    string is a 50-byte ``str``), so these bounds keep a decode within a small multiple
    of the body (issue #33: orjson peaked at 13-17x a body of tiny strings).

    Counting every bracket, comma and quote settles it when each count is within its
    bound (a quote inside a string only adds). Otherwise one pass over fixed-size chunks
    finds the strings (a quote opens or closes one unless it follows an odd run of
    backslashes), vectorized, and stops once a bound is crossed: linear in the size of
    ``data`` whatever its bytes, with no regex to backtrack. Between chunks it carries
    only whether a string is open and whether the next byte is escaped.
    """
    max_strings = 2 * max_containers + 64
    containers, commas = data.count(b"[") + data.count(b"{"), data.count(b",")
    if (containers <= max_containers and containers + commas <= max_values
            and data.count(b'"') <= 2 * max_strings):
        return None
    counts, inside, escaped = [0, 0, 0], False, False  # containers, commas, quotes
    for start in range(0, len(data), _SCAN_CHUNK):
        end = min(start + _SCAN_CHUNK, len(data))
        if not escaped and data.find(b'"', start, end) < 0 and not data.endswith(
                b"\\", start, end):  # no string starts or ends here
            if not inside:
                counts[0] += data.count(b"[", start, end) + data.count(b"{", start, end)
                counts[1] += data.count(b",", start, end)
        else:
            inside, escaped = _count_chunk(
                np.frombuffer(data, np.uint8, end - start, start), counts, inside, escaped)
        if counts[0] > max_containers:
            return f"more than {max_containers} lists and objects"
        if counts[0] + counts[1] > max_values:
            return f"more than {max_values} values"
        if counts[2] > 2 * max_strings:
            return f"more than {max_strings} strings"
    return None


def _count_chunk(chunk: np.ndarray, counts: list[int], inside: bool,
                 escaped: bool) -> tuple[bool, bool]:
    """Add the brackets and commas outside strings in ``chunk`` and its quotes that
    delimit strings to ``counts``; whether a string is open after it and whether the
    byte after it is escaped. ``inside`` and ``escaped`` say the same of its start."""
    quotes = chunk == _QUOTE
    backslashes = chunk == _BACKSLASH
    if escaped:  # its first byte is an escaped quote or backslash: neither counts
        quotes[0] = backslashes[0] = False
    escapes_next = False
    if backslashes.any():
        edges = np.diff(backslashes.view(np.int8), prepend=np.int8(0), append=np.int8(0))
        starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        after_odd = ends[(ends - starts) % 2 == 1]  # a run of odd length escapes this byte
        if len(after_odd) and after_odd[-1] == len(chunk):
            escapes_next, after_odd = True, after_odd[:-1]
        quotes[after_odd] = False
    in_string = np.bitwise_xor.accumulate(quotes.view(np.uint8)) != inside
    openers = (chunk == _OPENERS[0]) | (chunk == _OPENERS[1])
    counts[0] += int(np.count_nonzero(openers & ~in_string))
    counts[1] += int(np.count_nonzero((chunk == _COMMA) & ~in_string))
    counts[2] += int(np.count_nonzero(quotes))
    return bool(in_string[-1]), escapes_next


def loads_json(data: bytes, max_containers: int | None = None,
               max_values: int | None = None) -> Any:
    """Parse JSON from an untrusted peer; ``max_containers`` as in ``unpack``, and at
    most ``max_values`` values (``_json_over``; None: no bound)."""
    if max_containers is not None:
        crossed = _json_over(data, max_containers,
                             len(data) + 1 if max_values is None else max_values)
        if crossed is not None:
            raise PayloadTooLarge(f"body has {crossed}; max_texts_per_request and "
                                  "max_token_ids_per_request bound them (a text needs about "
                                  "one list or object and a string, a token id one value)")
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
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
        return unpack(body, max_bytes, max_containers)
    if base in (JSON_TYPE, "text/json") or base.endswith("+json"):
        return loads_json(body, max_containers, max_values)
    if base in ("", RAW_TYPE, "application/x-www-form-urlencoded", "text/plain"):
        if body.lstrip()[:1] in (b"{", b"["):
            return loads_json(body, max_containers, max_values)
        return unpack(body, max_bytes, max_containers)
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
