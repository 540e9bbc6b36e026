"""Images decoded within a memory budget (issue 54, H2): a request's declared pixels are
bounded before any decode (``images.max_request_pixels``), jobs are sized by pixels and
say their cost (``ImageEmbedJob.pixels``), and a pool decodes a job's images one at a
time, each full-size image dropped once the processor has resized it. The hostile case is
the review's: a 4.9 KB 1-bit PNG of 6,324 x 6,324 that decodes to 114 MiB of RGB."""

from __future__ import annotations

import asyncio
import base64
import io
import threading
import weakref

import pytest
from PIL import Image

import blitz.images.decode as decode_module
import blitz.pool.image_prep as image_prep
from blitz.errors import InvalidValue, PayloadTooLarge
from blitz.hop_messages import ImageEmbedJob
from blitz.images.dual_encoder import DualEncoder
from blitz.images.inputs import jobs_of, sized_images
from blitz.ingress.images import ImageService
from blitz.ingress.service import EmbeddingService
from blitz.pool.dispatcher import ReplicaDispatcher
from blitz.settings.config import BlitzSettings
from blitz.settings.images import ImageSettings
from tests.api_client import api_client
from tests.error_body import error_body
from tests.tiny_vision import build_tiny_dual_encoder


def one_bit_png(side: int) -> bytes:
    """A 1-bit PNG of ``side`` x ``side``: a few KB that decode to side^2 x 3 bytes."""
    out = io.BytesIO()
    Image.new("1", (side, side)).save(out, format="PNG", optimize=True)
    return out.getvalue()


@pytest.fixture(scope="module")
def bomb() -> bytes:
    data = one_bit_png(6324)
    assert len(data) < 8_000  # the review's 4,933-byte file, give or take the encoder
    return data


@pytest.fixture(scope="module")
def clip_path(tmp_path_factory):
    return build_tiny_dual_encoder(tmp_path_factory.mktemp("clip"), "clip", seed=3)


def test_a_request_of_bombs_is_refused_by_its_declared_pixels(bomb):
    limits = ImageSettings()  # the defaults: 40 Mpx an image, 64 Mpx a request
    assert len(sized_images([bomb], limits)) == 1  # one alone is within every limit
    with pytest.raises(PayloadTooLarge) as refused:
        sized_images([bomb] * 24, limits)
    assert refused.value.status == 413 and refused.value.param == "images[1]"
    assert "images.max_request_pixels" in refused.value.message
    assert "79,985,952" in refused.value.message  # what the first two declare


async def test_a_request_of_bombs_over_http_is_a_413_naming_the_image(bomb, clip_path):
    settings = BlitzSettings.from_args({
        "models": [{"id": "clip", "source": str(clip_path), "kind": "dual-encoder"}]})
    dispatcher = ReplicaDispatcher(settings)
    sent: list = []
    submit = dispatcher.submit

    async def spy(pool, model_id, job):
        sent.append(job)
        return await submit(pool, model_id, job)

    dispatcher.submit = spy
    body = [base64.b64encode(bomb).decode()] * 24  # ~160 KB of JSON
    async with api_client(settings, dispatcher) as client:
        reply = await client.post("/embed", json={"images": body, "model": "clip"})
    assert reply.status_code == 413, reply.text
    error = error_body(reply)
    assert error["param"] == "images[1]" and "images.max_request_pixels" in reply.text
    assert sent == []  # refused before any job left the ingress


async def test_jobs_are_sized_by_pixels_and_carry_them(clip_path):
    settings = BlitzSettings.from_args({
        "models": [{"id": "clip", "source": str(clip_path), "kind": "dual-encoder"}],
        "images": {"max_job_pixels": 100_000, "max_request_pixels": 1_000_000}})
    dispatcher = ReplicaDispatcher(settings)
    sent: list = []
    submit = dispatcher.submit

    async def spy(pool, model_id, job):
        sent.append(job)
        return await submit(pool, model_id, job)

    dispatcher.submit = spy
    service = ImageService(EmbeddingService(settings, dispatcher))
    sides = [200, 200, 300, 10, 10]  # 40k, 40k, 90k, 100, 100 pixels
    images = [one_bit_png(s) for s in sides]
    result = await service.embed_images(images, "clip")
    assert result.embeddings.shape[0] == len(sides)
    jobs = sorted(sent, key=lambda job: job.first)
    assert [(job.first, len(job.images), job.pixels) for job in jobs] == [
        (0, 2, 80_000), (2, 3, 90_200)]
    assert all(isinstance(job, ImageEmbedJob) for job in jobs)


def test_the_request_budget_counts_every_image_in_order():
    small = one_bit_png(100)  # 10,000 pixels
    limits = ImageSettings(max_request_pixels=25_000)
    sized = sized_images([small, small], limits)
    assert [(s.index, s.pixels) for s in sized] == [(0, 10_000), (1, 10_000)]
    with pytest.raises(PayloadTooLarge) as refused:
        sized_images([small, small, small], limits)
    assert refused.value.param == "images[2]"
    assert [len(j) for j in jobs_of(sized, 8, 10**9, 15_000)] == [1, 1]


class LiveImages:
    """``decode`` counted: how many decoded (full-size) images are alive at once."""

    def __init__(self, real):
        self.real = real
        self.live = self.most = 0
        self.lock = threading.Lock()

    def __call__(self, data, limits, param="images"):
        image = self.real(data, limits, param)
        with self.lock:
            self.live += 1
            self.most = max(self.most, self.live)
        weakref.finalize(image, self._gone)
        return image

    def _gone(self):
        with self.lock:
            self.live -= 1


@pytest.fixture
def live(monkeypatch):
    counter = LiveImages(decode_module.decode)
    monkeypatch.setattr(decode_module, "decode", counter)
    monkeypatch.setattr(image_prep, "decode", counter, raising=False)
    return counter


async def test_a_pool_holds_one_full_size_image_of_a_job_at_a_time(clip_path, live):
    encoder = DualEncoder("clip", clip_path)
    limits = ImageSettings()
    pictures = [one_bit_png(1500) for _ in range(4)]  # 2.25 Mpx: 6.75 MB of RGB each

    async def leased(fn):
        return fn(encoder)

    job = await image_prep.prepare(ImageEmbedJob(pictures), limits, leased)
    assert live.most == 1 and live.live == 0  # one at a time, none kept
    assert job.count == 4
    want = encoder.embed_image_bytes(pictures, normalize=True).values
    got = encoder.embed_prepared(job.prepared, normalize=True).values
    assert abs(got - want).max() < 1e-5
    # jobs of several requests at once: at most the images' threads hold one each
    live.most = 0
    await asyncio.gather(*(image_prep.prepare(ImageEmbedJob(pictures[:2]), limits, leased)
                           for _ in range(6)))
    assert 1 <= live.most <= decode_module.THREADS and live.live == 0


async def test_a_pool_names_a_bad_image_by_its_index_in_the_request(clip_path):
    encoder = DualEncoder("clip", clip_path)

    async def leased(fn):
        return fn(encoder)

    noise = io.BytesIO()
    Image.effect_noise((64, 64), 50).save(noise, format="PNG")
    cut = noise.getvalue()[:len(noise.getvalue()) // 2]  # its header reads, its pixels do not
    job = ImageEmbedJob([one_bit_png(20), cut], first=5)
    with pytest.raises(InvalidValue) as refused:
        await image_prep.prepare(job, ImageSettings(), leased)
    assert refused.value.param == "images[6]"
