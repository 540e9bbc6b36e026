"""Hostile images on the live app (issue 54: H2, M3, M4), each beside a stream of
ordinary one-text requests: a request of 1-bit PNG bombs is a 413 naming the image that
crosses ``images.max_request_pixels`` before any decode, a request of large 1-bit images
under the budget is embedded (its pool decodes them one at a time), a JPEG of empty
segments and a truncated animated GIF are 422s naming the image; no ordinary request
fails."""

from __future__ import annotations

import base64
import io
import threading

import httpx
import numpy as np
from PIL import Image

from blitz import codecs
from tests.error_body import error_body


def one_bit_png(side: int) -> bytes:
    out = io.BytesIO()
    Image.new("1", (side, side)).save(out, format="PNG", optimize=True)
    return out.getvalue()


def four_frame_gif() -> bytes:
    rng = np.random.default_rng(1)
    frames = [Image.fromarray(rng.integers(0, 255, (12, 12, 3), dtype=np.uint8))
              for _ in range(4)]
    out = io.BytesIO()
    frames[0].save(out, format="GIF", save_all=True, append_images=frames[1:])
    return out.getvalue()


class Ordinary:
    """One-text requests to the default model, one after another, until stopped."""

    def __init__(self, base_url: str):
        self.base_url, self.statuses = base_url, []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.base_url, timeout=60) as client:
            while not self.stop.is_set():
                reply = client.post("/embed", json={"inputs": "an ordinary sentence"})
                self.statuses.append(reply.status_code)

    def __enter__(self) -> Ordinary:
        self.thread.start()
        return self

    def __exit__(self, *_) -> None:
        self.stop.set()
        self.thread.join(120)


def test_hostile_images_beside_ordinary_requests(blitz_app, http):
    bomb = base64.b64encode(one_bit_png(6324)).decode()  # 40 Mpx, ~5 KB
    small = io.BytesIO()
    Image.new("RGB", (8, 8)).save(small, format="JPEG")
    segments = small.getvalue()[:2] + b"\xff\xfe\x00\x02" * 500_000 + small.getvalue()[2:]
    gif = four_frame_gif()
    with Ordinary(blitz_app) as ordinary:
        reply = http.post("/embed", json={"images": [bomb] * 24, "model": "tiny-clip"})
        assert reply.status_code == 413, reply.text
        assert error_body(reply)["param"] == "images[1]"
        assert "images.max_request_pixels" in reply.text
        large = [base64.b64encode(one_bit_png(3000)).decode()] * 4  # 36 Mpx: within it
        reply = http.post("/embed", json={"images": large, "model": "tiny-clip"})
        assert reply.status_code == 200, reply.text
        assert len(reply.json()["embeddings"]) == 4
        for data in (segments, gif[:int(len(gif) * 0.3)], gif[:int(len(gif) * 0.9)]):
            reply = http.post("/embed", content=codecs.pack({"images": [data],
                                                             "model": "tiny-clip"}),
                              headers={"content-type": "application/msgpack"})
            assert reply.status_code == 422, reply.content
            assert error_body(reply)["param"] == "images[0]"
    assert ordinary.statuses and set(ordinary.statuses) == {200}
