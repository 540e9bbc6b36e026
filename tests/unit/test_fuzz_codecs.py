"""Property-based tests of the wire codecs (blitz/codecs.py) on strangers' bytes.

Two promises, for any input: only a ``BlitzError`` escapes a parser, and a parser's cost
grows linearly with the size of its input (a body twice as large costs at most 2.5
times as much; no absolute times). ``HYPOTHESIS_PROFILE=long`` runs many more examples.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from blitz import body_scan, codecs
from blitz.errors import BadRequest, BlitzError, PayloadTooLarge

MAX_BYTES = 32 * 1024 * 1024  # the server's defaults (blitz/settings/config.py Limits, http/api.py)
MAX_CONTAINERS = 2 * 2048 + 64
MAX_RATIO = 2.5


def cost_ratio(build: Callable[[int], Any], call: Callable[[Any], Any], n: int,
               tries: int = 5, budget_s: float = 0.2, sample_s: float = 0.002) -> float:
    """How much more ``call(build(2n))`` costs than ``call(build(n))``.

    Each try times the two sizes in turns, in samples of about ``sample_s`` each (calls
    repeated, fewer of the larger), for ``budget_s``, and keeps each size's fastest
    sample per call. Samples count this thread's CPU time, not the wall clock's, and the
    fastest is the one least disturbed by other processes on a shared machine, which
    samples of equal length are equally likely to meet. A try over ``MAX_RATIO`` is
    taken again, up to ``tries`` times; a quadratic cost is over it in every try.
    """
    small, large = build(n), build(2 * n)

    def per_call(arg: Any, calls: int) -> float:
        started = time.thread_time()
        for _ in range(calls):
            call(arg)
        return (time.thread_time() - started) / calls

    def calls_per_sample(arg: Any) -> int:
        return max(1, math.ceil(sample_s / max(min(per_call(arg, 1) for _ in range(3)), 1e-7)))

    calls_small, calls_large = calls_per_sample(small), calls_per_sample(large)
    ratio = math.inf
    gc.disable()  # collections of earlier tests' garbage are not this cost
    try:
        for _ in range(tries):
            best_small = best_large = math.inf
            ends = time.perf_counter() + budget_s
            for turn in range(1000):
                best_small = min(best_small, per_call(small, calls_small))
                best_large = min(best_large, per_call(large, calls_large))
                if turn >= 4 and time.perf_counter() > ends:
                    break
            ratio = min(ratio, best_large / best_small)
            if ratio <= MAX_RATIO:
                break
    finally:
        gc.enable()
    return ratio


def refused_or_parsed(parse: Callable[..., Any], *args: Any) -> Any:
    """``parse(*args)``, or None when it refuses with a ``BlitzError``; anything else
    raised fails the test."""
    try:
        return parse(*args)
    except BlitzError:
        return None


# --- strategies -------------------------------------------------------------------------

# characters that matter to the JSON pre-scan, among any others (no lone surrogates: JSON
# text is UTF-8)
_SPICY = st.sampled_from('[]{}"\\:,/ ab\n\x00\u00e9\u2028\U0001f600')
_CHARS = st.characters(blacklist_categories=("Cs",))
TEXTS = st.text(_SPICY, max_size=12) | st.text(_CHARS, max_size=12)
JSON_SCALARS = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
                | st.floats(allow_nan=False, allow_infinity=False) | TEXTS)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda kids: st.lists(kids, max_size=5) | st.dictionaries(TEXTS, kids, max_size=5),
    max_leaves=40)

INTS = st.integers(-(2**63), 2**64 - 1)
ND_MAPS = st.fixed_dictionaries({
    b"nd": st.just(True) | st.sampled_from([False, 1, b"", None]),
    b"type": st.sampled_from(sorted(codecs.ALLOWED_DTYPES) + ["|O", "<U3", "|V4", ">f4"])
    | st.binary(max_size=6) | st.text(max_size=6) | INTS | st.lists(st.text(max_size=3)),
    b"kind": st.sampled_from([b"", "", None, b"O", "V", 0]),
    b"shape": st.lists(st.integers(-2, 2**64 - 1) | st.booleans() | st.just(2), max_size=70)
    | INTS | st.text(max_size=3),
    b"data": st.binary(max_size=64) | st.text(max_size=8) | INTS,
})
MSGPACK_SCALARS = (st.none() | st.booleans() | INTS | st.floats() | TEXTS
                   | st.binary(max_size=16)
                   | st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=12)))
MSGPACK_KEYS = TEXTS | st.binary(max_size=8) | st.integers(-5, 5) | st.booleans()
MSGPACK_VALUES = st.recursive(
    MSGPACK_SCALARS | ND_MAPS,
    lambda kids: (st.lists(kids, max_size=5) | st.dictionaries(MSGPACK_KEYS, kids, max_size=5)
                  | ND_MAPS),
    max_leaves=30)

CONTENT_TYPES = st.sampled_from(
    [None, "", "application/json", "application/msgpack", "application/x-msgpack",
     "application/vnd.msgpack", "application/json; charset=utf-8", "text/plain", "text/json",
     "application/octet-stream", "application/x-www-form-urlencoded", "text/html",
     "application/problem+json", "APPLICATION/MSGPACK ; x=1", ";", ";;application/json"],
) | st.text(max_size=40)
LIMITS = st.none() | st.integers(0, 50)


@st.composite
def mutated(draw: st.DrawFn, bodies: st.SearchStrategy[bytes]) -> bytes:
    """A body cut short, with bytes spliced in, or with one byte changed."""
    body = draw(bodies)
    at = draw(st.integers(0, len(body)))
    how = draw(st.sampled_from(["cut", "splice", "flip", "as is"]))
    if how == "cut":
        return body[:at]
    if how == "splice":
        extra = draw(st.binary(max_size=8) | st.sampled_from([b'"', b"\\", b"[", b"{", b"\\\""]))
        return body[:at] + extra + body[at:]
    if how == "flip" and body:
        i = min(at, len(body) - 1)
        return body[:i] + bytes([body[i] ^ draw(st.integers(1, 255))]) + body[i + 1:]
    return body


def containers(value: Any) -> int:
    if isinstance(value, list):
        return 1 + sum(containers(v) for v in value)
    if isinstance(value, dict):
        return 1 + sum(containers(v) for v in value.values())
    return 0


def strings(value: Any) -> int:
    """Strings in ``value``, an object's keys included."""
    if isinstance(value, list):
        return sum(strings(v) for v in value)
    if isinstance(value, dict):
        return sum(1 + strings(v) for v in value.values())
    return isinstance(value, str)


