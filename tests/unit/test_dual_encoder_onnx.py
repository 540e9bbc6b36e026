"""Dual encoders (CLIP, SigLIP) on ONNX (blitz.images.onnx_dual, blitz.loading.dual_export),
on tiny random models built from configs: the fp32 build equals torch (texts and images,
alone and in any batch); the int8 build is checked by the accuracy guard on both towers,
served where it passes and refused, with the guard's error, where it does not; both load
through the loader and are cached."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from blitz.errors import ModelLoadFailed
from blitz.images.dual_encoder import DualEncoder
from blitz.images.onnx_dual import OnnxDualEncoder, probe_images
from blitz.loading import dual_export, opening
from blitz.loading.accuracy import AccuracyRefused
from blitz.loading.load import load_encoder
from blitz.settings.registry import ModelSpec
from tests.tiny_vision import IMAGE_SIZE, build_tiny_dual_encoder, random_images

pytestmark = pytest.mark.usefixtures("no_home_cache")
TEXTS = ["a red cat", "the quick brown fox jumps over the lazy dog", "blue sea",
         "one two three four five six seven eight nine ten", ""]
FAMILIES = ["clip", "siglip"]


def images() -> list[Image.Image]:
    return random_images(11, [(IMAGE_SIZE, IMAGE_SIZE), (64, 40), (17, 90), (200, 120)])


@pytest.fixture(scope="module", params=FAMILIES)
def tiny(request, tmp_path_factory):
    """(family, model folder, cache dir, torch encoder) for each family."""
    path = build_tiny_dual_encoder(tmp_path_factory.mktemp(request.param), request.param,
                                   seed=5)
    return request.param, path, tmp_path_factory.mktemp("cache"), DualEncoder("t", path)


def spec_for(family, path, backend, **extra) -> ModelSpec:
    return ModelSpec(id=family, source=str(path), kind="dual-encoder", cpu_backend=backend,
                     **extra)


def no_export_here(*_args, **_kwargs):
    raise AssertionError("exported in this process")


def cosines(a, b) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return np.sum(a * b, axis=1)


def test_onnx_equals_torch_alone_and_in_any_batch(tiny):
    family, path, cache, torch_encoder = tiny
    encoder = dual_export.load_dual_onnx(spec_for(family, path, "onnx"), path, cache)
    assert isinstance(encoder, OnnxDualEncoder) and encoder.kind == "dual-encoder"
    assert encoder.dimension == torch_encoder.dimension
    assert encoder.max_seq_length == torch_encoder.max_seq_length
    pictures = images()
    want_text = torch_encoder.embed(TEXTS, normalize=True)
    want_image = torch_encoder.embed_images(pictures, normalize=True).values
    got_text = encoder.embed(TEXTS, normalize=True)
    assert got_text.values.dtype == np.float32 and got_text.values.shape == want_text.values.shape
    np.testing.assert_allclose(got_text.values, want_text.values, atol=1e-5)
    assert list(got_text.token_counts) == list(want_text.token_counts)
    assert got_text.padded_tokens == want_text.padded_tokens
    np.testing.assert_allclose(encoder.embed_images(pictures, normalize=True).values,
                               want_image, atol=1e-5)
    for i, text in enumerate(TEXTS):  # each row alone: other widths than the export's
        np.testing.assert_allclose(encoder.embed([text], normalize=True).values[0],
                                   want_text.values[i], atol=1e-5)
    for i, picture in enumerate(pictures):
        np.testing.assert_allclose(encoder.embed_images([picture], normalize=True).values[0],
                                   want_image[i], atol=1e-5)
    mixed = encoder.embed_images(pictures[2:] + pictures[:1], normalize=True).values
    np.testing.assert_allclose(mixed, want_image[[2, 3, 0]], atol=1e-5)
    raw, want_raw = (e.embed(TEXTS[:2], normalize=False).values for e in (encoder, torch_encoder))
    np.testing.assert_allclose(raw, want_raw, rtol=1e-4, atol=1e-5)  # unnormalized too
    files = []
    for picture in pictures[:2]:
        out = io.BytesIO()
        picture.save(out, format="PNG")
        files.append(out.getvalue())
    np.testing.assert_allclose(encoder.embed_image_bytes(files, normalize=True).values,
                               want_image[:2], atol=1e-5)


def test_int8_passes_the_default_guard_on_both_towers_as_measured(tiny):
    import onnx

    family, path, cache, torch_encoder = tiny
    spec = spec_for(family, path, "onnx-int8")
    entry = dual_export.prepare_dual_onnx(spec, path, cache)
    report = entry.meta["accuracy"]
    # measured on these tiny random models: min cosine 0.9988 (CLIP), 0.9994 (SigLIP)
    assert report["minimum"] >= spec.accuracy_threshold == 0.98
    for name in (entry.meta["text_file"], entry.meta["image_file"]):
        assert "qint8" in name
        ops = {node.op_type for node in onnx.load(str(entry.path / name)).graph.node}
        assert "MatMulInteger" in ops  # the weights are int8
    encoder = dual_export.load_dual_onnx(spec, path, cache)
    pictures = images()
    text = cosines(encoder.embed(TEXTS, normalize=True).values,
                   torch_encoder.embed(TEXTS, normalize=True).values)
    image = cosines(encoder.embed_images(pictures, normalize=True).values,
                    torch_encoder.embed_images(pictures, normalize=True).values)
    assert text.min() >= 0.98 and image.min() >= 0.98
    assert text.min() < 1 - 1e-6 or image.min() < 1 - 1e-6  # int8 is not fp32


def test_the_guard_refuses_an_int8_build_below_its_threshold_and_caches_the_verdict(
        tiny, monkeypatch):
    family, path, cache, _ = tiny
    spec = spec_for(family, path, "onnx-int8", accuracy_threshold=0.99999)
    with pytest.raises(AccuracyRefused) as refused:
        dual_export.load_dual_onnx(spec, path, cache)
    message = str(refused.value)
    assert f"model {family!r}: the onnx-int8" in message and "not accurate enough" in message
    assert "below accuracy_threshold 0.99999" in message
    assert "probe texts" in message or "probe images" in message
    monkeypatch.setattr(dual_export, "export_towers", no_export_here)
    with pytest.raises(AccuracyRefused):  # the refused build is cached, not rebuilt
        dual_export.prepare_dual_onnx(spec, path, cache)
    with pytest.raises(ModelLoadFailed, match="not accurate enough"):  # through the loader
        load_encoder(spec, cache_dir=cache)


def test_a_dual_encoder_loads_on_onnx_through_the_loader_and_reuses_its_build(
        tiny, monkeypatch):
    family, path, cache, torch_encoder = tiny
    monkeypatch.setattr(opening, "BUILD_IN_CHILD", False)
    spec = spec_for(family, path, "onnx")
    encoder = load_encoder(spec, cache_dir=cache)
    assert isinstance(encoder, OnnxDualEncoder) and encoder.backend == "onnx"
    np.testing.assert_allclose(encoder.embed(TEXTS[:2], normalize=True).values,
                               torch_encoder.embed(TEXTS[:2], normalize=True).values, atol=1e-5)
    assert encoder.weight_bytes() is None  # no torch weights held
    encoder.close()
    with pytest.raises(RuntimeError, match="closed"):
        encoder.embed(TEXTS[:1], normalize=True)
    assert not dual_export.prepare_dual_onnx(spec, path, cache).built  # cached


def test_specs_name_the_backends_a_dual_encoder_runs_on(tiny):
    _, path, _, _ = tiny
    for backend in ("torch", "onnx", "onnx-int8"):
        assert spec_for("x", path, backend).cpu_backend == backend
    for backend in ("torch-bf16", "auto"):
        with pytest.raises(ValueError, match=f"no {backend} yet"):
            spec_for("x", path, backend)


def test_probe_images_are_fixed_and_varied():
    first, second = probe_images(), probe_images()
    assert [a.tobytes() for a in first] == [b.tobytes() for b in second]
    assert len({image.size for image in first}) == len(first) >= 6
    assert all(image.mode == "RGB" for image in first)


@pytest.mark.slow  # an int8 build in a child process: ~8 s on a 2-core machine
def test_the_build_runs_in_a_child(tmp_path, monkeypatch):
    from blitz.loading.child_work import is_cached

    path = build_tiny_dual_encoder(tmp_path / "clip", "clip", seed=2)
    spec = spec_for("clip", path, "onnx-int8")
    monkeypatch.setattr(opening, "BUILD_IN_CHILD", True)
    monkeypatch.setattr(dual_export, "export_towers", no_export_here)
    encoder = load_encoder(spec, cache_dir=tmp_path / "cache")
    assert is_cached(spec, path, tmp_path / "cache") and encoder.backend == "onnx-int8"
    want = DualEncoder("t", path).embed_images(images(), normalize=True).values
    got = encoder.embed_images(images(), normalize=True).values
    assert cosines(got, want).min() >= 0.98
