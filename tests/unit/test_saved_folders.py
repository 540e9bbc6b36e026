"""Model folders as users' fine-tunes arrive: saved by sentence-transformers 5 (with
transformers 4.57) and by sentence-transformers 6 (with transformers 5), a bi-encoder and
a cross-encoder. Each opens on every CPU backend and answers as the folder the current
stack saved; the ONNX build of each runs as it ran before (natively, for the bi-encoder)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from blitz.encoders.onnx_native import OnnxEncoder
from blitz.loading import opening
from blitz.loading.load import load_encoder
from blitz.settings.registry import ModelSpec
from tests.tiny_models import build_tiny_bi_encoder, build_tiny_cross_encoder, minilm_dir

ST5_FILES = Path(__file__).parent.parent / "fixtures" / "st5_folder"
TEXTS = ["a cat", "the quarterly results beat every estimate", "rain", "Ünïcödé façade"]


def as_saved_by_st5(folder: Path, target: Path) -> Path:
    """``folder`` (saved by this stack) as sentence-transformers 5.7 with transformers 4.57
    saved it: their tokenizer config, special tokens map, vocabulary file and versions."""
    shutil.copytree(folder, target)
    for file in ST5_FILES.glob("*.json"):
        shutil.copy(file, target / file.name)
    shutil.copy(minilm_dir() / "vocab.txt", target / "vocab.txt")
    return target


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("saved")
    bi, cross = build_tiny_bi_encoder(root / "bi6", seed=5), build_tiny_cross_encoder(
        root / "cross6", seed=6)
    return {"bi": (bi, as_saved_by_st5(bi, root / "bi5")),
            "cross": (cross, as_saved_by_st5(cross, root / "cross5"))}


def test_the_st5_files_are_what_the_old_stack_wrote(folders):
    _, old = folders["bi"]
    assert '"BertTokenizer"' in (old / "tokenizer_config.json").read_text()
    assert '"5.7.0"' in (old / "config_sentence_transformers.json").read_text()


@pytest.mark.parametrize("backend", ["torch", "onnx", "onnx-int8"])
def test_a_bi_encoder_saved_by_either_stack_gives_the_same_vectors(
        folders, backend, tmp_path, monkeypatch):
    monkeypatch.setattr(opening, "BUILD_IN_CHILD", False)
    answers = []
    for folder in folders["bi"]:
        spec = ModelSpec(id="bi", source=str(folder), cpu_backend=backend,
                         accuracy_threshold=0.9)
        encoder = load_encoder(spec, cache_dir=tmp_path)
        if backend != "torch":
            assert isinstance(encoder, OnnxEncoder)  # verified and run natively, as before
        answers.append(encoder.embed(TEXTS, normalize=True).values)
        encoder.close()
    np.testing.assert_allclose(answers[0], answers[1], atol=1e-6)


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_a_cross_encoder_saved_by_either_stack_gives_the_same_scores(
        folders, backend, tmp_path, monkeypatch):
    monkeypatch.setattr(opening, "BUILD_IN_CHILD", False)
    answers = []
    for folder in folders["cross"]:
        spec = ModelSpec(id="ce", source=str(folder), kind="cross-encoder", cpu_backend=backend)
        encoder = load_encoder(spec, cache_dir=tmp_path)
        answers.append(encoder.score("trains", TEXTS).values)
        encoder.close()
    np.testing.assert_allclose(answers[0], answers[1], atol=1e-6)