def values(value: Any) -> int:
    """What codecs._json_over counts as values: a container's elements after its first
    (a comma each) plus the containers."""
    if isinstance(value, (list, dict)):
        inner = list(value.values()) if isinstance(value, dict) else value
        return 1 + max(len(inner) - 1, 0) + sum(values(v) for v in inner)
    return 0


JSON_BODIES = JSON_VALUES.map(orjson.dumps)
MSGPACK_BODIES = MSGPACK_VALUES.map(lambda v: msgpack.packb(v, use_bin_type=True))


# --- (a) only BlitzError escapes --------------------------------------------------------

@given(JSON_VALUES, st.integers(0, 40), st.integers(0, 80))
def test_json_is_parsed_exactly_when_within_its_bounds(value, limit, max_values):
    """Containers within ``limit``, values within ``max_values``, strings within
    ``2 * limit + 64`` (so what a decode may build stays a small multiple of the
    body); brackets, commas and quotes inside strings do not count."""
    body = orjson.dumps(value)
    if (containers(value) > limit or values(value) > max_values
            or strings(value) > 2 * limit + 64):
        with pytest.raises(PayloadTooLarge):
            codecs.loads_json(body, limit, max_values)
    else:
        assert codecs.loads_json(body, limit, max_values) == value


def msgpack_strings(value: Any) -> int:
    """Strings msgpack writes for ``value``: str values and str keys."""
    if isinstance(value, list):
        return sum(msgpack_strings(v) for v in value)
    if isinstance(value, dict):
        return sum(isinstance(k, str) + msgpack_strings(v) for k, v in value.items())
    return isinstance(value, str)


def msgpack_values(value: Any) -> int:
    """Objects msgpack writes for ``value`` other than strings: containers, their
    non-string keys, numbers, booleans, nil, bin."""
    if isinstance(value, list):
        return 1 + sum(msgpack_values(v) for v in value)
    if isinstance(value, dict):
        return 1 + sum((not isinstance(k, str)) + msgpack_values(v) for k, v in value.items())
    return not isinstance(value, str)


MANY_SMALL = st.lists(st.text(max_size=2) | st.integers(-300, 70_000) | st.binary(max_size=3),
                      max_size=300)


@given(MSGPACK_VALUES | MANY_SMALL, st.integers(0, 80), st.integers(0, 300))
def test_msgpack_is_counted_exactly(value, limit, max_values):
    """More than ``strings_bound(limit)`` strings or ``max_values`` other objects is
    refused before unpacking, exactly then."""
    body = msgpack.packb(value, use_bin_type=True)
    over = (msgpack_strings(value) > body_scan.strings_bound(limit)
            or msgpack_values(value) > max_values)
    assert (body_scan.msgpack_over(body, limit, max_values) is not None) == over


@given(mutated(MSGPACK_BODIES) | st.binary(max_size=200), st.integers(0, 40),
       st.integers(0, 80))
