"""The tiny ColQwen2 and ColPali retrievers (``tests.tiny_colvision``): their folders open
with transformers' own classes (no torchvision), the references give unit-norm multi-vectors
per query and image, the same alone as in a batch, and the token sequences are the recipes
the module documents."""

from __future__ import annotations

import numpy as np
import pytest

from blitz.vision_language.visual import read_image_shape
from tests.tiny_colvision import (
    COLPALI_IMAGE_SEQ_LENGTH,
    EMBEDDING_DIM,
    build_colpali,
    build_colqwen2,
    colpali_image_text,
    colpali_processor,
    colpali_query_text,
    colpali_reference,
    colqwen2_image_text,
    colqwen2_processor,
    colqwen2_query_text,
    colqwen2_reference,
    score_reference,
)
from tests.tiny_vision import random_images

QUERIES = ["what is the capital of france?", "a red fox"]
SIZES = [(40, 30), (90, 120)]  # (width, height): 6 and 12 ColQwen2 image tokens

FAMILIES = {
    "colqwen2": (build_colqwen2, colqwen2_reference, colqwen2_processor),
    "colpali": (build_colpali, colpali_reference, colpali_processor),
}


@pytest.fixture(scope="module")
def images():
    return random_images(11, SIZES)


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def tiny(request, tmp_path_factory):
    build, reference, processor = FAMILIES[request.param]
    return request.param, build(tmp_path_factory.mktemp(request.param), seed=5), reference


def _expected_tokens(family: str, folder, images) -> tuple[list[str], list[str]]:
    if family == "colqwen2":
        shape = read_image_shape(folder)
        return ([colqwen2_query_text(q) for q in QUERIES],
                [colqwen2_image_text(shape.tokens(*im.size)) for im in images])
    return ([colpali_query_text(q) for q in QUERIES],
            [colpali_image_text(COLPALI_IMAGE_SEQ_LENGTH) for _ in images])


def test_shapes_unit_norm_and_the_documented_sequences(tiny, images):
    family, folder, reference = tiny
    vectors = reference(folder, QUERIES, images)
    assert len(vectors) == len(QUERIES) + len(images)
    tokenizer = FAMILIES[family][2](folder).tokenizer
    query_texts, image_texts = _expected_tokens(family, folder, images)
    for vecs, text in zip(vectors, query_texts + image_texts, strict=True):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert vecs.dtype == np.float32 and vecs.shape == (len(ids), EMBEDDING_DIM)
        np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    # two images of different sizes: ColQwen2's take different token counts, ColPali's not
    if family == "colqwen2":
        assert len(vectors[2]) != len(vectors[3])
    else:
        assert len(vectors[2]) == len(vectors[3]) == COLPALI_IMAGE_SEQ_LENGTH + 6


def test_the_processor_builds_the_documented_ids(tiny, images):
    family, folder, _ = tiny
    processor = FAMILIES[family][2](folder)
    query_texts, image_texts = _expected_tokens(family, folder, images)
    for batch, texts in ((processor.process_queries(QUERIES), query_texts),
                         (processor.process_images(images), image_texts)):
        for ids, mask, text in zip(batch["input_ids"], batch["attention_mask"], texts,
                                   strict=True):
            expected = processor.tokenizer(text, add_special_tokens=False)["input_ids"]
            assert ids[mask.bool()].tolist() == expected
            assert mask.tolist() == [1] * len(expected) + [0] * (len(mask) - len(expected))


def test_a_batch_of_one_equals_the_batch(tiny, images):
    family, folder, reference = tiny
    batched = reference(folder, QUERIES, images)
    alone = ([reference(folder, [q])[0] for q in QUERIES]
             + [reference(folder, None, [im])[0] for im in images])
    for a, b in zip(alone, batched, strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, atol=1e-4)


def test_score_reference_is_maxsim(tiny, images):
    family, folder, reference = tiny
    vectors = reference(folder, QUERIES, images)
    queries, documents = vectors[:len(QUERIES)], vectors[len(QUERIES):]
    scores = score_reference(queries, documents)
    assert scores.shape == (len(queries), len(documents)) and scores.dtype == np.float32
    for i, q in enumerate(queries):
        for j, d in enumerate(documents):
            exact = float((q @ d.T).max(axis=1).sum())
            alone = float(score_reference([q], [d])[0, 0])  # no zero rows from other passages
            assert alone == pytest.approx(exact, abs=1e-4)
            assert scores[i, j] >= exact - 1e-4  # zero padding rows can only raise a max


def test_the_folders_open_like_the_hub_checkpoints(tiny):
    """``from_pretrained`` on the processor class resolves the PIL image processor here;
    ``AutoModelForPreTraining`` maps both model types to their retrieval classes."""
    family, folder, _ = tiny
    from transformers import AutoModelForPreTraining
    from transformers.models.colpali import ColPaliProcessor
    from transformers.models.colqwen2 import ColQwen2Processor

    processor = {"colqwen2": ColQwen2Processor, "colpali": ColPaliProcessor}[family]
    opened = processor.from_pretrained(str(folder))
    assert type(opened.image_processor).__name__.endswith("Pil")
    assert opened.tokenizer.padding_side == "right"
    model = AutoModelForPreTraining.from_pretrained(str(folder))
    assert type(model).__name__ == {"colqwen2": "ColQwen2ForRetrieval",
                                    "colpali": "ColPaliForRetrieval"}[family]
    assert model.config.embedding_dim == EMBEDDING_DIM
