"""The model cache on its own: corrupt entries are rebuilt, a held lock is given up on."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from blitz.errors import LoadProblem
from blitz.loading import onnx_export
from blitz.loading.accuracy import AccuracyRefused, AccuracyReport
from blitz.settings.registry import ModelSpec
from blitz.sources import model_cache

AREA, KEY = "fake-area", "fake-key"
PAYLOAD = b"weights " * 512


class Builder:
    """A build function that writes a payload file and counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, tmp: Path) -> dict:
        self.calls += 1
        (tmp / "sub").mkdir()
        (tmp / "sub" / "weights.bin").write_bytes(PAYLOAD)
        (tmp / "config.json").write_text('{"ok": true}')
        return {"build": self.calls}


def _payload_is_intact(entry: model_cache.CacheEntry) -> None:
    """A loader: raises, as a real one would, when the payload is not what was built."""
    if (entry.path / "sub" / "weights.bin").read_bytes() != PAYLOAD:
        raise ValueError("cannot parse weights.bin")


def _build(root: Path, builder: Builder, **kwargs) -> model_cache.CacheEntry:
    return model_cache.get_or_build(root, AREA, KEY, builder, validate=_payload_is_intact,
                                    **kwargs)


def _names(root: Path) -> list[str]:
    return sorted(p.name for p in (root / AREA).iterdir())


def test_an_entry_records_its_contents_and_is_reused(tmp_path):
    builder = Builder()
    first = _build(tmp_path, builder)
    assert first.built and first.meta["contents"] == {
        "config.json": 12, "sub/weights.bin": len(PAYLOAD)}
    again = _build(tmp_path, builder)
    assert not again.built and again.meta == first.meta and builder.calls == 1


@pytest.mark.parametrize("corruption", [
    "garbage entry file", "entry file not an object", "no entry file", "truncated file",
    "missing file", "same size, unreadable",
])
def test_a_corrupt_entry_is_rebuilt_once(tmp_path, caplog, corruption):
    builder = Builder()
    entry = _build(tmp_path, builder)
    weights = entry.path / "sub" / "weights.bin"
    if corruption == "garbage entry file":
        (entry.path / model_cache.ENTRY_FILE).write_text('{"key": "fake-key", "crea')
    elif corruption == "entry file not an object":
        (entry.path / model_cache.ENTRY_FILE).write_text("[]")
    elif corruption == "no entry file":
        (entry.path / model_cache.ENTRY_FILE).unlink()
    elif corruption == "truncated file":
        weights.write_bytes(PAYLOAD[:100])
    elif corruption == "missing file":
        weights.unlink()
    else:  # only loading it tells
        weights.write_bytes(b"\0" * len(PAYLOAD))

    with caplog.at_level(logging.WARNING, logger="blitz.model_cache"):
        rebuilt = _build(tmp_path, builder)
    assert rebuilt.built and rebuilt.meta["build"] == 2 and builder.calls == 2
    assert rebuilt.path == entry.path and weights.read_bytes() == PAYLOAD
    assert str(entry.path) in caplog.text and "rebuil" in caplog.text
    assert _names(tmp_path) == [KEY]  # the bad copy is gone, no temp dir left
    assert not _build(tmp_path, builder).built and builder.calls == 2


def test_a_rebuilt_entry_that_still_fails_is_an_error(tmp_path):
    builder = Builder()
    _build(tmp_path, builder)

    def never(entry: model_cache.CacheEntry) -> None:
        raise ValueError("this loader refuses everything")

    with pytest.raises(ValueError, match="refuses everything"):
        model_cache.get_or_build(tmp_path, AREA, KEY, builder, validate=never)
    assert builder.calls == 2  # rebuilt once, not in a loop


def test_an_entry_rebuilt_by_someone_else_is_not_discarded(tmp_path, monkeypatch):
    """Two processes find the same corrupt entry: the second reuses the first's rebuild."""
    builder = Builder()
    entry = _build(tmp_path, builder)
    (entry.path / "sub" / "weights.bin").write_bytes(b"\0" * len(PAYLOAD))
    real_lock = model_cache.file_lock

    def lock_after_another_rebuild(*args, **kwargs):
        # between our failed check and our lock, another process rebuilds the entry
        monkeypatch.setattr(model_cache, "file_lock", real_lock)
        other = Builder()
        other.calls = 10
        model_cache.get_or_build(tmp_path, AREA, KEY, other, validate=_payload_is_intact)
        return real_lock(*args, **kwargs)

    monkeypatch.setattr(model_cache, "file_lock", lock_after_another_rebuild)
    got = _build(tmp_path, builder)
    assert not got.built and got.meta["build"] == 11 and builder.calls == 1


# --- forged entries: anyone who can write the cache can write a record -------------------

def _forge(entry: model_cache.CacheEntry, **changes) -> None:
    """Rewrite ``entry``'s record; a change to None deletes that field."""
    meta = json.loads((entry.path / model_cache.ENTRY_FILE).read_text())
    meta.update(changes)
    meta = {name: value for name, value in meta.items() if value is not None}
    (entry.path / model_cache.ENTRY_FILE).write_text(json.dumps(meta))


