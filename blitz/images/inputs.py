"""A request's images as the bytes of encoded files, whatever way the client sent them.

- ``bytes`` (a msgpack body, the handle): the file itself.
- ``data:image/...;base64,...`` (JSON, Infinity's and OpenAI's way): its payload.
- plain base64 (JSON): the file, base64-encoded.
- ``http(s)://...``: fetched only when a prefix of ``images.url_allow`` matches (off by
  default), at an address checked (``blitz.images.fetch``: normalized paths, private
  addresses refused unless listed, one client and one budget per replica), redirects not
  followed, at most ``max_bytes`` read, within ``fetch_timeout_s``.

Each is sized before it is decoded (a base64 string's length says its bytes), then its
header is checked (``blitz.images.decode.check_header``: format, declared pixels, frames)
before anything leaves the ingress: a bad image is refused naming ``images[i]``, and only
encoded bytes cross the hop. Costs stay linear in what the client sent. Then the pixels
the headers declare are summed within ``images.max_request_pixels`` (``sized_images``) and
the images go in jobs bounded by count, bytes and pixels (``jobs_of``).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

from blitz.errors import InvalidValue, PayloadTooLarge, echo
from blitz.images.decode import check_header, declared_size, in_image_thread
from blitz.images.fetch import Fetcher, shared
from blitz.images.fetch import allowed as allowed  # re-exported: the allow-list's test
from blitz.settings.images import ImageSettings

DATA_URL = "data:"


def _unbase64(text: str, limits: ImageSettings, param: str) -> bytes:
    if len(text) // 4 * 3 > limits.max_bytes + 3:  # sized before it is decoded
        raise PayloadTooLarge(f"an image of about {len(text) // 4 * 3:,} bytes is over "
                              f"images.max_bytes ({limits.max_bytes:,})", param=param)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidValue("an image given as a string must be base64, a data URL "
                           "(data:image/png;base64,...) or an allowed http(s) URL",
                           param=param) from None


def from_data_url(text: str, limits: ImageSettings, param: str) -> bytes:
    head, comma, payload = text.partition(",")
    if not comma or not head.endswith(";base64"):
        raise InvalidValue(f"a data URL must be data:<type>;base64,<data>, not "
                           f"{echo(head[:40])!r}", param=param)
    return _unbase64(payload, limits, param)


async def image_bytes(items: list[Any], limits: ImageSettings, field: str = "images",
                      fetcher: Fetcher | None = None, names: list[str] | None = None
                      ) -> list[bytes]:
    """Each item's encoded bytes, each header checked; a bad one is refused naming
    ``field[i]`` (or ``names[i]``, where the images sit apart in the body). URLs are
    fetched by ``fetcher`` (this process's own by default: ``blitz.images.fetch.shared``)."""
    if not isinstance(items, list) or not items:
        raise InvalidValue(f"{field} must be a non-empty list of images", param=field)
    if len(items) > limits.max_per_request:
        raise PayloadTooLarge(f"{len(items)} images; the limit images.max_per_request is "
                              f"{limits.max_per_request}", param=field)
    urls = {i: item for i, item in enumerate(items)
            if isinstance(item, str) and item.startswith(("http://", "https://"))}
    # base64 and headers off the event loop: a body's worth of images takes milliseconds
    out = await in_image_thread(_checked, items, urls, limits, field, names, param=field,
                                timeout_s=limits.decode_timeout_s, what="check")
    if urls:
        def check(data: bytes, param: str) -> None:  # in a thread, as each arrives
            check_header(data, limits, param).close()

        fetched = await (fetcher or shared(limits)).fetch_all(urls, field, check)
        for i, data in fetched.items():
            out[i] = data
    return out


def _checked(items: list[Any], urls: dict[int, str], limits: ImageSettings,
             field: str, names: list[str] | None = None) -> list[bytes]:
    """The items' bytes (``b""`` for a URL, fetched after), each header checked."""
    out: list[bytes] = []
    for i, item in enumerate(items):
        param = names[i] if names else f"{field}[{i}]"
        if i in urls:
            out.append(b"")
            continue
        if isinstance(item, (bytes, bytearray, memoryview)):
            data = bytes(item)
        elif isinstance(item, str) and item.startswith(DATA_URL):
            data = from_data_url(item, limits, param)
        elif isinstance(item, str):
            data = _unbase64(item, limits, param)
        else:
            raise InvalidValue(f"{param} must be an image's bytes, base64, a data URL or a "
                               f"URL, not {type(item).__name__}", param=param)
        check_header(data, limits, param).close()
        out.append(data)
    return out


@dataclass(frozen=True)
class SizedImage:
    """An image's encoded bytes, its index in the request and the pixels its header
    declares."""

    index: int
    data: bytes
    pixels: int
    size: tuple[int, int] = (0, 0)  # (width, height) as declared


def sized_images(images: list[bytes], limits: ImageSettings, field: str = "images",
                 names: list[str] | None = None) -> list[SizedImage]:
    """``images`` (headers checked) with their declared pixels, within
    ``max_request_pixels`` summed: past it, a 413 naming the image that crosses it. Header
    reads only (``blitz.images.scan`` keeps each cheap): run it in the images' threads."""
    out: list[SizedImage] = []
    total = 0
    for i, data in enumerate(images):
        param = names[i] if names else f"{field}[{i}]"
        width, height = declared_size(data, limits, param)
        pixels = width * height
        total += pixels
        if total > limits.max_request_pixels:
            raise PayloadTooLarge(
                f"the images up to {param} declare {total:,} pixels (width x height, "
                f"summed); the limit images.max_request_pixels is "
                f"{limits.max_request_pixels:,}", param=param)
        out.append(SizedImage(i, data, pixels, (width, height)))
    return out


def jobs_of(images: list[SizedImage], max_count: int, max_bytes: int, max_pixels: int
            ) -> list[list[SizedImage]]:
    """``images`` in consecutive jobs of at most ``max_count`` images, ``max_bytes`` bytes
    and ``max_pixels`` declared pixels (an image larger alone is a job of its own): a job
    costs a pool what its pixels say."""
    jobs: list[list[SizedImage]] = []
    size = pixels = 0
    for image in images:
        if not jobs or len(jobs[-1]) >= max_count or (
                (size + len(image.data) > max_bytes or pixels + image.pixels > max_pixels)
                and jobs[-1]):
            jobs.append([])
            size = pixels = 0
        jobs[-1].append(image)
        size += len(image.data)
        pixels += image.pixels
    return jobs
