"""Image settings (``images:`` in the config): what a stranger's image may cost, and
whether the server fetches images by URL. Read by the ingress (headers checked, URLs
fetched, jobs sized) and by the pools (decoded within the same limits); the bulk job
reads files within them too. Defined once here; ``blitz.images.decode`` applies them."""

from __future__ import annotations

import ipaddress
import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from blitz.settings.pool_settings import _Settings

ImageFormat = Literal["JPEG", "PNG", "WEBP", "GIF", "BMP"]


class ImageSettings(_Settings):
    """Limits on each image, checked before the step each guards (413, 415, 422, 408)."""

    model_config = {**_Settings.model_config, "frozen": True}

    max_bytes: int = Field(10 * 2**20, ge=1, description="bytes of one encoded image (413)")
    max_pixels: int = Field(40_000_000, ge=1, description="width x height an image header "
                            "may declare (413, before any pixel is decoded: bombs refused)")
    max_side: int = Field(16_384, ge=1, description="its longest side, in pixels (413)")
    max_frames: int = Field(1, ge=1, description="frames of an animated image (422); only "
                            "the first is ever embedded")
    decode_timeout_s: float = Field(10.0, gt=0, description="one image's decode, in a "
                                    "thread off the event loop (408 past it)")
    formats: tuple[ImageFormat, ...] = Field(
        ("JPEG", "PNG", "WEBP", "GIF", "BMP"), description="formats accepted, told by the "
        "file's magic bytes (415 otherwise)")
    max_per_request: int = Field(256, ge=1, description="images in one request (413)")
    max_request_pixels: int = Field(
        64_000_000, ge=1, description="width x height summed over a request's images, as "
        "their headers declare (413 naming the image that crosses it, before any decode): "
        "what one request may cost to decode")
    max_job_bytes: int = Field(32 * 2**20, ge=1, description="encoded bytes in one pool "
                               "call: a request's images go in jobs of at most the pool's "
                               "max_batch_size images, this many bytes and max_job_pixels")
    max_job_pixels: int = Field(
        16_000_000, ge=1, description="declared width x height in one pool call (an image "
        "larger alone is a job of its own); a pool decodes a job's images one at a time")
    url_allow: list[str] = Field(
        default_factory=list, description="URL prefixes (scheme://host[:port]/path/) images "
        "may be fetched from, by `http(s)://` inputs; a prefix's path ends in `/` (or is "
        "empty: the whole host); a URL matches on its normalized path, and one with `..` "
        "segments or `%2e`, `%2f`, `%5c` in its path is refused; empty: no URL is fetched (422)")
    url_allow_private: list[str] = Field(
        default_factory=list, description="hosts (names as in url_allow) and addresses or "
        "CIDRs (`10.1.0.0/16`, `::1`) an allowed URL may resolve to although they are "
        "loopback, link-local, private, unspecified, multicast or reserved; a url_allow "
        "entry whose host is such an address literal is listed by itself. Otherwise a URL "
        "whose host resolves to one is refused (422); the fetch connects to the address "
        "checked")
    fetch_timeout_s: float = Field(10.0, gt=0, description="one URL's fetch, resolving and "
                                   "connecting to last byte, redirects not followed (408 "
                                   "past it)")
    max_fetches_in_flight: int = Field(
        16, ge=1, description="URLs one ingress replica fetches at once, all requests "
        "together (the shared client's connections); a fetch waits for a slot at most "
        "fetch_timeout_s (503 past it)")
    max_fetch_bytes_in_flight: int = Field(
        128 * 2**20, ge=1, description="bytes of fetched images one ingress replica holds "
        "while a request's URLs are being fetched, all requests together (apart from "
        "limits.max_buffered_bytes); past it: 503, or 413 when one request's own URLs "
        "pass it")

    @field_validator("url_allow")
    @classmethod
    def _prefixes(cls, value: list[str]) -> list[str]:
        return checked_prefixes(value, "images.url_allow entry")

    @field_validator("url_allow_private")
    @classmethod
    def _private(cls, value: list[str]) -> list[str]:
        for entry in value:
            if not private_entry_ok(entry):
                raise ValueError(f"images.url_allow_private entry {entry!r} must be a host "
                                 "name, an IP address or a CIDR (10.0.0.0/8, fd00::/8)")
        return value


ENCODED_TRICKS = ("%2e", "%2f", "%5c", "\\")
"""What a URL's path may not hold (any case): encoded dots, slashes and backslashes that a
server may decode after the allow-list was checked."""


def checked_prefixes(prefixes: list[str], what: str) -> list[str]:
    """``prefixes``, each a URL allow-list prefix (``prefix_problem``); a ValueError naming
    ``what`` and the first that is not."""
    for prefix in prefixes:
        problem = prefix_problem(prefix)
        if problem:
            raise ValueError(f"{what} {prefix!r} {problem}")
    return prefixes


def prefix_problem(prefix: str) -> str | None:
    """Why ``prefix`` cannot be a URL allow-list prefix (``images.url_allow``, ``blitz
    embed --allow-urls``), or None: http(s)://host[:port]/path/ with no user, query or
    fragment, a path that ends in ``/`` (or none), without ``..`` or encoded tricks."""
    try:
        parts = urlsplit(prefix)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        return "is not a URL"
    if parts.scheme not in ("http", "https") or not parts.hostname or (
            parts.query or parts.fragment or "@" in parts.netloc):
        return "must be http(s)://host[:port]/path/, without user, query or fragment"
    if parts.path and not parts.path.endswith("/"):
        return (f"must end in '/' ({prefix}/): a prefix matches whole path segments, so "
                "/public never matches /public-internal")
    if ".." in parts.path.split("/") or any(t in parts.path.lower() for t in ENCODED_TRICKS):
        return "must not hold '..' segments or %2e, %2f, %5c"
    return None


def private_entry_ok(entry: str) -> bool:
    """Whether ``entry`` is a host name, an address or a CIDR (``url_allow_private``)."""
    try:
        ipaddress.ip_network(entry, strict=False)
        return True
    except ValueError:
        return bool(HOST_NAME.fullmatch(entry))


HOST_NAME = re.compile(r"(?i)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
                       r"(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*\.?")
