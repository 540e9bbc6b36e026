"""Benchmark models with random weights (loadtest.models) and the run summary (loadtest.summary)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import orjson
import pytest

from loadtest import cli, models, summary


def test_bert_base_has_the_shape_of_bge_base():
    config = models.bert_config(models.SHAPES["bert-base"])
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"],
            config["intermediate_size"], config["max_position_embeddings"],
            config["vocab_size"]) == (12, 768, 12, 3072, 512, 30522)
    files = models.sentence_transformers_files(models.SHAPES["bert-base"])
    pooling = files["1_Pooling/config.json"]
    assert pooling["word_embedding_dimension"] == 768 and pooling["pooling_mode_mean_tokens"]
    assert [m["type"].rsplit(".", 1)[1] for m in files["modules.json"]] == [
        "Transformer", "Pooling", "Normalize"]


def test_built_folder_loads_as_a_normalizing_sentence_transformer(tmp_path: Path):
    from sentence_transformers import SentenceTransformer

    shape = models.Shape(layers=1, hidden=32, heads=2, intermediate=64, max_positions=128,
                         max_seq_length=128)
    first = models.build(shape, tmp_path / "a", seed=3)
    models.build(shape, tmp_path / "b", seed=3)
    config = json.loads((first / "config.json").read_text())
    assert (config["num_hidden_layers"], config["hidden_size"]) == (1, 32)
    assert (first / "vocab.txt").read_text() == (models.tokenizer_dir() / "vocab.txt").read_text()
    vectors = [SentenceTransformer(str(path), device="cpu", local_files_only=True).encode(
        ["a cat sat on the mat", "quantum physics"]) for path in (first, tmp_path / "b")]
    assert vectors[0].shape == (2, 32)
    np.testing.assert_allclose(np.linalg.norm(vectors[0], axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(vectors[0], vectors[1])  # seeded: same weights


def _served(path: Path, emb_s: float, errors: int = 0) -> None:
    path.write_bytes(orjson.dumps({"kind": "loadtest", "results": [
        {"embeddings_per_s": emb_s, "errors": errors,
         "latency_ms": {"p50": 10.0, "p99": 20.0}}]}))


def _inprocess(path: Path, rows: list[tuple[str, str, int, float]]) -> None:
    path.write_bytes(orjson.dumps({"kind": "inprocess", "results": [
        {"engine": e, "backend": b, "texts_per_call": n, "embeddings_per_s": v}
        for e, b, n, v in rows]}))


def _cells(markdown: str, label: str) -> list[str]:
    line = next(line for line in markdown.splitlines() if line.startswith(f"| {label} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_report_divides_by_the_same_backend_and_the_best_infinity(tmp_path: Path):
    _inprocess(tmp_path / "inprocess-int8.json",
               [("blitz", "onnx-int8", 1, 400.0), ("blitz", "onnx-int8", 32, 500.0)])
    _inprocess(tmp_path / "inprocess-torch.json",
               [("blitz", "torch", 1, 100.0), ("blitz", "torch", 32, 300.0),
                ("sentence-transformers", "torch", 1, 80.0),
                ("sentence-transformers", "torch", 32, 200.0)])
    _served(tmp_path / "blitz-minilm-int8-single.json", 320.0)
    _served(tmp_path / "blitz-minilm-int8-batch32.json", 450.0, errors=2)
    _served(tmp_path / "infinity-minilm-torch-single.json", 100.0)
    _served(tmp_path / "infinity-minilm-torch-batch32.json", 180.0)
    _served(tmp_path / "infinity-minilm-optimum-single.json", 200.0)
    _served(tmp_path / "infinity-minilm-optimum-batch32.json", 150.0)
    text = summary.report(tmp_path)

    int8 = _cells(text, "**Blitz `minilm-int8` (ONNX int8), msgpack**")
    assert int8[1:7] == ["320.0", "450.0", "0.80x", "0.90x", "1.60x", "2.50x"]
    assert int8[-1] == "0 / 2"
    infinity_torch = _cells(text, "Infinity, torch engine (OpenAI API, float)")
    assert infinity_torch[3:5] == ["1.25x", "0.90x"]  # over SentenceTransformer.encode
    assert _cells(text, "in-process `SentenceTransformer.encode`, torch fp32")[1:3] == [
        "80.0", "200.0"]
    # not measured in this run: shown as "-", not dropped or guessed
    assert _cells(text, "**Blitz `minilm-fp32` (torch fp32), msgpack**")[1:5] == ["-"] * 4
    assert _cells(text, "**Blitz `bert-base-int8` (ONNX int8), msgpack**")[1:3] == ["-", "-"]


def test_report_command_prints_the_tables(tmp_path: Path, capsys: pytest.CaptureFixture):
    _served(tmp_path / "naive-single.json", 90.0)
    assert cli.main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert _cells(out, "naive: FastAPI + sentence-transformers, 2 gunicorn workers (JSON)")[1] \
        == "90.0"
    assert "### BERT-base-sized model" in out
    assert cli.main(["report", str(tmp_path / "missing")]) == 2


def test_bench_config_is_serve_config_plus_the_model_on_each_cpu_backend(tmp_path):
    import yaml

    from blitz.settings.config import BlitzSettings
    from loadtest.models import bench_config

    base = yaml.safe_load(Path("serve_config.yaml").read_text())
    config = yaml.safe_load(bench_config("serve_config.yaml", "bert-base", tmp_path))
    args, base_args = config["applications"][0]["args"], base["applications"][0]["args"]
    added = args["models"][len(base_args["models"]):]
    assert [(m["id"], m["cpu_backend"], m["source"]) for m in added] == [
        ("bert-base", "torch", str(tmp_path)), ("bert-base-bf16", "torch-bf16", str(tmp_path)),
        ("bert-base-int8", "onnx-int8", str(tmp_path))]
    assert {k: v for k, v in args.items() if k != "models"} == {
        k: v for k, v in base_args.items() if k != "models"}
    assert BlitzSettings.from_args(args).registry().get("bert-base-int8").cpu_backend == "onnx-int8"
