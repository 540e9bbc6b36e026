"""A stranger's image file walked before Pillow opens it, within a cap.

Pillow reads the parts of a file around the pixels in Python, one loop turn (and, for
some, one kept object) per part: JPEG's segments and the bytes between them up to the
first scan, PNG's chunks (before IDAT when it opens the file, after it when it loads
the pixels), GIF's blocks and sub-blocks (``n_frames`` walks every frame). A 10 MiB file
of empty parts is millions of turns: seconds and hundreds of MiB for a "header-only"
check. ``check_parts`` walks the same structure first, with offsets only (no slice, no
object per part), and refuses a file past ``MAX_PARTS`` parts (two more per frame an animation
may have) or ``MAX_FILL`` bytes of
junk between them (422), so what Pillow then walks is bounded by the caps, not by the
file's size. Pixel data is not capped by count but by its size: PNG's IDAT chunks and
GIF's image sub-blocks must average ``MIN_DATA_PART`` bytes past the first
``MAX_PARTS``. Well-formed files have a few dozen parts. WebP (libwebp) and BMP (a fixed
header) are parsed in C: nothing to walk. A file cut short is left to Pillow (it refuses
it, after at most the parts walked here).
"""

from __future__ import annotations

import re

from blitz.errors import InvalidValue

MAX_PARTS = 256
MAX_FILL = 4096
MIN_DATA_PART = 128
_FILL = re.compile(rb"\xff+")
_NO_LENGTH = frozenset((0x01, *range(0xD0, 0xDA)))  # TEM, RSTn, SOI, EOI: no length


def check_parts(data: bytes, found: str, param: str, max_frames: int = 1) -> None:
    """Refuse ``data`` (of format ``found``) if Pillow would walk more parts than the caps
    (an animation's frames, up to ``max_frames``, may add two parts each)."""
    walk = {"JPEG": _jpeg, "PNG": _png, "GIF": _gif}.get(found)
    if walk is None:
        return
    problem = walk(data, MAX_PARTS + 2 * max_frames, MAX_PARTS + len(data) // MIN_DATA_PART)
    if problem:
        raise InvalidValue(f"the {found} file has {problem}: refused before decoding "
                           "(a well-formed file has a few dozen)", param=param)


def _jpeg(data: bytes, max_parts: int, _: int) -> str:
    """Segments and fill up to the first scan (SOS), as Pillow's ``JpegImageFile._open``."""
    at, parts, fill, end = 2, 0, 0, len(data)
    while at < end:
        if data[at] != 0xFF:  # junk: Pillow skips it a byte a turn
            nxt = data.find(b"\xff", at)
            fill += (end if nxt < 0 else nxt) - at
            at = end if nxt < 0 else nxt
        elif at + 1 < end and data[at + 1] == 0xFF:  # fill bytes before a marker
            run = _FILL.match(data, at)
            assert run is not None
            fill += run.end() - at - 1
            at = run.end() - 1
        elif at + 1 >= end:
            return ""
        else:
            marker = data[at + 1]
            parts += 1
            if marker == 0xDA:  # start of scan: Pillow stops reading segments here
                return ""
            if marker in _NO_LENGTH or marker == 0x00:
                at += 2
            else:
                if at + 4 > end:
                    return ""
                at += 2 + int.from_bytes(data[at + 2:at + 4], "big")
        if parts > max_parts:
            return f"over {max_parts} segments before its first scan"
        if fill > MAX_FILL:
            return f"over {MAX_FILL:,} bytes of fill or junk between its segments"
    return ""


def _png(data: bytes, max_parts: int, max_data: int) -> str:
    """Every chunk up to IEND, as Pillow's open (before IDAT) and load (after it)."""
    at, parts, pixel_parts, end = 8, 0, 0, len(data)
    while at + 8 <= end:
        length = int.from_bytes(data[at:at + 4], "big")
        kind = data[at + 4:at + 8]
        if kind in (b"IDAT", b"fdAT"):
            pixel_parts += 1
            if pixel_parts > max_data:
                return f"over {max_data:,} pixel-data chunks for its {end:,} bytes"
        else:
            parts += 1
            if parts > max_parts:
                return f"over {max_parts} chunks besides its pixel data"
            if kind == b"IEND":
                return ""
        at += 12 + length
    return ""


def _gif(data: bytes, max_parts: int, max_data: int) -> str:
    """Blocks and sub-blocks of every frame, as Pillow's ``_seek`` (``n_frames``)."""
    end = len(data)
    if end < 13:
        return ""
    at = 13 + (3 << ((data[10] & 7) + 1) if data[10] & 0x80 else 0)
    parts, fill, sub_blocks = 0, 0, 0
    while at < end:
        tag = data[at]
        if tag == 0x3B:  # trailer
            return ""
        if tag not in (0x21, 0x2C):  # junk: Pillow skips it a byte a turn
            fill += 1
            at += 1
            if fill > MAX_FILL:
                return f"over {MAX_FILL:,} bytes of junk between its blocks"
            continue
        parts += 1
        if parts > max_parts:
            return f"over {max_parts} blocks"
        if tag == 0x21:
            at += 2  # "!", the label
        else:  # an image: its descriptor, local palette, LZW code size
            if at + 10 > end:
                return ""
            flags = data[at + 9]
            at += 10 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0) + 1
        while at < end:  # sub-blocks, ended by an empty one
            size = data[at]
            at += 1 + size
            if size == 0:
                break
            sub_blocks += 1
            if sub_blocks > max_data:
                return f"over {max_data:,} sub-blocks for its {end:,} bytes"
    return ""