def test_any_bytes_walk_as_msgpack_without_error(body, limit, max_values):
    assert body_scan.msgpack_over(body, limit, max_values) in (
        None, f"more than {body_scan.strings_bound(limit)} strings",
        f"more than {max_values} values")


@given(st.lists(JSON_VALUES, min_size=1, max_size=4), st.integers(0, 80))
def test_a_body_of_many_values_parses_as_orjson_would(values, filler):
    """Past ``_MANY_VALUES`` values a backslash-free body goes to the standard library's
    parser: what it gives or refuses is what orjson gives or refuses."""
    body = orjson.dumps([*values, *[257] * (codecs._MANY_VALUES + filler)])
    body = body.replace(b"\\", b"")
    for variant in (body, body[:-1], body + b"x", body.replace(b"257", b"1e400", 1),
                    body.replace(b",", b",NaN,", 1), body.replace(b"257", b"\xff", 1)):
        try:
            expected = orjson.loads(variant)
        except orjson.JSONDecodeError:
            with pytest.raises(BadRequest):
                codecs.loads_json(variant)
        else:
            assert codecs.loads_json(variant) == expected


@given(mutated(JSON_BODIES) | st.binary(max_size=200), LIMITS)
def test_any_bytes_as_json_parse_or_are_refused(body, limit):
    refused_or_parsed(codecs.loads_json, body, limit)


@given(mutated(MSGPACK_BODIES) | st.binary(max_size=200), st.integers(0, 300), LIMITS)
def test_any_bytes_as_msgpack_parse_or_are_refused(body, max_buffer, limit):
    refused_or_parsed(codecs.unpack, body, max_buffer, limit)


@given(MSGPACK_VALUES, LIMITS)
def test_arrays_in_msgpack_are_checked_views_or_refused(value, limit):
    decoded = refused_or_parsed(codecs.unpack, msgpack.packb(value, use_bin_type=True),
                                codecs.DEFAULT_MAX_BUFFER, limit)
    stack = [decoded]
    while stack:  # every array that comes out is read-only and of an allowed dtype
        item = stack.pop()
        if isinstance(item, np.ndarray):
            assert item.dtype.str in codecs.ALLOWED_DTYPES and not item.flags.writeable
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


@given(mutated(JSON_BODIES) | mutated(MSGPACK_BODIES) | st.binary(max_size=200),
       CONTENT_TYPES, st.integers(1, 300), LIMITS)
def test_any_body_with_any_content_type_parses_or_is_refused(body, content_type, max_bytes,
                                                            limit):
    refused_or_parsed(codecs.decode_body, body, content_type, max_bytes, limit)


_PARAMS = st.tuples(st.sampled_from(["q", "layout", "Q", " layout ", "x"]) | st.text(max_size=6),
                    st.sampled_from(["0", "1", "0.5", "nan", "-inf", "1e999", '"portable"',
                                     "numpy", "NUMPY", ""]) | st.text(max_size=8))
_RANGES = st.tuples(
    st.sampled_from(["application/msgpack", "application/json", "*/*",
                     "application/octet-stream", "text/json", " APPLICATION/X-MSGPACK "])
    | st.text(max_size=12),
    st.lists(_PARAMS, max_size=3),
).map(lambda r: ";".join([r[0], *(f"{k}={v}" for k, v in r[1])]))
ACCEPTS = st.none() | st.text(max_size=80) | st.lists(_RANGES, max_size=4).map(",".join)


@given(ACCEPTS)
def test_any_accept_header_chooses_a_reply_or_is_refused(accept):
    chosen = refused_or_parsed(codecs.choose_reply, accept)
    if chosen is not None:
        fmt, layout = chosen
        assert fmt in ("msgpack", "json", "raw") and layout in (None, *codecs.ARRAY_LAYOUTS)


_ANY = st.recursive(st.none() | st.booleans() | INTS | st.floats() | st.text(max_size=6)
                    | st.binary(max_size=16), lambda kids: st.lists(kids, max_size=4),
                    max_leaves=10)


@st.composite
def sized_arrays(draw: st.DrawFn) -> tuple[bytes, list[int], str]:
    """Portable arrays whose data has the size their shape and dtype say, shapes of any
    length and dimensions of any size included (empty ones, over numpy's limits)."""
    dtype = draw(st.sampled_from(sorted(codecs.ALLOWED_DTYPES)))
    shape = draw(st.lists(st.sampled_from([0, 1, 1, 2, 3, 2**31, 2**63, 2**64 - 1]),
                          max_size=70))
    size = math.prod(shape) * np.dtype(dtype).itemsize
    return (b"\0" * size if size <= 4096 else b""), shape, dtype


