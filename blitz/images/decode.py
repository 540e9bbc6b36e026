"""An image from a stranger's bytes, safely: every limit is checked before the costly
step it guards.

1. ``max_bytes``: the encoded size, before anything reads it (413).
2. The format, from the file's magic bytes against ``formats`` (415): Pillow is never
   asked to guess among its other decoders.
3. The declared size, from the header alone (Pillow's ``open`` is lazy): ``max_side`` and
   ``max_pixels`` refuse decompression bombs before a pixel is decoded (413); decoding
   then costs at most about ``max_pixels`` x 4 bytes.
4. ``max_frames``: an animated image is refused unless frames are allowed (422); only the
   first frame is ever decoded.
5. The decode itself, off the caller's event loop, within ``decode_timeout_s``
   (``decode_async``): past it the caller gets a 408-like refusal while the thread, bounded
   by step 3, finishes on its own.
Truncated or corrupt files are a 422 (Pillow's truncated-image tolerance stays off).
"""

from __future__ import annotations

import asyncio
import io
import warnings
from typing import Any

from blitz.errors import BadRequest, InvalidValue, PayloadTooLarge
from blitz.settings.images import ImageSettings

MAGIC = (  # (prefix, offset, format); WEBP also needs "WEBP" at byte 8
    (b"\xff\xd8\xff", 0, "JPEG"),
    (b"\x89PNG\r\n\x1a\n", 0, "PNG"),
    (b"GIF87a", 0, "GIF"),
    (b"GIF89a", 0, "GIF"),
    (b"BM", 0, "BMP"),
    (b"RIFF", 0, "WEBP"),
)


ImageLimits = ImageSettings  # the limits decode applies: the ``images:`` settings


class UnsupportedImage(InvalidValue):
    status, code = 415, "unsupported_media_type"


class DecodeTimedOut(BadRequest):
    status, code = 408, "image_decode_timeout"


def sniff(data: bytes) -> str | None:
    """The format ``data``'s first bytes say, or None."""
    for prefix, offset, name in MAGIC:
        if data[offset:offset + len(prefix)] == prefix:
            if name == "WEBP" and data[8:12] != b"WEBP":
                continue
            return name
    return None


def check_header(data: bytes, limits: ImageLimits, param: str = "images") -> Any:
    """``data`` opened lazily (its header read, no pixel decoded) once steps 1-4 pass."""
    from PIL import Image

    if len(data) > limits.max_bytes:
        raise PayloadTooLarge(f"an image of {len(data):,} bytes is over images.max_bytes "
                              f"({limits.max_bytes:,})", param=param)
    found = sniff(data)
    if found is None or found not in limits.formats:
        raise UnsupportedImage(
            f"image format {found or 'unknown'} is not accepted; accepted: "
            f"{', '.join(limits.formats)} (images.formats)", param=param)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=[found])
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise PayloadTooLarge(f"the image declares too many pixels ({exc})",
                              param=param) from None
    except Exception as exc:  # noqa: BLE001 - any decoder's complaint about bad bytes
        raise InvalidValue(f"the image could not be read as {found}: "
                           f"{type(exc).__name__}", param=param) from None
    width, height = image.size
    if max(width, height) > limits.max_side or width * height > limits.max_pixels:
        raise PayloadTooLarge(
            f"the image declares {width} x {height} pixels; the limits are images.max_side "
            f"{limits.max_side} and images.max_pixels {limits.max_pixels:,}", param=param)
    frames = getattr(image, "n_frames", 1)
    if frames > limits.max_frames:
        raise InvalidValue(f"the image has {frames} frames; images.max_frames is "
                           f"{limits.max_frames}", param=param)
    return image


def decode(data: bytes, limits: ImageLimits, param: str = "images") -> Any:
    """``data`` as an RGB ``PIL.Image`` (its first frame), or a 4xx naming the limit."""
    from PIL import ImageFile

    image = check_header(data, limits, param)
    assert not ImageFile.LOAD_TRUNCATED_IMAGES  # a truncated file is refused, not padded
    try:
        image.seek(0)
        image.load()
        return image.convert("RGB")
    except Exception as exc:  # noqa: BLE001 - truncated, corrupt, or refused mid-decode
        raise InvalidValue(f"the image could not be decoded: {type(exc).__name__}",
                           param=param) from None


async def decode_async(data: bytes, limits: ImageLimits, param: str = "images") -> Any:
    """``decode`` in a thread, within ``decode_timeout_s``."""
    work = asyncio.ensure_future(asyncio.to_thread(decode, data, limits, param))
    # past the deadline the thread finishes alone: its refusal, if any, is read and dropped
    work.add_done_callback(lambda done: done.cancelled() or done.exception())
    try:
        return await asyncio.wait_for(asyncio.shield(work), limits.decode_timeout_s)
    except TimeoutError:
        raise DecodeTimedOut(f"the image took over images.decode_timeout_s "
                             f"({limits.decode_timeout_s:g} s) to decode",
                             param=param) from None
