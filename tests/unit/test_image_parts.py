"""Header checks that cost what a header costs (issue 54, M3, M4, L7): a file's parts
(JPEG segments, PNG chunks, GIF blocks) are walked within a cap before Pillow walks them
(``blitz.images.scan``), whatever Pillow raises is a 4xx naming the image (the review's
truncated 4-frame GIF family), and the work runs in the images' own bounded threads."""

from __future__ import annotations

import asyncio
import io
import random
import struct
import threading
import tracemalloc
import zlib

import numpy as np
import pytest
from PIL import Image

import blitz.images.decode as decode_module
from blitz.errors import ClientError, InvalidValue
from blitz.images.decode import ImageLimits, check_header, decode, in_image_thread
from blitz.images.scan import MAX_FILL, MAX_PARTS

LIMITS = ImageLimits()
BIG = ImageLimits(max_bytes=20 * 2**20)


def saved(image: Image.Image, fmt: str, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **options)
    return out.getvalue()


def noise(width: int, height: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8))


def four_frame_gif() -> bytes:
    return saved(noise(12, 12, 1), "GIF", save_all=True,
                 append_images=[noise(12, 12, k) for k in (2, 3, 4)])


def chunk(kind: bytes, body: bytes) -> bytes:
    return (struct.pack(">I", len(body)) + kind + body
            + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF))


def refused_cheaply(data: bytes, limits: ImageLimits = BIG) -> ClientError:
    """``data``'s header check refused, with little memory beside the file itself."""
    tracemalloc.start()
    try:
        with pytest.raises(ClientError) as refused:
            check_header(data, limits, "images[3]")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * 2**20, peak  # not an object per part (the review: +200 MiB)
    assert refused.value.status == 422 and refused.value.param == "images[3]"
    return refused.value


def test_truncated_and_bit_flipped_animated_gifs_only_ever_get_a_4xx():
    gif = four_frame_gif()
    rng = random.Random(3)
    variants = [gif[:cut] for cut in range(6, len(gif))]
    for _ in range(300):
        flipped = bytearray(gif)
        for _ in range(rng.randint(1, 6)):
            flipped[rng.randrange(6, len(flipped))] = rng.randrange(256)
        variants.append(bytes(flipped[:rng.randrange(20, len(flipped) + 1)]))
    for limits in (LIMITS, ImageLimits(max_frames=4)):
        for data in variants:
            try:
                image = decode(data, limits, "images[2]")
            except ClientError as exc:  # on main: IndexError and struct.error escaped
                assert 400 <= exc.status < 500 and exc.param == "images[2]"
            else:
                assert image.mode == "RGB"


def test_a_jpeg_of_empty_comment_segments_is_refused_before_pillow_walks_it():
    small = saved(Image.new("RGB", (8, 8)), "JPEG")
    bomb = small[:2] + b"\xff\xfe\x00\x02" * 2_500_000 + small[2:]  # 10 MB, 2.5M segments
    assert "segments" in refused_cheaply(bomb).message
    fill = small[:2] + b"\xff" * (MAX_FILL + 10) + small[2:]  # fill bytes: a turn each
    assert "fill" in refused_cheaply(fill).message
    app0 = 4 + int.from_bytes(small[4:6], "big")  # SOI, then APP0's marker and length
    junk = small[:app0] + b"\x00" * (MAX_FILL + 10) + small[app0:]
    assert "junk" in refused_cheaply(junk).message


def test_pngs_of_empty_chunks_before_after_or_inside_the_pixels_are_refused():
    png = saved(Image.new("RGB", (8, 8)), "PNG")
    header, rest = png[:33], png[33:]  # the signature and IHDR; IDAT, IEND
    before = header + chunk(b"prIv", b"") * 874_000 + rest
    assert "chunks" in refused_cheaply(before).message
    after = png[:-12] + chunk(b"prIv", b"") * 300_000 + png[-12:]  # walked by load_end
    assert "chunks" in refused_cheaply(after).message
    pixels = zlib.compress(b"\x00" + b"\x00" * 24)
    tiny_idat = header + b"".join(chunk(b"IDAT", pixels[i:i + 1])
                                  for i in range(len(pixels))) * 1 + chunk(b"IEND", b"")
    assert check_header(tiny_idat, LIMITS) is not None  # a few tiny IDATs are fine
    many = header + chunk(b"IDAT", b"") * 200_000 + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    assert "pixel-data" in refused_cheaply(many).message