@pytest.mark.parametrize("forgery", [
    "no contents", "a .. path", "an absolute path", "a link out", "the entry a link out",
])
def test_a_forged_entry_is_rebuilt_and_nothing_outside_it_is_touched(tmp_path, caplog, forgery):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "weights.bin").write_bytes(PAYLOAD)  # what a forged record points at
    (outside / ".." / "sibling.bin").write_bytes(PAYLOAD)
    builder = Builder()
    entry = _build(tmp_path / "cache", builder)
    contents = entry.meta["contents"]
    if forgery == "no contents":
        _forge(entry, contents=None)
    elif forgery == "a .. path":
        _forge(entry, contents={**contents, "../../../sibling.bin": len(PAYLOAD)})
    elif forgery == "an absolute path":
        _forge(entry, contents={**contents, str(outside / "weights.bin"): len(PAYLOAD)})
    elif forgery == "a link out":
        (entry.path / "sub" / "weights.bin").unlink()
        (entry.path / "sub" / "weights.bin").symlink_to(outside / "weights.bin")
    else:  # the whole entry swapped for a link to a directory that looks like one
        shutil.copytree(entry.path, outside / "entry")
        shutil.rmtree(entry.path)
        entry.path.symlink_to(outside / "entry", target_is_directory=True)

    with caplog.at_level(logging.WARNING, logger="blitz.model_cache"):
        rebuilt = _build(tmp_path / "cache", builder)
    assert rebuilt.built and builder.calls == 2 and "rebuilding" in caplog.text
    assert rebuilt.path.is_dir() and not rebuilt.path.is_symlink()
    assert _names(tmp_path / "cache") == [KEY]
    # the rebuild removed the forged entry only, never what its record or links named
    assert (outside / "weights.bin").read_bytes() == PAYLOAD
    assert (tmp_path / "sibling.bin").read_bytes() == PAYLOAD
    if forgery == "the entry a link out":
        assert (outside / "entry" / model_cache.ENTRY_FILE).exists()


def test_a_record_missing_a_field_its_reader_needs_is_rebuilt(tmp_path):
    builder = Builder()
    fields = {"build": int}
    entry = model_cache.get_or_build(tmp_path, AREA, KEY, builder, fields=fields)
    _forge(entry, build="1")
    again = model_cache.get_or_build(tmp_path, AREA, KEY, builder, fields=fields)
    assert again.built and again.meta["build"] == 2
    _forge(again, build=None)
    assert model_cache.get_or_build(tmp_path, AREA, KEY, builder, fields=fields).built


def _fake_onnx_build(accuracy: float, builds: list[int]):
    """``onnx_export._build_onnx`` without an export: a graph file and a given accuracy."""
    def build(spec, path, tmp, quantization, say):
        builds.append(1)
        (tmp / "onnx").mkdir()
        (tmp / onnx_export.ONNX_FILE).write_bytes(b"graph")
        return onnx_export.ONNX_FILE, AccuracyReport("cosine", accuracy, accuracy, 3), None
    return build


def _forged_onnx_entry(tmp_path: Path, spec: ModelSpec, source: Path, **record) -> Path:
    """A record planted where ``spec``'s ONNX build belongs, as an attacker would write it."""
    key, parts = onnx_export.onnx_cache_key(spec, source)
    entry = tmp_path / "cache" / onnx_export.AREA / key
    (entry / "onnx").mkdir(parents=True)
    (entry / onnx_export.ONNX_FILE).write_bytes(b"graph")
    perfect = {"metric": "cosine", "minimum": 1.0, "mean": 1.0, "probes": 3}
    meta = {**parts, "model_id": spec.id, "file_name": onnx_export.ONNX_FILE,
            "int8_recipe": None, "accuracy": perfect, "build_seconds": 1.0, "native": False,
            "contents": {onnx_export.ONNX_FILE: 5}, **record}
    (entry / model_cache.ENTRY_FILE).write_text(
        json.dumps({name: value for name, value in meta.items() if value is not None}))
    return entry


