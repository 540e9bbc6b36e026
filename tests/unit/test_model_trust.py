"""A model folder that would run its own code is refused unless its spec trusts it."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from blitz.errors import ModelLoadFailed
from blitz.loading import onnx_export
from blitz.loading.accuracy import AccuracyReport
from blitz.loading.load import load_encoder
from blitz.loading.model_trust import UntrustedCode, code_references
from blitz.settings.registry import ModelSpec
from blitz.sources import model_cache
from tests.tiny_models import CODE_CARRYING_TYPE, build_code_carrying_model, minilm_dir

EVIL_TYPE = CODE_CARRYING_TYPE


@pytest.fixture
def marker(tmp_path) -> Path:
    return tmp_path / "evil-ran"


@pytest.fixture
def evil_dir(tiny_dir, tmp_path, marker) -> Path:
    """The tiny bi-encoder with one more module in modules.json: a class of its own."""
    return build_code_carrying_model(tiny_dir, tmp_path / "evil-model", marker)


@pytest.fixture
def modules_cache(tmp_path, monkeypatch):
    """transformers copies trusted modules into its modules cache: a temporary one here."""
    from transformers import dynamic_module_utils

    monkeypatch.setattr(dynamic_module_utils, "HF_MODULES_CACHE", str(tmp_path / "hf-modules"))
    monkeypatch.setattr(sys, "path", list(sys.path))


def test_a_custom_module_is_refused_before_its_code_runs(evil_dir, marker, tmp_path):
    spec = ModelSpec(id="evil", source=str(evil_dir))
    with pytest.raises(ModelLoadFailed, match="modeling_evil.Evil") as caught:
        load_encoder(spec, cache_dir=tmp_path / "cache")
    assert "trust_remote_code" in caught.value.message and caught.value.model == "evil"
    public = caught.value.public_message()  # what the client reads: what, not where
    assert "modeling_evil.Evil" in public and "trust_remote_code" in public
    assert str(evil_dir) not in public
    assert not marker.exists()


@pytest.mark.parametrize("backend", ["onnx", "onnx-int8"])
def test_the_onnx_export_refuses_it_too(evil_dir, marker, tmp_path, backend):
    """What the ONNX child process and ``blitz optimize`` call: refused before the export
    opens the folder, and nothing is cached."""
    spec = ModelSpec(id="evil", source=str(evil_dir), cpu_backend=backend)
    with pytest.raises(UntrustedCode, match="modeling_evil.Evil.*trust_remote_code"):
        onnx_export.prepare_onnx(spec, evil_dir, tmp_path / "cache")
    assert not marker.exists()
    assert not (tmp_path / "cache" / onnx_export.AREA).exists()


def test_a_trusted_custom_module_loads(evil_dir, marker, tmp_path, modules_cache):
    spec = ModelSpec(id="evil", source=str(evil_dir), trust_remote_code=True)
    encoder = load_encoder(spec, cache_dir=tmp_path / "cache")
    assert encoder.embed(["hello world"], normalize=True).values.shape == (1, 32)
    assert marker.exists()  # trusted: its code is the model's own business


def test_auto_map_in_config_is_refused(tiny_dir, tmp_path):
    folder = shutil.copytree(tiny_dir, tmp_path / "auto-map")
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "modeling_evil.EvilModel"}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadFailed, match="config.json has auto_map.*trust_remote_code"):
        load_encoder(ModelSpec(id="mapped", source=str(folder)), cache_dir=tmp_path / "cache")


def _folder(tmp_path: Path, files: dict[str, object]) -> Path:
    for name, value in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(value if isinstance(value, str) else json.dumps(value))
    return tmp_path


def _modules(*types: str, path: str = "") -> list[dict]:
    return [{"idx": i, "name": str(i), "path": path, "type": t} for i, t in enumerate(types)]


@pytest.mark.parametrize("files, refused", [
    ({"modules.json": _modules("sentence_transformers.models.Transformer",  # legacy names
                               "sentence_transformers.models.Pooling",
                               "sentence_transformers.base.modules.dense.Dense")}, []),
    ({"modules.json": _modules("sentence_transformers.models.Transformer",  # PyLate's Dense:
                               "pylate.models.Dense.Dense")}, []),  # ST6 opens its own
    ({"modules.json": _modules("pylate.models.Dense.Other")}, ["pylate.models.Dense.Other"]),
    ({"modules.json": _modules(EVIL_TYPE)}, ["modeling_evil.Evil"]),
    ({"modules.json": _modules("os.system")}, ["os.system"]),  # an installed module's code
    ({"modules.json": _modules("sentence_transformers_evil.X")}, ["sentence_transformers_evil"]),
    ({"modules.json": _modules("sentence_transformers.models.Pooling", path="../other")},
     ["module path '../other'"]),
    ({"modules.json": {"type": EVIL_TYPE}}, ["not a list of modules"]),
    ({"modules.json": "[{"}, ["modules.json cannot be read"]),
    ({"2_Router/router_config.json": {"types": {"query": EVIL_TYPE}}},
     ["2_Router/router_config.json names the module type 'modeling_evil.Evil'"]),
    ({"tokenizer_config.json": {"auto_map": {"AutoTokenizer": ["tok.Evil", None]}}},
     ["tokenizer_config.json has auto_map"]),
    ({"0_Transformer/config.json": {"model_type": "bert", "auto_map": {"AutoModel": "m.M"}}},
     ["0_Transformer/config.json has auto_map"]),
    ({"config.json": {"model_type": "bert"}, "README.json": {"auto_map": {}}}, []),
])
def test_what_counts_as_code(tmp_path, files, refused):
    found = code_references(_folder(tmp_path, files))
    assert len(found) == len(refused)
    for said, expected in zip(found, refused, strict=True):
        assert expected in said


def test_links_are_followed_inside_the_folder_only(tmp_path):
    folder = _folder(tmp_path / "model", {"config.json": {"model_type": "bert"},
                                         "1_Pooling/config.json": {"pooling_mode": "mean"}})
    (folder / "1_Pooling" / "again").symlink_to(folder, target_is_directory=True)  # a loop
    assert code_references(folder) == []
    outside = _folder(tmp_path / "elsewhere", {"router_config.json": {"types": {"a": EVIL_TYPE}}})
    (folder / "2_Router").symlink_to(outside, target_is_directory=True)
    (folder / "tokenizer_config.json").symlink_to("/dev/zero")  # never read to the end
    found = code_references(folder)
    assert len(found) == 2
    assert "2_Router links to a folder outside the model folder" in found[0]
    assert "tokenizer_config.json cannot be read to check it" in found[1]


def test_the_shipped_model_names_no_code():
    assert code_references(minilm_dir()) == []


def test_a_cached_build_that_names_code_is_rebuilt_not_opened(tmp_path, monkeypatch):
    """Anyone who can write the cache could add a module to a cached ONNX build."""
    source = tmp_path / "source"
    source.mkdir()
    spec = ModelSpec(id="m", source=str(source), cpu_backend="onnx")
    builds: list[int] = []

    def build(spec, path, tmp, quantization, say):
        builds.append(1)
        (tmp / "onnx").mkdir()
        (tmp / onnx_export.ONNX_FILE).write_bytes(b"graph")
        (tmp / "modules.json").write_text(json.dumps(_modules(
            "sentence_transformers.models.Transformer")))
        return onnx_export.ONNX_FILE, AccuracyReport("cosine", 1.0, 1.0, 3), None

    monkeypatch.setattr(onnx_export, "_build_onnx", build)
    monkeypatch.setattr(onnx_export, "_native_verdict", lambda *_: "a fake graph")
    first = onnx_export.prepare_onnx(spec, source, tmp_path / "cache")
    forged = _modules("sentence_transformers.models.Transformer", EVIL_TYPE)
    (first.path / "modules.json").write_text(json.dumps(forged))
    meta = json.loads((first.path / model_cache.ENTRY_FILE).read_text())
    meta["contents"]["modules.json"] = (first.path / "modules.json").stat().st_size
    (first.path / model_cache.ENTRY_FILE).write_text(json.dumps(meta))  # a careful forger
    opened: list[Path] = []

    again = onnx_export.prepare_onnx(spec, source, tmp_path / "cache",
                                     validate=lambda directory, *_: opened.append(directory))
    assert again.built and len(builds) == 2
    assert EVIL_TYPE not in (again.path / "modules.json").read_text()
    assert opened == [again.path]  # only the rebuilt, clean folder was opened
