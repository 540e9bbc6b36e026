"""ONNX builds: export, int8, their cache entries (corrupt ones, concurrent builders) and
the accuracy guard on what they build."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from blitz.encoders.st_models import open_torch_bi_encoder
from blitz.errors import ModelLoadFailed
from blitz.loading import onnx_export, opening
from blitz.loading.load import load_encoder
from blitz.runtime import cpu_features
from blitz.settings.registry import ModelSpec
from blitz.sources import model_cache
from tests.tiny_models import build_tiny_bi_encoder, build_tiny_cross_encoder

REPO = Path(__file__).resolve().parents[2]
TEXTS = ["The quick brown fox jumps over the lazy dog.", "hello", "Where is the station?"]


pytestmark = pytest.mark.usefixtures("no_home_cache")


@pytest.fixture(autouse=True)
def build_in_process(monkeypatch):
    """These tests count and break exports in this process; the child build
    (blitz.loading.child_work) has its own tests."""
    monkeypatch.setattr(opening, "BUILD_IN_CHILD", False)


@pytest.fixture(scope="module")
def other_tiny_dir(tmp_path_factory) -> Path:
    return build_tiny_bi_encoder(tmp_path_factory.mktemp("tiny") / "other", seed=1)


def _entries(cache: Path) -> list[Path]:
    area = cache / onnx_export.AREA
    return sorted(area.iterdir()) if area.exists() else []


def _spec(source: Path | str, backend: str = "onnx", **fields) -> ModelSpec:
    return ModelSpec(id="tiny", source=str(source), cpu_backend=backend, **fields)


def _no_export(*_args, **_kwargs):
    raise AssertionError("the cached build should have been reused")


# --- ONNX export and the cache ----------------------------------------------------------

def test_onnx_matches_torch_and_is_built_once(tiny_dir, tmp_path, monkeypatch):
    onnx = load_encoder(_spec(tiny_dir), cache_dir=tmp_path)
    torch = load_encoder(_spec(tiny_dir, "torch"))
    np.testing.assert_allclose(onnx.embed(TEXTS, normalize=True).values,
                               torch.embed(TEXTS, normalize=True).values, atol=1e-5)
    [entry] = _entries(tmp_path)
    meta = json.loads((entry / model_cache.ENTRY_FILE).read_text())
    assert (entry / meta["file_name"]).is_file()
    assert meta["versions"]["onnxruntime"] != "absent"
    assert meta["accuracy"]["minimum"] > 0.9999

    monkeypatch.setattr(onnx_export, "_export_onnx", _no_export)
    again = load_encoder(_spec(tiny_dir), cache_dir=tmp_path)
    again.warmup()
    np.testing.assert_allclose(again.embed(TEXTS, normalize=True).values,
                               onnx.embed(TEXTS, normalize=True).values, atol=1e-6)
    assert _entries(tmp_path) == [entry]


def test_int8_build_keeps_only_the_int8_graph(tiny_dir, tmp_path):
    spec = _spec(tiny_dir, "onnx-int8", accuracy_threshold=0.9)
    prepared = onnx_export.prepare_onnx(spec, tiny_dir, tmp_path)
    assert prepared.built and prepared.int8_recipe in {r.name for r in onnx_export.INT8_RECIPES}
    assert prepared.file_name == f"onnx/model_qint8_{cpu_features.quantization_target()}.onnx"
    assert [p.name for p in (prepared.path / "onnx").iterdir()] == [Path(prepared.file_name).name]
    encoder = load_encoder(spec, cache_dir=tmp_path)
    assert encoder.embed(TEXTS, normalize=True).values.shape == (3, 32)
    again = onnx_export.prepare_onnx(spec, tiny_dir, tmp_path)
    assert not again.built and again.path == prepared.path


def test_int8_without_transformer_fusion_still_builds(tiny_dir, tmp_path, monkeypatch):
    import onnxruntime.transformers.optimizer as ort_optimizer

    def fail(*_args, **_kwargs):
        raise RuntimeError("no fusion for this graph")

    monkeypatch.setattr(ort_optimizer, "optimize_model", fail)
    spec = _spec(tiny_dir, "onnx-int8", accuracy_threshold=0)
    prepared = onnx_export.prepare_onnx(spec, tiny_dir, tmp_path)
    assert prepared.built and (prepared.path / prepared.file_name).is_file()
    assert load_encoder(spec, cache_dir=tmp_path).embed(TEXTS, normalize=True).values.shape == (
        3, 32)


def test_new_library_versions_mean_a_new_build(tiny_dir, tmp_path, monkeypatch):
    first = onnx_export.prepare_onnx(_spec(tiny_dir), tiny_dir, tmp_path)
    versions = model_cache.library_versions()
    monkeypatch.setattr(model_cache, "library_versions",
                        lambda: {**versions, "onnxruntime": "0.0.1"})
    second = onnx_export.prepare_onnx(_spec(tiny_dir), tiny_dir, tmp_path)
    assert second.built and second.path != first.path
    assert len(_entries(tmp_path)) == 2


def test_a_build_of_the_optimum_era_is_left_alone_and_built_anew(tiny_dir, tmp_path):
    """A cache filled by Blitz before it dropped optimum-onnx (cache format 4, transformers
    4.57, optimum's exporter): its entry has another key, so it is never reused; a new
    build is made beside it and the old one is left as it was."""
    spec = _spec(tiny_dir)
    current = onnx_export.prepare_onnx(spec, tiny_dir, tmp_path)
    _, parts = onnx_export.onnx_cache_key(spec, tiny_dir)
    old_versions = {**parts["versions"], "transformers": "4.57.6",
                    "sentence-transformers": "5.7.0", "optimum": "2.1.0",
                    "optimum-onnx": "0.1.0"}
    old_key = model_cache.entry_key("tiny-onnx", {**parts, "format": 4,
                                                  "versions": old_versions})
    old = current.path.parent / old_key
    current.path.rename(old)  # what the old release left: a complete, valid entry
    meta = json.loads((old / model_cache.ENTRY_FILE).read_text())
    (old / model_cache.ENTRY_FILE).write_text(json.dumps(
        {**meta, "format": 4, "versions": old_versions}))
    before = sorted(p.relative_to(old) for p in old.rglob("*"))

    again = onnx_export.prepare_onnx(spec, tiny_dir, tmp_path)
    assert again.built and again.path == current.path != old
    assert sorted(p.relative_to(old) for p in old.rglob("*")) == before


def test_a_model_with_a_dense_layer_runs_its_graph_inside_sentence_transformers(tmp_path):
    """A layout onnxruntime alone does not run (a Dense projection after the pooling): the
    model opens as sentence-transformers' own with the graph in its transformer's place, no
    torch weights left there, and answers as torch does."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense

    from blitz.encoders.sentence_transformer import SentenceTransformerEncoder

    base = build_tiny_bi_encoder(tmp_path / "base", seed=9)
    model = SentenceTransformer(str(base), device="cpu")
    model.append(Dense(32, 16))
    model.save_pretrained(str(tmp_path / "dense"))
    spec = _spec(tmp_path / "dense")
    onnx = load_encoder(spec, cache_dir=tmp_path / "cache")
    torch = load_encoder(spec.model_copy(update={"cpu_backend": "torch"}))
    assert isinstance(onnx, SentenceTransformerEncoder) and onnx.dimension == 16
    transformer = onnx.model[0].model
    assert type(transformer).__name__ == "OnnxTransformer"
    assert sum(p.numel() for p in transformer.parameters()) == 0  # the graph holds them
    np.testing.assert_allclose(onnx.embed(TEXTS, normalize=True).values,
                               torch.embed(TEXTS, normalize=True).values, atol=1e-5)
    meta = json.loads((_entries(tmp_path / "cache")[0] / model_cache.ENTRY_FILE).read_text())
    assert meta["native"] is False and "Dense" in meta["native_note"]


def test_cross_encoder_onnx_scores_match_torch(tmp_path):
    path = build_tiny_cross_encoder(tmp_path / "ce")
    spec = ModelSpec(id="ce", source=str(path), kind="cross-encoder", cpu_backend="onnx")
    onnx = load_encoder(spec, cache_dir=tmp_path / "cache")
    torch = load_encoder(spec.model_copy(update={"cpu_backend": "torch"}))
    documents = ["a passage about trains", "something else entirely", "trains"]
    np.testing.assert_allclose(onnx.score("trains", documents).values,
                               torch.score("trains", documents).values, atol=1e-5)
    meta = json.loads((_entries(tmp_path / "cache")[0] / model_cache.ENTRY_FILE).read_text())
    assert meta["accuracy"]["metric"] == "pearson"


def test_plain_transformers_checkpoint_gets_the_spec_pooling(tiny_dir, tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    for file in tiny_dir.iterdir():  # the BERT checkpoint without sentence-transformers files
        if file.is_file() and file.name not in ("modules.json", "sentence_bert_config.json"):
            (plain / file.name).write_bytes(file.read_bytes())
    spec = ModelSpec(id="plain", source=str(plain), cpu_backend="onnx", pooling="cls")
    onnx = load_encoder(spec, cache_dir=tmp_path / "cache")
    torch = load_encoder(spec.model_copy(update={"cpu_backend": "torch"}))
    np.testing.assert_allclose(onnx.embed(TEXTS, normalize=True).values,
                               torch.embed(TEXTS, normalize=True).values, atol=1e-5)


# --- corrupt cache entries --------------------------------------------------------------

@pytest.mark.parametrize("corruption", ["truncated graph", "garbled graph", "garbage entry file"])
def test_a_corrupt_cached_build_is_rebuilt(tiny_dir, tmp_path, caplog, monkeypatch, corruption):
    spec = _spec(tiny_dir)
    expected = load_encoder(spec, cache_dir=tmp_path).embed(TEXTS, normalize=True).values
    [entry] = _entries(tmp_path)
    before = json.loads((entry / model_cache.ENTRY_FILE).read_text())
    graph = entry / onnx_export.ONNX_FILE
    data = graph.read_bytes()
    if corruption == "truncated graph":  # a copy cut short: the recorded size tells
        graph.write_bytes(data[: len(data) // 2])
    elif corruption == "garbled graph":  # same size: only onnxruntime failing to load tells
        graph.write_bytes(b"\x07" * len(data))
    else:
        (entry / model_cache.ENTRY_FILE).write_text('{"format": 3, "file_na')
    exports = []
    real_export = onnx_export._export_onnx
    monkeypatch.setattr(onnx_export, "_export_onnx",
                        lambda *a: exports.append(1) or real_export(*a))

    with caplog.at_level(logging.WARNING, logger="blitz.model_cache"):
        again = load_encoder(spec, cache_dir=tmp_path)
    assert len(exports) == 1
    assert f"model cache entry {entry} is corrupt" in caplog.text and "rebuilding" in caplog.text
    np.testing.assert_allclose(again.embed(TEXTS, normalize=True).values, expected, atol=1e-6)
    assert _entries(tmp_path) == [entry]  # rebuilt in place, the bad copy gone
    after = json.loads((entry / model_cache.ENTRY_FILE).read_text())
    assert after["build_id"] != before["build_id"] and graph.read_bytes() == data

    load_encoder(spec, cache_dir=tmp_path)  # and from now on it is found again
    assert len(exports) == 1


def test_a_build_that_cannot_be_loaded_twice_is_an_error(tiny_dir, tmp_path, monkeypatch):
    spec = _spec(tiny_dir)
    load_encoder(spec, cache_dir=tmp_path)
    exports = []
    real_export = onnx_export._export_onnx
    monkeypatch.setattr(onnx_export, "_export_onnx",
                        lambda *a: exports.append(1) or real_export(*a))

    def unloadable(*_args):
        raise RuntimeError("onnxruntime cannot load this graph")

    monkeypatch.setattr(onnx_export, "open_onnx_file", unloadable)
    with pytest.raises(ModelLoadFailed, match="'tiny'.*cannot load this graph") as caught:
        load_encoder(spec, cache_dir=tmp_path)
    assert caught.value.model == "tiny"
    assert len(exports) == 1  # one rebuild, then the error; no loop


# --- concurrency ------------------------------------------------------------------------

_CHILD = """
import json, sys
from pathlib import Path
from blitz.loading.onnx_export import prepare_onnx
from blitz.settings.registry import ModelSpec
spec = ModelSpec(id="tiny", source=sys.argv[1], cpu_backend="onnx-int8", accuracy_threshold=0)
print("ready", flush=True)
prepared = prepare_onnx(spec, Path(sys.argv[1]), sys.argv[2])
print(json.dumps({"built": prepared.built, "path": str(prepared.path)}), flush=True)
"""


@pytest.mark.slow  # two ONNX builds: ~12 s on a 2-core machine
def test_two_processes_preparing_at_once_build_one_entry(tiny_dir, tmp_path):
    spec = _spec(tiny_dir, "onnx-int8", accuracy_threshold=0)
    key, _ = onnx_export.onnx_cache_key(spec, tiny_dir)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    lock = model_cache.lock_path(tmp_path, onnx_export.AREA, key)
    with model_cache.file_lock(lock):  # hold the builders back until both are started
        children = [subprocess.Popen([sys.executable, "-c", _CHILD, str(tiny_dir), str(tmp_path)],
                                     stdout=subprocess.PIPE, text=True, env=env, cwd=REPO)
                    for _ in range(2)]
        for child in children:
            assert child.stdout.readline().strip() == "ready"
    results = []
    for child in children:
        out, _ = child.communicate(timeout=300)
        assert child.returncode == 0
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(r["built"] for r in results) == [False, True]
    assert len({r["path"] for r in results}) == 1
    assert _entries(tmp_path) == [Path(results[0]["path"])]  # no temp dirs left behind
    encoder = load_encoder(spec, cache_dir=tmp_path)
    assert encoder.embed(TEXTS, normalize=True).values.shape == (3, 32)


def test_threads_preparing_at_once_build_once(tiny_dir, tmp_path, monkeypatch):
    exports = []
    real_export = onnx_export._export_onnx
    monkeypatch.setattr(onnx_export, "_export_onnx",
                        lambda *a: exports.append(1) or real_export(*a))
    results: list[onnx_export.PreparedModel] = []
    threads = [threading.Thread(target=lambda: results.append(
        onnx_export.prepare_onnx(_spec(tiny_dir), tiny_dir, tmp_path))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(exports) == 1 and len(results) == 3
    assert len({r.path for r in results}) == 1 and sum(r.built for r in results) == 1


# --- the accuracy guard -----------------------------------------------------------------

def test_guard_refuses_a_build_below_the_threshold_and_remembers(tiny_dir, tmp_path,
                                                                 monkeypatch):
    spec = _spec(tiny_dir, "onnx-int8", accuracy_threshold=1.0)
    with pytest.raises(ModelLoadFailed) as caught:
        load_encoder(spec, cache_dir=tmp_path)
    message = caught.value.message
    assert caught.value.status == 424
    assert "'tiny'" in message and "min cosine 0.9" in message and "accuracy_threshold 1.0" in message
    [entry] = _entries(tmp_path)  # the failure is recorded ...
    assert json.loads((entry / model_cache.ENTRY_FILE).read_text())["accuracy"]["minimum"] < 1
    monkeypatch.setattr(onnx_export, "_export_onnx", _no_export)
    with pytest.raises(ModelLoadFailed, match="not accurate enough"):  # ... and never served
        load_encoder(spec, cache_dir=tmp_path)


def test_guard_refuses_a_corrupted_export(tiny_dir, other_tiny_dir, tmp_path, monkeypatch):
    real_export = onnx_export._export_onnx
    monkeypatch.setattr(onnx_export, "_export_onnx",  # an export of the wrong weights
                        lambda spec, model, tmp: real_export(
                            spec, open_torch_bi_encoder(spec, other_tiny_dir), tmp))
    with pytest.raises(ModelLoadFailed, match=r"onnx build is not accurate enough.*min cosine"):
        load_encoder(_spec(tiny_dir), cache_dir=tmp_path)