@pytest.mark.parametrize("forgery", [
    "no contents, an absolute file_name", "a .. file_name", "no contents",
    "a file_name not built", "build_seconds not a number", "accuracy not a report",
    "native not a flag",
])
def test_a_forged_onnx_record_is_rebuilt_and_meets_the_guard(tmp_path, monkeypatch, forgery):
    """A forged record claiming accuracy 1.0 must not skip the accuracy guard: the entry is
    rebuilt, and the real build (0.5 here) is refused."""
    source = tmp_path / "source"
    source.mkdir()
    outside = tmp_path / "cache" / onnx_export.AREA / "outside.onnx"
    outside.parent.mkdir(parents=True)
    outside.write_bytes(b"another graph")
    spec = ModelSpec(id="m", source=str(source), cpu_backend="onnx")
    builds: list[int] = []
    monkeypatch.setattr(onnx_export, "_build_onnx", _fake_onnx_build(0.5, builds))
    record = {
        "no contents, an absolute file_name": {"contents": None, "file_name": str(outside)},
        "a .. file_name": {"file_name": "../outside.onnx",
                           "contents": {"../outside.onnx": outside.stat().st_size}},
        "no contents": {"contents": None},
        "a file_name not built": {"file_name": "onnx/other.onnx"},
        "build_seconds not a number": {"build_seconds": "fast"},
        "native not a flag": {"native": "yes"},
        "accuracy not a report": {"accuracy": {"metric": "cosine", "minimum": "1.0",
                                               "mean": "1.0", "probes": "3"}},
    }[forgery]
    entry = _forged_onnx_entry(tmp_path, spec, source, **record)
    if forgery == "a file_name not built":
        (entry / "onnx" / "other.onnx").write_bytes(b"unchecked graph")

    with pytest.raises(AccuracyRefused, match="not accurate enough.*min cosine 0.5000"):
        onnx_export.prepare_onnx(spec, source, tmp_path / "cache")
    assert builds == [1]
    assert outside.read_bytes() == b"another graph"  # named by the record, never touched
    recorded = json.loads((entry / model_cache.ENTRY_FILE).read_text())
    assert recorded["file_name"] == onnx_export.ONNX_FILE and recorded["accuracy"]["minimum"] == 0.5


# --- the lock timeout -------------------------------------------------------------------

_HOLDER = """
import fcntl, sys, time
handle = open(sys.argv[1], "a+b")
fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(60)
"""


def test_a_lock_held_by_a_hung_process_times_out(tmp_path):
    lock = model_cache.lock_path(tmp_path, AREA, KEY)
    lock.parent.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(lock)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        builder = Builder()
        started = time.monotonic()
        with pytest.raises(model_cache.CacheLockTimeout) as caught:
            _build(tmp_path, builder, lock_timeout=0.3, model="tiny")
        waited = time.monotonic() - started
    finally:
        holder.kill()
        holder.communicate()
    assert 0.3 <= waited < 5 and builder.calls == 0
    message = caught.value.message
    assert "'tiny'" in message and str(lock) in message and f"{AREA}/{KEY}" in message
    assert "0.3 s" in message and "fuser" in message
    assert isinstance(caught.value, LoadProblem)  # the loader's boundary makes it a 424
    # the holder is gone, so the lock is free again
    assert _build(tmp_path, builder, lock_timeout=0.3).built


def test_a_waiter_gets_the_lock_when_a_thread_lets_go_in_time(tmp_path):
    lock = model_cache.lock_path(tmp_path, AREA, KEY)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with model_cache.file_lock(lock):
            held.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait(10)
    with pytest.raises(model_cache.CacheLockTimeout, match="gave up after 0.2 s"):
        with model_cache.file_lock(lock, timeout=0.2):
            pass
    threading.Timer(0.2, release.set).start()
    with model_cache.file_lock(lock, timeout=10):  # waits for the holder, then gets it
        assert release.is_set()
    thread.join()


def test_the_default_timeout_is_the_module_constant(tmp_path, monkeypatch):
    monkeypatch.setattr(model_cache, "LOCK_TIMEOUT_S", 0.1)
    lock = model_cache.lock_path(tmp_path, AREA, KEY)
    with model_cache.file_lock(lock):
        with pytest.raises(model_cache.CacheLockTimeout, match="0.1 s"):
            _build(tmp_path, Builder())


def test_a_failed_build_leaves_nothing_behind(tmp_path):
    def broken(tmp: Path) -> dict:
        (tmp / "half-written.onnx").write_bytes(b"\0" * 10)
        raise RuntimeError("export crashed")

    with pytest.raises(RuntimeError):
        model_cache.get_or_build(tmp_path, "optimized", "k", broken)
    assert list((tmp_path / "optimized").iterdir()) == []
    entry = model_cache.get_or_build(tmp_path, "optimized", "k", lambda tmp: {"ok": True})
    assert entry.built and entry.meta["ok"] and entry.path.name == "k"


def test_temp_dirs_of_dead_builders_are_cleared(tmp_path):
    abandoned = tmp_path / "optimized" / ".k.abc123"
    abandoned.mkdir(parents=True)
    model_cache.get_or_build(tmp_path, "optimized", "k", lambda tmp: {})
    assert not abandoned.exists()


def test_a_waiter_says_what_it_waits_for_and_again_while_it_waits(tmp_path, caplog,
                                                                  monkeypatch):
    monkeypatch.setattr(model_cache, "_STILL_WAITING_S", 0.1)
    lock = model_cache.lock_path(tmp_path, AREA, KEY)
    caplog.set_level(logging.INFO, logger="blitz.model_cache")
    with model_cache.file_lock(lock):
        with pytest.raises(model_cache.CacheLockTimeout, match="gave up after 0.35 s"):
            with model_cache.file_lock(lock, "waiting for the other builder", timeout=0.35):
                pass
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "waiting for the other builder"
    assert len(lines) >= 3 and all(line.startswith("waiting for the other builder (waited ")
                                   and line.endswith("of at most 0.35 s)") for line in lines[1:])
    with model_cache.file_lock(lock, "not logged: nobody holds it", timeout=0):
        pass
    assert "nobody holds it" not in caplog.text and len(caplog.records) == len(lines)
