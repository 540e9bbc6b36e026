"""Image settings (``images:`` in the config): what a stranger's image may cost, and
whether the server fetches images by URL. Read by the ingress (headers checked, URLs
fetched, jobs sized) and by the pools (decoded within the same limits); the bulk job
reads files within them too. Defined once here; ``blitz.images.decode`` applies them."""

from __future__ import annotations

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
        default_factory=list, description="URL prefixes (scheme://host[:port]/path) images "
        "may be fetched from, by `http(s)://` inputs; empty: no URL is fetched (422)")
    fetch_timeout_s: float = Field(10.0, gt=0, description="one URL's fetch, connect to last "
                                   "byte, redirects not followed (408 past it)")

    @field_validator("url_allow")
    @classmethod
    def _prefixes(cls, value: list[str]) -> list[str]:
        for prefix in value:
            parts = urlsplit(prefix)
            if parts.scheme not in ("http", "https") or not parts.hostname or (
                    parts.query or parts.fragment or "@" in parts.netloc):
                raise ValueError(f"images.url_allow entry {prefix!r} must be "
                                 "http(s)://host[:port]/path, without user, query or fragment")
        return value
