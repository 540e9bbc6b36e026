"""ONNX builds in a child process (blitz.loading.child_work): the loading process only opens the
cached build, so it does not keep the export's memory."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from blitz.loading import onnx_export, opening
from blitz.loading.child_work import build_in_child, is_cached
from blitz.loading.load import load_encoder
from blitz.settings.registry import ModelSpec

pytestmark = pytest.mark.usefixtures("no_home_cache")
TEXTS = ["The quick brown fox jumps over the lazy dog.", "hello"]


def _no_export_here(*_args, **_kwargs):
    raise AssertionError("the export ran in the loading process")


@pytest.mark.slow  # an ONNX build in a child: ~12 s on a 2-core machine
def test_load_builds_in_a_child_and_opens_the_cached_build(tiny_dir, tmp_path, monkeypatch):
    spec = ModelSpec(id="tiny", source=str(tiny_dir), cpu_backend="onnx")
    monkeypatch.setattr(opening, "BUILD_IN_CHILD", True)
    monkeypatch.setattr(onnx_export, "_export_onnx", _no_export_here)  # this process only
    assert not is_cached(spec, tiny_dir, tmp_path)

    encoder = load_encoder(spec, cache_dir=tmp_path)

    assert is_cached(spec, tiny_dir, tmp_path)
    expected = load_encoder(spec.model_copy(update={"cpu_backend": "torch"}))
    np.testing.assert_allclose(encoder.embed(TEXTS, normalize=True).values,
                               expected.embed(TEXTS, normalize=True).values, atol=1e-5)
    assert build_in_child(spec, tiny_dir, tmp_path, timeout_s=600)  # cached: no second child


@pytest.mark.slow  # a child process: ~6 s on a 2-core machine
def test_a_failed_child_build_is_logged_and_left_to_the_caller(tiny_dir, tmp_path, caplog):
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    spec = ModelSpec(id="broken", source=str(empty), cpu_backend="onnx")
    with caplog.at_level(logging.WARNING, logger="blitz.onnx_export"):
        assert build_in_child(spec, empty, tmp_path / "cache", timeout_s=600) is False
    assert "'broken': the child build failed" in caplog.text
    assert not is_cached(spec, empty, tmp_path / "cache")
