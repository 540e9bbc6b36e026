"""The accuracy guard: its comparisons, and the torch-bf16 check at load."""

from __future__ import annotations

import numpy as np
import pytest

from blitz.errors import ModelLoadFailed
from blitz.loading import accuracy
from blitz.loading.load import load_encoder
from blitz.settings.registry import ModelSpec
from tests.tiny_models import build_tiny_cross_encoder

TEXTS = ["The quick brown fox jumps over the lazy dog.", "hello", "Where is the station?"]



def test_compare_embeddings_is_the_cosine_per_row():
    ref = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    cand = np.array([[5.0, 0.0], [2.0, 0.0], [3.0, 4.0]], dtype=np.float32)  # scale is ignored
    report = accuracy.compare_embeddings(ref, cand)
    assert (report.metric, report.probes) == ("cosine", 3)
    assert report.minimum == pytest.approx(0.0) and report.mean == pytest.approx(2 / 3)


def test_compare_scores_handles_constant_rows():
    ref = np.array([[1.0, 2.0, 3.0], [0.5, 0.5, 0.5], [0.5, 0.5, 0.5]])
    cand = np.array([[2.0, 4.0, 6.1], [0.5, 0.5, 0.5], [0.9, 0.9, 0.9]])
    report = accuracy.compare_scores(ref, cand)
    assert report.metric == "pearson" and report.probes == 3
    assert report.minimum == 0.0 and 0.6 < report.mean < 0.67


def test_numbers_are_cut_not_rounded():
    report = accuracy.AccuracyReport("cosine", 0.99997, 0.99999, 48)
    assert report.describe().startswith("min cosine 0.9999, mean 0.9999 over 48 probe")
    assert not report.passes(0.99998) and report.passes(0)  # 0 turns the check off


@pytest.mark.slow  # bf16 emulated on a CPU without it: ~11 s
def test_torch_bf16_is_checked_on_load(tiny_dir):
    spec = ModelSpec(id="tiny", source=str(tiny_dir), cpu_backend="torch-bf16")
    encoder = load_encoder(spec)
    assert encoder.embed(TEXTS, normalize=True).values.dtype == np.float32
    with pytest.raises(ModelLoadFailed, match="torch-bf16 build is not accurate enough"):
        load_encoder(spec.model_copy(update={"accuracy_threshold": 1.0}))


@pytest.mark.slow  # ~6 s on a 2-core machine
def test_the_same_guard_checks_a_bf16_cross_encoder(tmp_path):
    # the tiny cross-encoder's scores differ in the 6th decimal: bf16 cannot tell them apart
    # (transformers 4.57 flattened them to one value, pearson 0; 5.x leaves noise, ~0.25)
    spec = ModelSpec(id="ce", source=str(build_tiny_cross_encoder(tmp_path / "ce")),
                     kind="cross-encoder", cpu_backend="torch-bf16")
    with pytest.raises(ModelLoadFailed, match=r"torch-bf16 build .* min pearson 0\.[0-5]"):
        load_encoder(spec)
    encoder = load_encoder(spec.model_copy(update={"accuracy_threshold": 0}))  # check off
    assert encoder.kind == "cross-encoder"
    assert str(next(encoder.model.parameters()).dtype) == "torch.bfloat16"
