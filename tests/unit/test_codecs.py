from __future__ import annotations

import msgpack
import msgpack_numpy
import numpy as np
import pytest

from blitz import codecs
from blitz.errors import ECHO_CHARS, BadRequest, PayloadTooLarge


def test_arrays_round_trip_without_copies_and_read_by_msgpack_numpy():
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    packed = codecs.pack({"embeddings": arr, "n": np.int64(3)})
    decoded = codecs.unpack(packed)
    assert decoded["n"] == 3
    assert np.array_equal(decoded["embeddings"], arr) and not decoded["embeddings"].flags.writeable
    assert np.array_equal(msgpack_numpy.unpackb(packed)["embeddings"], arr)
    assert np.array_equal(codecs.unpack(msgpack_numpy.packb({"x": arr}))["x"], arr)


def test_msgpack_overhead_is_tiny_for_a_32x384_reply():
    arr = np.zeros((32, 384), np.float32)
    assert len(codecs.pack({"embeddings": arr})) <= 1.01 * arr.nbytes


def test_non_contiguous_and_big_endian_arrays_are_sent_correctly():
    arr = np.arange(20, dtype=">f4").reshape(4, 5)[:, ::2]
    assert np.array_equal(codecs.unpack(codecs.pack({"a": arr}))["a"], arr)


@pytest.mark.parametrize("payload", [
    b"\xc1",                                       # never-used byte
    b"\x92\x01",                                   # truncated array
    b"\x81\x01\x02",                               # int map key (strict_map_key)
    b"\x81\xa1a\x01\x00",                          # trailing bytes
    msgpack_numpy.packb({"x": np.array(["a"], dtype=object)}),   # pickled object array
    msgpack_numpy.packb({"x": np.zeros(3, "U3")}),               # unicode dtype
    msgpack.packb({b"nd": True, b"type": "<f4", b"kind": b"", b"shape": [10, 10],
                   b"data": b"\x00" * 8}),        # size mismatch
    msgpack.packb({b"nd": True, b"type": "<f4", b"kind": b"", b"shape": [-1],
                   b"data": b""}),                # negative shape
    msgpack.packb({b"nd": True, b"type": "<f4", b"kind": b"", b"shape": [1],
                   b"data": "abcd"}),             # data not bytes
])
def test_hostile_payloads_are_rejected_with_bad_request(payload):
    with pytest.raises(BadRequest):
        codecs.unpack(payload)


def test_buffer_limit():
    with pytest.raises(BadRequest, match="more than"):
        codecs.unpack(codecs.pack({"t": "x" * 100}), max_buffer_size=50)


def test_decode_body_by_content_type_and_sniffing():
    assert codecs.decode_body(b'{"a": 1}', "application/json", 1000) == {"a": 1}
    assert codecs.decode_body(codecs.pack({"a": 1}), "application/x-msgpack", 1000) == {"a": 1}
    assert codecs.decode_body(b'{"a": 1}', None, 1000) == {"a": 1}
    assert codecs.decode_body(codecs.pack({"a": 1}), None, 1000) == {"a": 1}
    with pytest.raises(BadRequest, match="unsupported content type"):
        codecs.decode_body(b"a", "text/html", 1000)
    with pytest.raises(BadRequest, match="empty"):
        codecs.decode_body(b"", "application/json", 1000)
    with pytest.raises(BadRequest, match="JSON"):
        codecs.decode_body(b"{nope", "application/json", 1000)


@pytest.mark.parametrize(("accept", "expected"), [
    (None, "msgpack"), ("", "msgpack"), ("*/*", "msgpack"),
    ("application/json", "json"), ("application/octet-stream", "raw"),
    ("application/x-msgpack", "msgpack"),
    ("application/json;q=0.5, application/msgpack", "msgpack"),
    ("text/html, application/json", "json"),
    ("application/json;q=0", "msgpack"),
])
def test_reply_format_negotiation(accept, expected):
    assert codecs.choose_reply(accept)[0] == expected


@pytest.mark.parametrize(("accept", "expected"), [
    (None, ("msgpack", None)),
    ("application/msgpack; layout=portable", ("msgpack", "portable")),
    ('application/x-msgpack;q=0.9;layout="numpy"', ("msgpack", "numpy")),
    ("application/json, application/msgpack; layout=Portable; q=0.5", ("json", None)),
    ("application/json; q=0.1, application/msgpack; layout=portable", ("msgpack", "portable")),
    ("application/json; layout=whatever", ("json", None)),  # only msgpack ranges have one
])
def test_reply_layout_negotiation(accept, expected):
    assert codecs.choose_reply(accept) == expected


def test_an_unknown_layout_in_accept_is_a_bad_request():
    with pytest.raises(BadRequest, match="numpy, portable"):
        codecs.choose_reply("application/msgpack; layout=js")


@pytest.mark.parametrize("refuse", [
    lambda junk: codecs.decode_body(b"x", f"text/{junk}", 1000),
    lambda junk: codecs.choose_reply(f"application/msgpack; layout={junk}"),
])
def test_errors_echo_only_a_prefix_of_a_header(refuse):
    with pytest.raises(BadRequest) as info:
        refuse("x" * 100_000)
    assert "x" * (ECHO_CHARS - 10) in info.value.message and len(info.value.message) < 200


def test_the_json_container_limit_skips_brackets_in_strings_and_escapes():
    tricky = rb'{"texts":["[[{{\\", "\"[{", "\\\"[[", "a"], "x": [[], {}]}'
    assert codecs.loads_json(tricky, max_containers=5)["x"] == [[], {}]
    with pytest.raises(PayloadTooLarge):
        codecs.loads_json(tricky, max_containers=4)


