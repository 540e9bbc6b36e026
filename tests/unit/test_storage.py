"""Object-storage sources against a real S3-compatible server (moto) on 127.0.0.1."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import numpy as np
import pytest

from blitz.errors import ModelLoadFailed
from blitz.loading.failures import as_load_failure
from blitz.loading.fetch import resolve_source
from blitz.loading.load import load_encoder
from blitz.settings.registry import ModelSpec
from blitz.sources import model_cache
from blitz.sources.model_cache import ENTRY_FILE
from blitz.sources.storage import ObjectStoreError, _relative, fetch_to_cache, storage_options
from tests.moto_s3 import moto_s3

pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")

BUCKET = "models"



@pytest.fixture
def s3(monkeypatch, tiny_dir):
    """A moto S3 server with the tiny model under s3://models/tiny/; stopped afterwards."""
    with moto_s3(monkeypatch, BUCKET) as (server, client):
        for file in tiny_dir.rglob("*"):
            if file.is_file():
                client.upload_file(str(file), BUCKET,
                                   f"tiny/{file.relative_to(tiny_dir).as_posix()}")
        client.put_object(Bucket=BUCKET, Key="tiny-sibling/unrelated.bin",
                          Body=b"not part of it")
        yield server


def _spec(source: str, **fields) -> ModelSpec:
    return ModelSpec(id="remote", source=source, **fields)


def test_downloads_the_prefix_and_the_model_loads(s3, tiny_dir, tmp_path):
    path = fetch_to_cache("remote", "s3://models/tiny", tmp_path)
    local = sorted(p.relative_to(tiny_dir).as_posix() for p in tiny_dir.rglob("*") if p.is_file())
    fetched = sorted(p.relative_to(path).as_posix() for p in path.rglob("*")
                     if p.is_file() and p.name != ENTRY_FILE)
    assert fetched == local  # the whole prefix, and nothing from the sibling prefix
    assert (path / "model.safetensors").read_bytes() == (tiny_dir / "model.safetensors").read_bytes()

    remote = load_encoder(_spec("s3://models/tiny/"), cache_dir=tmp_path)
    here = load_encoder(_spec(str(tiny_dir)))
    texts = ["object storage", "a second sentence"]
    np.testing.assert_allclose(remote.embed(texts, normalize=True).values,
                               here.embed(texts, normalize=True).values, atol=1e-6)


@pytest.mark.parametrize("uri", ["s3://models/no-such-model", "s3://no-such-bucket/tiny"])
def test_missing_objects_fail_with_424_naming_model_and_uri(s3, tmp_path, uri):
    with pytest.raises(ObjectStoreError):
        resolve_source(_spec(uri), tmp_path)
    with pytest.raises(ModelLoadFailed) as caught:  # what the loader's boundary makes of it
        load_encoder(_spec(uri), cache_dir=tmp_path)
    assert caught.value.status == 424
    assert "'remote'" in caught.value.message and uri in caught.value.message
    assert not list((tmp_path / "sources").iterdir())  # nothing cached, no temp dir left


def test_a_cache_hit_never_contacts_the_server(s3, tmp_path):
    first = fetch_to_cache("remote", "s3://models/tiny", tmp_path)
    s3.stop()  # from here on, any request would fail
    second = fetch_to_cache("remote", "s3://models/tiny", tmp_path)
    assert second == first
    encoder = load_encoder(_spec("s3://models/tiny"), cache_dir=tmp_path)
    assert encoder.embed(["still served"], normalize=True).values.shape == (1, 32)


@pytest.mark.parametrize("corruption", ["truncated", "missing"])
def test_a_damaged_copy_is_downloaded_again(s3, tiny_dir, tmp_path, caplog, corruption):
    first = fetch_to_cache("remote", "s3://models/tiny", tmp_path)
    weights = first / "model.safetensors"
    if corruption == "truncated":
        weights.write_bytes(weights.read_bytes()[:1000])
    else:
        weights.unlink()
    with caplog.at_level(logging.WARNING, logger="blitz.model_cache"):
        again = fetch_to_cache("remote", "s3://models/tiny", tmp_path)
    assert again == first and f"model cache entry {first} is corrupt" in caplog.text
    assert weights.read_bytes() == (tiny_dir / "model.safetensors").read_bytes()
    assert [p.name for p in (tmp_path / "sources").iterdir()] == [first.name]
    assert load_encoder(_spec("s3://models/tiny"), cache_dir=tmp_path).embed(
        ["repaired"], normalize=True).values.shape == (1, 32)


def test_a_download_held_up_elsewhere_times_out(tmp_path):
    uri = "s3://models/tiny"
    key = model_cache.entry_key("tiny", {"uri": uri})
    lock = model_cache.lock_path(tmp_path, "sources", key)
    with model_cache.file_lock(lock), pytest.raises(model_cache.CacheLockTimeout) as caught:
        fetch_to_cache("remote", uri, tmp_path, lock_timeout=0.2)  # never reaches the server
    assert str(lock) in caught.value.message and "'remote'" in caught.value.message
    assert as_load_failure("remote", caught.value).public_message().startswith(
        "model 'remote' failed to load")


def test_concurrent_fetches_download_once(s3, tmp_path):
    paths: list[Path] = []
    threads = [threading.Thread(target=lambda: paths.append(
        fetch_to_cache("remote", "s3://models/tiny", tmp_path))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(paths)) == 1
    assert [p.name for p in (tmp_path / "sources").iterdir()] == [paths[0].name]


def test_endpoint_comes_from_the_standard_environment(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://general:9000")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    assert storage_options("s3") == {"endpoint_url": "http://general:9000"}
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://s3-only:9000")
    assert storage_options("s3") == {"endpoint_url": "http://s3-only:9000"}
    assert storage_options("gs") == {}


def test_a_missing_filesystem_package_is_named(tmp_path):
    try:
        import gcsfs  # noqa: F401
        pytest.skip("gcsfs is installed")
    except ImportError:
        pass
    with pytest.raises(ObjectStoreError, match="pip install gcsfs"):
        fetch_to_cache("remote", "gs://bucket/model", tmp_path)


def test_object_names_cannot_escape_the_cache():
    uri = "s3://models/tiny"
    assert _relative("remote", uri, "models/tiny", "models/tiny/1_Pooling/config.json") == (
        "1_Pooling/config.json")
    for evil in ("models/tiny/../../etc/passwd", "models/tiny/a/../../../x"):
        with pytest.raises(ObjectStoreError, match="unsafe object name"):
            _relative("remote", uri, "models/tiny", evil)
