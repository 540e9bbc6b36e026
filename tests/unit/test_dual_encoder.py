"""The dual encoder (blitz.images.dual_encoder) on tiny random CLIP and SigLIP models built
from configs: text and image vectors equal the reference (the model's own
``get_text_features`` / ``get_image_features`` on its processor's inputs, normalized),
alone and in any batch."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from blitz.images.dual_encoder import DualEncoder
from tests.tiny_vision import build_tiny_dual_encoder, random_images

TEXTS = ["a red cat", "the quick brown fox jumps over the lazy dog", "blue sea",
         "one two three four five six seven eight nine ten"]
FAMILIES = ["clip", "siglip"]


def images() -> list[Image.Image]:
    return random_images(3, [(32, 32), (64, 40), (17, 90), (200, 120)])


@pytest.fixture(scope="module", params=FAMILIES)
def tiny(request, tmp_path_factory):
    path = build_tiny_dual_encoder(tmp_path_factory.mktemp(request.param), request.param,
                                   seed=5)
    return request.param, path


def reference(path, family, texts, pictures):
    import torch
    from transformers import AutoImageProcessor, AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(str(path)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    processor = AutoImageProcessor.from_pretrained(str(path))
    padding = "max_length" if family == "siglip" else True
    batch = tokenizer(texts, padding=padding, truncation=True,
                      max_length=model.config.text_config.max_position_embeddings,
                      return_tensors="pt")
    with torch.inference_mode():
        text = model.get_text_features(input_ids=batch["input_ids"],
                                       attention_mask=batch["attention_mask"])
        image = model.get_image_features(
            pixel_values=processor(images=pictures, return_tensors="pt")["pixel_values"])
    out = []
    for values in (text, image):
        if not hasattr(values, "float"):
            values = values.pooler_output
        values = values.numpy()
        out.append(values / np.linalg.norm(values, axis=1, keepdims=True))
    return out


def test_texts_and_images_equal_the_reference_alone_and_batched(tiny):
    family, path = tiny
    encoder = DualEncoder(family, path)
    pictures = images()
    want_text, want_image = reference(path, family, TEXTS, pictures)
    got_text = encoder.embed(TEXTS, normalize=True)
    got_image = encoder.embed_images(pictures, normalize=True)
    assert got_text.values.shape == want_text.shape and got_text.values.dtype == np.float32
    np.testing.assert_allclose(got_text.values, want_text, atol=1e-5)
    np.testing.assert_allclose(got_image.values, want_image, atol=1e-5)
    assert encoder.dimension == want_text.shape[1] == want_image.shape[1]
    for i, text in enumerate(TEXTS):  # one vector per input, whatever it is batched with
        alone = encoder.embed([text], normalize=True).values[0]
        np.testing.assert_allclose(alone, want_text[i], atol=1e-5)
    for i, picture in enumerate(pictures):
        alone = encoder.embed_images([picture], normalize=True).values[0]
        np.testing.assert_allclose(alone, want_image[i], atol=1e-5)
    pair = encoder.embed_images(pictures[2:4] + pictures[:1], normalize=True).values
    np.testing.assert_allclose(pair, want_image[[2, 3, 0]], atol=1e-5)


def test_unnormalized_vectors_and_token_counts(tiny):
    family, path = tiny
    encoder = DualEncoder(family, path)
    raw = encoder.embed(TEXTS[:2], normalize=False)
    unit = encoder.embed(TEXTS[:2], normalize=True).values
    norms = np.linalg.norm(raw.values, axis=1, keepdims=True)
    np.testing.assert_allclose(raw.values / norms, unit, atol=1e-6)
    assert list(raw.token_counts) == [len(encoder.tokenizer(t)["input_ids"]) for t in TEXTS[:2]]


def test_a_dual_encoder_entry_loads_through_the_loader(tiny):
    from blitz.loading.load import load_encoder
    from blitz.settings.registry import ModelSpec

    family, path = tiny
    spec = ModelSpec(id=family, source=str(path), kind="dual-encoder")
    encoder = load_encoder(spec)
    assert encoder.kind == "dual-encoder" and encoder.backend == "torch"
    want_text, want_image = reference(path, family, TEXTS[:1], images()[:1])
    np.testing.assert_allclose(encoder.embed(TEXTS[:1], normalize=True).values, want_text,
                               atol=1e-5)
    np.testing.assert_allclose(encoder.embed_images(images()[:1], normalize=True).values,
                               want_image, atol=1e-5)
    with pytest.raises(ValueError, match="torch, onnx or onnx-int8"):
        ModelSpec(id="x", source=str(path), kind="dual-encoder", cpu_backend="torch-bf16")


def test_image_jobs_run_in_a_pool_batch_beside_text_jobs(tiny):
    import io

    from blitz.errors import InvalidValue
    from blitz.hop_messages import EmbedJob, ImageEmbedJob
    from blitz.pool.mixed_batch import run_jobs

    family, path = tiny
    encoder = DualEncoder(family, path)
    pictures = images()
    files = []
    for picture in pictures:
        out = io.BytesIO()
        picture.save(out, format="PNG")
        files.append(out.getvalue())
    want_text, want_image = reference(path, family, TEXTS[:2], pictures)
    results = run_jobs(encoder, [EmbedJob(texts=TEXTS[:2]), ImageEmbedJob(images=files),
                                 ImageEmbedJob(images=[files[0], b"not an image"])])
    np.testing.assert_allclose(results[0].values, want_text, atol=1e-5)
    np.testing.assert_allclose(results[1].values, want_image, atol=1e-5)
    assert isinstance(results[2], InvalidValue) and results[2].param == "images[1]"


def test_other_kinds_refuse_images():
    from blitz.encoders.fake import FakeEncoder
    from blitz.errors import InvalidValue
    from blitz.hop_messages import ImageEmbedJob
    from blitz.pool.mixed_batch import run_jobs

    result = run_jobs(FakeEncoder("text-only", 8, 16), [ImageEmbedJob(images=[b"x"])])[0]
    assert isinstance(result, InvalidValue) and "dual-encoder" in result.message