@given(sized_arrays() | st.tuples(
    st.binary(max_size=64) | _ANY,
    st.lists(st.integers(0, 2**64) | st.just(0) | st.just(1), max_size=70) | _ANY,
    st.sampled_from(sorted(codecs.ALLOWED_DTYPES)) | st.binary(max_size=4) | _ANY))
def test_any_portable_array_is_a_checked_view_or_refused(array_parts):
    data, shape, dtype = array_parts
    array = refused_or_parsed(codecs.from_portable, data, shape, dtype)
    if array is not None:
        assert array.nbytes == len(data) and not array.flags.writeable


# --- (b) cost grows linearly ------------------------------------------------------------

def _json(body: bytes) -> Any:
    return refused_or_parsed(codecs.decode_body, body, "application/json", MAX_BYTES,
                             MAX_CONTAINERS)


def _msgpack(body: bytes) -> Any:
    return refused_or_parsed(codecs.decode_body, body, "application/msgpack", MAX_BYTES,
                             MAX_CONTAINERS)


def _nd_shape(n: int) -> bytes:
    return msgpack.packb({b"nd": True, b"type": "<f4", b"kind": b"", b"shape": [2**63] * n,
                          b"data": b""})


# (body at size n, parser, n). The escaped-quote family is the worst case, small enough
# that the quadratic pre-scan it replaced takes seconds, not minutes. Sizes avoid what a
# doubling can cost beyond the parser's own work on a shared machine: bodies stay within
# a few hundred KB, so that one doubling does not move the work from the CPU's caches to
# memory (dearer per byte, most of all while other processes use it too), and "many keys"
# repeats one key, so each pair is parsed and stored but the dict does not grow (a
# growing dict is linear on average, but each insert gets dearer as its table outgrows
# the caches: 2.2 to 3 times the cost per doubling here).
FAMILIES: dict[str, tuple[Callable[[int], Any], Callable[[Any], Any], int]] = {
    "escaped quotes after 5000 [": (
        lambda n: b"[" * 5000 + b'"' + b'\\"' * n, _json, 10_000),
    "escaped quotes in a string, brackets around": (
        lambda n: b'{"texts":["' + b'[\\"' * n + b'"]}', _json, 50_000),
    "unterminated escape-heavy string": (
        lambda n: b'{"texts":["' + b'{\\\\\\"' * n, _json, 30_000),
    "backslash runs": (lambda n: b'["' + b"\\" * n + b'[",' * 5000 + b'"]', _json, 100_000),
    "long string": (lambda n: b'{"texts":["' + b"a" * n + b'"]}', _json, 50_000),
    # sizes past ~25,000 strings: below that, the parse's cost steps up where the
    # allocator starts handing its arenas back to the OS on each call (linear either side)
    "many strings holding brackets": (
        lambda n: b"[" + b'"[{",' * n + b'""]', _json, 100_000),
    "many keys": (lambda n: b"{" + b'"key":0,' * n + b'"key":0}', _json, 20_000),
    "deep maps": (lambda n: b'{"a":' * n + b"1" + b"}" * n, _json, 30_000),
    "deep nesting": (lambda n: b"[" * n + b"]" * n, _json, 100_000),
    "many empty lists": (lambda n: b'{"texts":[' + b"[]," * n + b"[]]}", _json, 50_000),
    "many token ids (the standard library's parser)": (
        lambda n: b'{"input":[[' + b"421," * n + b"1]]}", _json, 70_000),
    "msgpack token ids walked (each holds a byte a string may start with)": (
        lambda n: codecs.pack({"input": [[421] * n]}), _msgpack, 50_000),
    "msgpack long string": (lambda n: codecs.pack({"texts": ["a" * n]}), _msgpack, 50_000),
    "msgpack many strings": (lambda n: codecs.pack({"texts": ["x"] * n}), _msgpack, 50_000),
    "msgpack many keys": (lambda n: b"\xdf" + n.to_bytes(4, "big") + b"\xa3key\x00" * n,
                          _msgpack, 30_000),
    "msgpack deep maps": (lambda n: b"\x81\xa1a" * n + b"\xc0", _msgpack, 50_000),
    "msgpack deep nesting": (lambda n: b"\x91" * n + b"\xc0", _msgpack, 100_000),
    "msgpack many empty maps": (lambda n: codecs.pack({"texts": [{}] * n}), _msgpack,
                                100_000),
    "msgpack array shape of many dimensions": (_nd_shape, _msgpack, 5000),
    "accept of many ranges": (
        lambda n: ",".join(["application/json;q=0.5;layout=x"] * n),
        lambda accept: refused_or_parsed(codecs.choose_reply, accept), 2000),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_cost_grows_linearly(family):
    build, call, n = FAMILIES[family]
    assert cost_ratio(build, call, n) <= MAX_RATIO