def _peak(decode, out: list | None = None) -> int:
    """The most memory ``decode()`` held at once; what it returned or raised (a 413)
    is appended to ``out``."""
    import tracemalloc

    tracemalloc.start()
    try:
        result = decode()
    except PayloadTooLarge as refused:
        result = refused
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    if out is not None:
        out.append(result)
    return peak


def test_a_decode_stays_a_small_multiple_of_the_body():
    """A body of tiny strings decodes to many times its size. With the
    bounds an ingress uses (2048 texts, 1M token ids) such a body is refused before it is
    decoded. Numbers stay the dear case (about 84 bytes each once decoded, ~20x a body of
    3-digit token ids): their count is bounded by the token-id limit instead."""
    max_containers, max_values = 2 * 2048 + 64, 1_048_576 + 2 * (2 * 2048 + 64) + 64
    tiny = b'{"texts":[' + b'"ab",' * 1_000_000 + b'"ab"]}'
    assert _peak(lambda: codecs.loads_json(tiny, max_containers, max_values)) < len(tiny)
    with pytest.raises(PayloadTooLarge, match="strings"):
        codecs.loads_json(tiny, max_containers, max_values)
    ids = b'{"input":[[' + b"257," * 1_000_000 + b"257]]}"
    assert len(codecs.loads_json(ids, max_containers, max_values)["input"][0]) == 1_000_001
    # Python's ints and list: 36 bytes an id (orjson's parse tree doubled it: 21x)
    assert _peak(lambda: codecs.loads_json(ids, max_containers, max_values)) < 12 * len(ids)
    more = b'{"input":[[' + b"257," * 1_100_000 + b"257]]}"
    with pytest.raises(PayloadTooLarge, match="values"):
        codecs.loads_json(more, max_containers, max_values)


def test_a_msgpack_decode_stays_a_small_multiple_of_the_body():
    """The same for msgpack: a 2-character string is 3 bytes on the wire and about 60
    once decoded, so a body of a million of them is refused before unpacking; a body of
    a million token ids whose bytes look like string headers is walked, then unpacked;
    one of more token ids than a request may hold is refused before unpacking."""
    max_containers = 2 * 2048 + 64
    tiny = codecs.pack({"texts": ["ab"] * 1_000_000})
    assert _peak(lambda: codecs.unpack(tiny, len(tiny), max_containers)) < len(tiny)
    with pytest.raises(PayloadTooLarge, match="strings"):
        codecs.unpack(tiny, len(tiny), max_containers)
    max_values = 200_000  # a smaller token-id limit than the default: the same ratios
    decoded: list = []
    ids = codecs.pack({"input": [[421] * 190_000]})  # 421 is 0xcd 0x01 0xa5
    assert _peak(lambda: codecs.unpack(ids, len(ids), max_containers, max_values),
                 decoded) < 15 * len(ids)  # Python's ints and list: 36 bytes an id
    assert len(decoded[0]["input"][0]) == 190_000
    more = codecs.pack({"input": [[421] * 220_000]})  # past the token-id limit: not built
    assert _peak(lambda: codecs.unpack(more, len(more), max_containers, max_values),
                 decoded) < len(more)
    assert isinstance(decoded[1], PayloadTooLarge) and "values" in decoded[1].message
    texts = ["ключ, 中文 text"] * 2048  # continuation bytes that look like string headers
    assert codecs.unpack(codecs.pack({"texts": texts}), 1 << 20, max_containers) == {
        "texts": texts}


def test_an_unterminated_string_full_of_escaped_quotes_is_refused_at_once():
    body = b"[" * 5000 + b'"' + b'\\"' * 200_000  # quadratic for a backtracking pre-scan
    with pytest.raises(PayloadTooLarge):
        codecs.loads_json(body, max_containers=4160)
    with pytest.raises(BadRequest, match="not valid JSON"):
        codecs.loads_json(b'["' + b'[\\"' * 200_000, max_containers=4160)


@pytest.mark.parametrize("array", [
    np.arange(6, dtype=np.float32).reshape(2, 3),
    np.arange(6, dtype=">f4").reshape(2, 3),                 # big-endian: sent little
    np.arange(12, dtype=np.float16).reshape(3, 4)[:, ::2],   # non-contiguous
    np.array([[-127, 0, 127]], dtype=np.int8),
    np.array([[0, 255]], dtype=np.uint8),
])
def test_portable_arrays_round_trip(array):
    data, shape, dtype = codecs.portable_array(array)
    assert dtype[0] in "<|" and shape == list(array.shape)
    rebuilt = codecs.from_portable(bytes(data), shape, dtype)
    assert np.array_equal(rebuilt, array) and rebuilt.dtype == array.dtype.newbyteorder("<")


@pytest.mark.parametrize(("data", "shape", "dtype"), [
    (b"\x00" * 8, [3], "<f4"),       # size mismatch
    (b"\x00" * 4, [1], "|O"),        # object dtype
    ("abcd", [1], "<f4"),            # not bytes
    (b"\x00" * 4, [True], "<f4"),    # boolean in shape
])
def test_hostile_portable_arrays_are_rejected(data, shape, dtype):
    with pytest.raises(BadRequest):
        codecs.from_portable(data, shape, dtype)


def test_json_serializes_numpy_directly_and_base64_is_little_endian():
    arr = np.array([[1.5, -2.0]], dtype=np.float32)
    assert codecs.dumps_json({"e": arr}) == b'{"e":[[1.5,-2.0]]}'
    import base64
    raw = base64.b64decode(codecs.to_base64(arr[0].astype(">f4")))
    assert np.array_equal(np.frombuffer(raw, "<f4"), arr[0])
