"""Images from strangers' bytes (blitz.images.decode): each limit refuses before the step
it guards, and hostile bytes (random, truncated, bombs, animations, other formats) only
ever get a 4xx, within bounded memory."""

from __future__ import annotations

import asyncio
import io
import random
import struct
import tracemalloc
import zlib

import pytest
from PIL import Image

from blitz.errors import ClientError, InvalidValue, PayloadTooLarge
from blitz.images.decode import (
    DecodeTimedOut,
    ImageLimits,
    UnsupportedImage,
    decode,
    decode_async,
    sniff,
)

LIMITS = ImageLimits()


def encoded(fmt: str, size=(32, 24), **save) -> bytes:
    image = Image.new("RGB", size, (10, 200, 30))
    out = io.BytesIO()
    image.save(out, format=fmt, **save)
    return out.getvalue()


def png_declaring(width: int, height: int) -> bytes:
    """A PNG whose header declares width x height, with one tiny compressed row: what a
    decompression bomb's header looks like."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return (struct.pack(">I", len(body)) + kind + body
                + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b""))


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF", "BMP"])
def test_each_accepted_format_decodes_to_rgb(fmt):
    image = decode(encoded(fmt), LIMITS)
    assert image.mode == "RGB" and image.size == (32, 24)
    assert sniff(encoded(fmt)) == fmt


def test_the_encoded_size_is_refused_before_anything_reads_it():
    with pytest.raises(PayloadTooLarge, match="images.max_bytes"):
        decode(b"\x89PNG" + b"\x00" * 2000, ImageLimits(max_bytes=1000))


def test_formats_come_from_the_magic_bytes_and_the_list():
    with pytest.raises(UnsupportedImage) as refused:
        decode(encoded("BMP"), ImageLimits(formats=("PNG", "JPEG")))
    assert refused.value.status == 415 and "BMP" in refused.value.message
    tiff = encoded("TIFF")  # Pillow reads it; the list does not name it
    with pytest.raises(UnsupportedImage, match="unknown"):
        decode(tiff, LIMITS)
    with pytest.raises(UnsupportedImage):
        decode(b"<svg xmlns='http://www.w3.org/2000/svg'/>", LIMITS)


def test_a_bomb_is_refused_from_its_header_in_little_memory():
    bomb = png_declaring(100_000, 100_000)  # 10^10 pixels: 30 GB decoded
    tracemalloc.start()
    with pytest.raises(PayloadTooLarge, match="pixels"):
        decode(bomb, LIMITS)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 2 * 2**20  # refused before any pixel buffer was made
    with pytest.raises(PayloadTooLarge, match="max_side"):
        decode(png_declaring(20_000, 10), LIMITS)  # 200,000 pixels, one side too long


def test_an_animation_is_refused_unless_frames_are_allowed():
    frames = [Image.new("RGB", (8, 8), c) for c in ((255, 0, 0), (0, 255, 0))]
    out = io.BytesIO()
    frames[0].save(out, format="GIF", save_all=True, append_images=frames[1:])
    with pytest.raises(InvalidValue, match="2 frames"):
        decode(out.getvalue(), LIMITS)
    first = decode(out.getvalue(), ImageLimits(max_frames=2))
    assert first.getpixel((0, 0)) == (255, 0, 0)  # the first frame only


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF", "BMP"])
def test_truncated_files_are_a_422_never_a_padded_image(fmt):
    data = encoded(fmt, size=(64, 64))
    for cut in (len(data) // 2, 12):  # inside the pixels, inside the header (a file cut in
        # its trailer, after the last pixel, still decodes whole: PNG's IEND, GIF's ';')
        with pytest.raises(ClientError) as refused:
            decode(data[:cut], LIMITS)
        assert 400 <= refused.value.status < 500


def test_random_bytes_only_ever_get_a_4xx():
    rng = random.Random(7)
    seeds = [encoded(f) for f in ("PNG", "JPEG", "WEBP", "GIF", "BMP")]
    for i in range(400):
        if i % 2:  # a real file with bytes flipped past its magic
            data = bytearray(rng.choice(seeds))
            for _ in range(rng.randint(1, 16)):
                data[rng.randrange(8, len(data))] = rng.randrange(256)
            data = bytes(data)
        else:
            data = rng.choice([b"", b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"RIFF\0\0\0\0WEBP",
                               b"GIF89a", b"BM"]) + rng.randbytes(rng.randint(0, 300))
        try:
            image = decode(data, LIMITS)
        except ClientError as exc:
            assert 400 <= exc.status < 500
        else:
            assert image.mode == "RGB"


async def test_the_decode_runs_off_the_loop_within_its_deadline(monkeypatch):
    image = await decode_async(encoded("PNG"), LIMITS)
    assert image.size == (32, 24)

    import blitz.images.decode as module

    def slow(data, limits, param):
        import time
        time.sleep(0.5)
        return "late"

    monkeypatch.setattr(module, "decode", slow)
    with pytest.raises(DecodeTimedOut) as refused:
        await decode_async(b"x", ImageLimits(decode_timeout_s=0.05))
    assert refused.value.status == 408
    await asyncio.sleep(0.6)  # the thread finished on its own
