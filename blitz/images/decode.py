"""An image from a stranger's bytes, safely: every limit is checked before the costly
step it guards.

1. ``max_bytes``: the encoded size, before anything reads it (413).
2. The format, from the file's magic bytes against ``formats`` (415): Pillow is never
   asked to guess among its other decoders.
3. The file's parts (JPEG segments, PNG chunks, GIF blocks) walked within a cap before
   Pillow walks them (``blitz.images.scan``, 422): a header check costs what a few dozen
   parts cost, whatever the file's size.
4. The declared size, from the header alone (Pillow's ``open`` is lazy): ``max_side`` and
   ``max_pixels`` refuse decompression bombs before a pixel is decoded (413); decoding
   then costs at most about ``max_pixels`` x 4 bytes. (A request's and a job's total
   pixels are the ingress's: ``blitz.images.inputs``.)
5. ``max_frames``: an animated image is refused unless frames are allowed (422); only the
   first frame is ever decoded.
6. The decode itself, off the caller's event loop in the images' own bounded threads
   (``in_image_thread``), within ``decode_timeout_s``: past it the caller gets a 408-like
   refusal while the thread, bounded by step 4, finishes on its own.
Truncated or corrupt files, and anything else Pillow raises on the way, are a 422 naming
the image (Pillow's truncated-image tolerance stays off), never a 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import threading
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from blitz.errors import BadRequest, ClientError, InvalidValue, PayloadTooLarge
from blitz.images.scan import check_parts
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
T = TypeVar("T")
THREADS = max(2, min(4, os.cpu_count() or 1))
"""The images' own threads per process: at most this many images are decoded (each held
full-size until it is resized) or header-checked at once, whatever the requests."""
_EXECUTOR: ThreadPoolExecutor | None = None
_EXECUTOR_LOCK = threading.Lock()


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
    """``data`` opened lazily (its header read, no pixel decoded) once steps 1-4 pass.
    Whatever Pillow raises on the way (a truncated GIF's ``n_frames``: IndexError,
    struct.error, ...) is a 4xx naming ``param``, never a 500."""
    from PIL import Image

    if len(data) > limits.max_bytes:
        raise PayloadTooLarge(f"an image of {len(data):,} bytes is over images.max_bytes "
                              f"({limits.max_bytes:,})", param=param)
    found = sniff(data)
    if found is None or found not in limits.formats:
        raise UnsupportedImage(
            f"image format {found or 'unknown'} is not accepted; accepted: "
            f"{', '.join(limits.formats)} (images.formats)", param=param)
    check_parts(data, found, param, limits.max_frames)  # Pillow's walk, bounded first
    image = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=[found])
            width, height = image.size
            if max(width, height) > limits.max_side or width * height > limits.max_pixels:
                raise PayloadTooLarge(
                    f"the image declares {width} x {height} pixels; the limits are "
                    f"images.max_side {limits.max_side} and images.max_pixels "
                    f"{limits.max_pixels:,}", param=param)
            frames = getattr(image, "n_frames", 1)  # GIF: walks every frame's blocks
            if frames > limits.max_frames:
                raise InvalidValue(f"the image has {frames} frames; images.max_frames is "
                                   f"{limits.max_frames}", param=param)
            return image
    except ClientError:
        _close(image)
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        _close(image)
        raise PayloadTooLarge(f"the image declares too many pixels ({exc})",
                              param=param) from None
    except Exception as exc:  # noqa: BLE001 - any decoder's complaint about bad bytes
        _close(image)
        raise InvalidValue(f"the image could not be read as {found}: "
                           f"{type(exc).__name__}", param=param) from None


def declared_pixels(data: bytes, limits: ImageLimits, param: str = "images") -> int:
    """The width x height ``data``'s header declares, once ``check_header`` passes."""
    width, height = declared_size(data, limits, param)
    return width * height


def declared_size(data: bytes, limits: ImageLimits, param: str = "images") -> tuple[int, int]:
    """The (width, height) ``data``'s header declares, once ``check_header`` passes."""
    image = check_header(data, limits, param)
    try:
        width, height = image.size
        return int(width), int(height)
    finally:
        image.close()


def _close(image: Any) -> None:
    if image is not None:
        with contextlib.suppress(Exception):
            image.close()


def decode(data: bytes, limits: ImageLimits, param: str = "images") -> Any:
    """``data`` as an RGB ``PIL.Image`` (its first frame), or a 4xx naming the limit. The
    file's own decoded image is closed once converted: one full-size copy is left."""
    from PIL import ImageFile

    image = check_header(data, limits, param)
    assert not ImageFile.LOAD_TRUNCATED_IMAGES  # a truncated file is refused, not padded
    try:
        image.seek(0)
        image.load()
        if image.mode == "RGB":
            return image
        return image.convert("RGB")
    except Exception as exc:  # noqa: BLE001 - truncated, corrupt, or refused mid-decode
        _close(image)
        raise InvalidValue(f"the image could not be decoded: {type(exc).__name__}",
                           param=param) from None
    finally:
        if image.mode != "RGB":
            _close(image)


def executor() -> ThreadPoolExecutor:
    """The images' own threads (``THREADS``), made on first use: header checks, decodes and
    resizes run here, never in the event loop's default executor."""
    global _EXECUTOR
    with _EXECUTOR_LOCK:
        if _EXECUTOR is None:
            _EXECUTOR = ThreadPoolExecutor(THREADS, thread_name_prefix="blitz-images")
        return _EXECUTOR


async def in_image_thread(fn: Callable[..., T], *args: Any, timeout_s: float, param: str,
                          what: str = "decode") -> T:
    """``fn(*args)`` in one of the images' threads, within ``timeout_s`` from when a thread
    takes it (408 past it, naming ``param``). Past the deadline the thread finishes alone
    (its result dropped): it holds one of ``THREADS``, so stuck work never grows the
    threads. Work still waiting for a thread when its caller goes (cancelled, or timed out
    earlier) never runs."""
    loop = asyncio.get_running_loop()
    started: asyncio.Future[None] = loop.create_future()

    def work() -> T:
        loop.call_soon_threadsafe(_set, started)
        return fn(*args)

    future = loop.run_in_executor(executor(), work)
    future.add_done_callback(lambda done: done.cancelled() or done.exception())
    try:
        await asyncio.wait((started, future), return_when=asyncio.FIRST_COMPLETED)
        return await asyncio.wait_for(asyncio.shield(future), timeout_s)
    except TimeoutError:
        raise DecodeTimedOut(f"the image took over images.decode_timeout_s "
                             f"({timeout_s:g} s) to {what}", param=param) from None
    finally:
        if not started.done():  # never started: it need not run
            future.cancel()
            started.cancel()


def _set(started: asyncio.Future[None]) -> None:
    if not started.done():
        started.set_result(None)


async def decode_async(data: bytes, limits: ImageLimits, param: str = "images") -> Any:
    """``decode`` in one of the images' threads, within ``decode_timeout_s``."""
    return await in_image_thread(decode, data, limits, param,
                                 timeout_s=limits.decode_timeout_s, param=param)