def test_gifs_of_tiny_sub_blocks_or_junk_are_refused():
    gif = saved(Image.new("RGB", (8, 8)), "GIF")
    body = gif.index(b",")  # the first image descriptor, after the palette
    comment = b"!\xfe" + b"\x01x" * 2_000_000 + b"\x00"  # one comment, 2M sub-blocks
    assert "sub-blocks" in refused_cheaply(gif[:body] + comment + gif[body:]).message
    blocks = b"!\xfe\x01x\x00" * (MAX_PARTS + 10)
    assert "blocks" in refused_cheaply(gif[:body] + blocks + gif[body:]).message
    junk = b"\x07" * (MAX_FILL + 10)
    assert "junk" in refused_cheaply(gif[:body] + junk + gif[body:]).message


@pytest.mark.parametrize("name", ["jpeg-exif-icc-progressive", "png-text", "gif-large",
                                  "gif-animated", "apng", "webp", "bmp"])
def test_well_formed_files_pass_the_walk(name):
    from PIL import ImageCms

    picture = noise(400, 300, 5)
    limits = ImageLimits(max_frames=60)
    if name == "jpeg-exif-icc-progressive":
        exif = Image.Exif()
        exif[0x010E] = "x" * 30_000  # ImageDescription: a large APP1
        icc = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
        data = saved(picture, "JPEG", exif=exif, icc_profile=icc, progressive=True,
                     comment=b"hello", quality=80)
    elif name == "png-text":
        from PIL.PngImagePlugin import PngInfo

        info = PngInfo()
        for k in range(100):
            info.add_text(f"key{k}", "value " * 50, zip=k % 2 == 1)
        data = saved(picture, "PNG", pnginfo=info)
    elif name == "gif-large":
        data = saved(noise(800, 600, 6), "GIF")  # thousands of full sub-blocks
    elif name in ("gif-animated", "apng"):
        frames = [noise(40, 30, k) for k in range(50)]
        data = saved(frames[0], "GIF" if name == "gif-animated" else "PNG", save_all=True,
                     append_images=frames[1:])
    else:
        data = saved(picture, name.upper())
    image = decode(data, limits)
    assert image.mode == "RGB" and image.size[0] > 0


def test_the_images_threads_are_bounded_and_waiting_work_goes_with_its_caller():
    threads = decode_module.THREADS
    running, most, lock = 0, 0, threading.Lock()
    release = threading.Event()
    ran: list[int] = []

    def hold(k: int) -> int:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        release.wait(30)
        with lock:
            running -= 1
        ran.append(k)
        return k

    async def main() -> None:
        busy = [asyncio.ensure_future(in_image_thread(hold, k, timeout_s=30, param="images"))
                for k in range(threads)]
        waiting = asyncio.ensure_future(in_image_thread(hold, 99, timeout_s=30,
                                                        param="images"))
        while True:  # every thread taken (bounded wait: each step yields to the threads)
            with lock:
                if running == threads:
                    break
            await asyncio.sleep(0.01)
        waiting.cancel()  # its caller went before a thread was free: it never runs
        with pytest.raises(asyncio.CancelledError):
            await waiting
        more = [asyncio.ensure_future(in_image_thread(hold, 100 + k, timeout_s=30,
                                                      param="images"))
                for k in range(3 * threads)]
        await asyncio.sleep(0)
        release.set()
        assert sorted(await asyncio.gather(*busy, *more)) == sorted(
            [*range(threads), *(100 + k for k in range(3 * threads))])

    asyncio.run(main())
    assert most == threads and 99 not in ran


async def test_a_header_check_past_its_deadline_is_a_408_naming_the_image():
    gate = threading.Event()
    with pytest.raises(ClientError) as refused:
        await in_image_thread(gate.wait, 5, timeout_s=0.05, param="images[4]",
                              what="check")
    gate.set()
    assert refused.value.status == 408 and refused.value.param == "images[4]"
    assert "images.decode_timeout_s" in refused.value.message


def test_any_refusal_names_the_image_as_a_4xx():
    with pytest.raises(InvalidValue) as refused:
        check_header(four_frame_gif()[:300], LIMITS, "images[7]")
    assert refused.value.param == "images[7]"
