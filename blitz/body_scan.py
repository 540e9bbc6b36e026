"""Counting what a stranger's body would build, before a decoder builds it.

Each decoded value costs tens of bytes for a few on the wire (a 3-byte string is a
50-byte ``str``), so a body of millions of tiny values would cost many times its size
once decoded (``tests/unit/test_codecs.py`` measures the multiple). These scans
count the containers, values and strings of a JSON or msgpack body in time linear in its
size, whatever its bytes, so ``codecs`` refuses one past its bounds before decoding it.
Imports nothing of Blitz.
"""

from __future__ import annotations

import numpy as np

# JSON's string delimiter, escape and container openers, as byte values
_QUOTE, _BACKSLASH, _OPENERS, _COMMA = ord('"'), ord("\\"), (ord("["), ord("{")), ord(",")
# bytes per vectorized pass: its temporary arrays stay small (under glibc's threshold for
# mapping memory afresh on each allocation) and in the CPU's caches
_SCAN_CHUNK = 16 * 1024


def strings_bound(max_containers: int) -> int:
    """The strings a body may hold beside ``max_containers`` lists and objects: a text
    needs about one container and a string, an object's keys one string each."""
    return 2 * max_containers + 64


def json_over(data: bytes, max_containers: int, max_values: int) -> str | None:
    """Which bound ``data`` crosses, if any: more than ``max_containers`` lists and
    objects (``[`` and ``{`` outside strings), more than ``max_values`` values (commas
    outside strings, plus the containers) or more than ``2 * max_containers + 64``
    strings. Each decoded value costs tens of bytes for a few on the wire (a 3-byte
    string is a 50-byte ``str``), so these bounds keep a decode within a small multiple
    of the body, where a body of tiny strings would otherwise decode to many times it.

    Counting every bracket, comma and quote settles it when each count is within its
    bound (a quote inside a string only adds). Otherwise one pass over fixed-size chunks
    finds the strings (a quote opens or closes one unless it follows an odd run of
    backslashes), vectorized, and stops once a bound is crossed: linear in the size of
    ``data`` whatever its bytes, with no regex to backtrack. Between chunks it carries
    only whether a string is open and whether the next byte is escaped.
    """
    max_strings = strings_bound(max_containers)
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


def _msgpack_tables() -> tuple[list[int], list[int], list[int], list[bool]]:
    """Per first byte of a msgpack object: its size when fixed (header and payload; a
    container's elements follow it as objects of their own), else the size of its length
    field and of what sits between that field and the payload (an ext's type), and
    whether it is a string. 0xc1 is never used: both sizes stay 0."""
    step, length, extra, string = [0] * 256, [0] * 256, [0] * 256, [False] * 256
    for first in (*range(0x00, 0xa0), 0xc0, 0xc2, 0xc3, *range(0xe0, 0x100)):
        step[first] = 1  # fixints, fixmap and fixarray headers, nil, booleans
    for first in range(0xa0, 0xc0):
        step[first], string[first] = 1 + (first & 0x1F), True  # fixstr
    for first, size in ((0xca, 5), (0xcb, 9), (0xcc, 2), (0xcd, 3), (0xce, 5), (0xcf, 9),
                        (0xd0, 2), (0xd1, 3), (0xd2, 5), (0xd3, 9), (0xd4, 3), (0xd5, 4),
                        (0xd6, 6), (0xd7, 10), (0xd8, 18), (0xdc, 3), (0xdd, 5), (0xde, 3),
                        (0xdf, 5)):
        step[first] = size  # numbers, fixext, array and map headers
    for first, size in ((0xc4, 1), (0xc5, 2), (0xc6, 4), (0xd9, 1), (0xda, 2), (0xdb, 4)):
        length[first] = size  # bin, str
    for first, size in ((0xc7, 1), (0xc8, 2), (0xc9, 4)):
        length[first], extra[first] = size, 1  # ext: its type byte follows the length
    for first in (0xd9, 0xda, 0xdb):
        string[first] = True
    return step, length, extra, string


_MP_STEP, _MP_LENGTH, _MP_EXTRA, _MP_STRING = _msgpack_tables()
_MP_STRING_FIRST = np.array(_MP_STRING, dtype=bool)


def msgpack_over(data: bytes, max_containers: int, max_values: int) -> str | None:
    """Which bound the msgpack ``data`` crosses, if any: more than
    ``strings_bound(max_containers)`` strings (map keys included) or more than
    ``max_values`` other objects (numbers, containers, ...), as ``json_over`` bounds JSON.

    Every object takes at least one byte, and a string starts with one of 35 byte
    values: a body no longer than ``max_values`` bytes in which no more than the strings'
    bound take those values (a vectorized count) is within both. Otherwise one walk from
    object to object counts them: each object's first byte says how far the next one is
    (a container's elements follow it), so the walk is linear, jumps over every payload,
    and stops at the first byte that is not msgpack, leaving the error to the decoder."""
    max_strings = strings_bound(max_containers)
    if len(data) <= min(max_values, max_strings):  # a body this short holds no more
        return None  # objects than bytes: the common small request counts nothing
    view = np.frombuffer(data, np.uint8)
    if len(data) <= max_values and sum(
            int(np.count_nonzero(_MP_STRING_FIRST[view[start:start + _SCAN_CHUNK]]))
            for start in range(0, len(view), _SCAN_CHUNK)) <= max_strings:
        return None
    at, end, strings, values = 0, len(data), 0, 0
    step, length, extra, string = _MP_STEP, _MP_LENGTH, _MP_EXTRA, _MP_STRING
    while at < end:
        first = data[at]
        if step[first]:
            at += step[first]
        elif length[first]:
            size = length[first]
            at += 1 + size + extra[first] + int.from_bytes(data[at + 1:at + 1 + size], "big")
        else:
            return None
        if string[first]:
            strings += 1
            if strings > max_strings:
                return f"more than {max_strings} strings"
        else:
            values += 1
            if values > max_values:
                return f"more than {max_values} values"
    return None
