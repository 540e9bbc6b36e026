"""loadtest.gpu's no-server part on a machine without CUDA: the GPU pool's encoder falls
back to the CPU, so the report's accuracy and throughput rows are those of the CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest import gpu

pytestmark = pytest.mark.slow


def test_encode_reports_accuracy_and_every_call_size(tiny_models, tmp_path, monkeypatch):
    monkeypatch.setattr(gpu, "REFERENCE_TEXTS", 48)
    monkeypatch.setattr(gpu, "SIZES", (1, 32))
    source = str(tiny_models["tiny-a"])
    gpu.reference(source, tmp_path / "ref.npy")
    result = gpu.encode(source, tmp_path / "ref.npy", tmp_path, seconds=0.05)

    assert json.loads((tmp_path / "gpu-encode.json").read_text()) == result
    for dtype in ("float16", "float32"):  # on the CPU both are the fp32 torch backend
        accuracy = result["accuracy"][dtype]
        assert accuracy["min_cos_vs_cpu_fp32"] > 0.9999
        assert accuracy["min_cos_single_vs_batched"] > 0.9999
    timed = [row for row in result["throughput"] if "pass" not in row]
    assert [(row["dtype"], row["texts_per_call"]) for row in timed] == [
        ("float16", 1), ("float16", 32), ("float32", 1), ("float32", 32)]
    cold = [row for row in result["throughput"] if row.get("pass") == "cold"]
    assert [row["dtype"] for row in cold] == ["float16", "float32"]  # first calls, no warm-up
    assert all(row["texts_per_s"] > 0 and row["calls"] >= 3 for row in result["throughput"])
    assert result["device"]["cuda"] is False


def test_a_reference_of_another_model_is_refused(tiny_models, tmp_path, monkeypatch):
    monkeypatch.setattr(gpu, "REFERENCE_TEXTS", 16)
    monkeypatch.setattr(gpu, "SIZES", (1,))
    gpu.reference(str(tiny_models["tiny-b"]), tmp_path / "ref-b.npy")
    with pytest.raises(ValueError, match="reference"):  # 32 dimensions against 48
        gpu.encode(str(tiny_models["tiny-a"]), tmp_path / "ref-b.npy", tmp_path, seconds=0.05)


def test_the_gpu_run_takes_the_fast_path_as_serve_config_does(monkeypatch):
    import yaml

    from loadtest.gpu import fast_path_env

    monkeypatch.delenv("BLITZ_HAPROXY_REAL", raising=False)
    root = Path(__file__).resolve().parents[2]
    env = fast_path_env(root)
    shipped = yaml.safe_load((root / "serve_config.yaml").read_text())
    for name, value in shipped["controller_options"]["runtime_env"]["env_vars"].items():
        assert env[name] == (str(root / value) if name.endswith("BINARY_PATH") else value)
    assert Path(env["BLITZ_HAPROXY_REAL"]).is_file()
