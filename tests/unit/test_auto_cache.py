"""``cpu_backend: auto``'s choice, measured once and cached (``blitz.loading.auto``): a
start with a matching record times nothing and opens only the winner; a changed key,
or a corrupt or partial record, measures again and rewrites it."""

from __future__ import annotations

import json
import logging
import shutil
import threading
from pathlib import Path

import pytest

from blitz.loading import auto, load, opening
from blitz.loading.auto import AutoChoice
from blitz.loading.load import load_encoder
from blitz.settings.registry import ModelSpec
from blitz.sources import model_cache

pytestmark = pytest.mark.usefixtures("no_home_cache")

RATES = {"torch": {1: 120.0, 32: 150.0}, "onnx": {1: 210.0, 32: 300.0},
         "onnx-int8": {1: 400.0, 32: 500.0}}
CANDIDATES = ["torch", "onnx", "onnx-int8"]


def _spec(source: Path, **fields) -> ModelSpec:
    return ModelSpec(id="tiny", source=str(source), cpu_backend="auto", **fields)


class Measurements:
    """A measurement that counts its calls and answers ``chosen``."""

    def __init__(self, chosen: str = "torch"):
        self.chosen, self.calls = chosen, 0

    def __call__(self, *_: object, **__: object) -> AutoChoice:
        self.calls += 1
        return AutoChoice(self.chosen, RATES, {"onnx-int8": "not accurate enough"})


@pytest.fixture
def measured(monkeypatch) -> Measurements:
    """The loader's measurement (the child process) replaced by a counting fake; measuring
    in process instead fails the test."""
    measurements = Measurements()
    monkeypatch.setattr(load, "choose_in_child", measurements)
    monkeypatch.setattr(auto, "measure_choice", _never)
    return measurements


def _never(*_: object, **__: object):
    raise AssertionError("measured in process")


def _entries(cache: Path) -> list[Path]:
    return sorted((cache / auto.AREA).glob("*/" + model_cache.ENTRY_FILE))


# --- through the loader ----------------------------------------------------------------

def test_the_first_start_measures_and_records_the_second_reuses_it(tiny_dir, tmp_path,
                                                                   measured, monkeypatch,
                                                                   caplog):
    with caplog.at_level(logging.INFO, logger="blitz.encoders"):
        first = load_encoder(_spec(tiny_dir), cache_dir=tmp_path)
    assert measured.calls == 1 and first.backend == "auto(torch)"
    assert first.auto_choice is not None and first.auto_choice["how"] == "measured"
    [record] = _entries(tmp_path)
    meta = json.loads(record.read_text())
    assert meta["choice"]["chosen"] == "torch" and meta["parts"]["candidates"] == \
        auto.candidates()
    assert f"chose torch for every call; recorded in {record.parent}" in caplog.text

    opened: list[str] = []
    original = load.open_backend

    def spy(load_: opening.Load, path: Path, backend: str):
        opened.append(backend)
        return original(load_, path, backend)

    monkeypatch.setattr(load, "open_backend", spy)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="blitz.encoders"):
        second = load_encoder(_spec(tiny_dir), cache_dir=tmp_path)
    assert measured.calls == 1  # nothing timed
    assert opened == ["torch"]  # only the winner opened
    assert second.backend == "auto(torch)" and second.auto_choice is not None
    assert second.auto_choice["how"] == "cached"
    assert second.auto_choice["rates"] == RATES
    assert second.auto_choice["dropped"] == {"onnx-int8": "not accurate enough"}
    assert "cpu_backend auto: cached choice torch (measured 20" in caplog.text
    assert "measured texts/s" not in caplog.text
    assert _entries(tmp_path) == [record]


def test_a_start_on_another_cpu_or_thread_count_measures_again(tiny_dir, tmp_path,
                                                               measured, monkeypatch):
    import torch

    load_encoder(_spec(tiny_dir), cache_dir=tmp_path)
    identity = auto.cpu_identity()
    monkeypatch.setattr(auto, "cpu_identity",
                        lambda: {**identity, "isa": [*identity["isa"], "amx_tile"]})
    assert load_encoder(_spec(tiny_dir), cache_dir=tmp_path).auto_choice["how"] == "measured"
    threads = torch.get_num_threads()
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads + 1)
    load_encoder(_spec(tiny_dir), cache_dir=tmp_path)
    assert measured.calls == 3 and len(_entries(tmp_path)) == 3


# --- the key ---------------------------------------------------------------------------

def _key(tiny_dir: Path, **changes) -> str:
    spec = _spec(tiny_dir, **changes.pop("spec", {}))
    backends = changes.pop("backends", CANDIDATES)
    threads = changes.pop("threads", 1)
    return auto.choice_key(spec, tiny_dir, backends, threads, **changes)[0]


@pytest.mark.parametrize("change", [
    "threads", "candidates", "cpu flags", "cpu model", "cores", "versions", "threshold",
    "source files", "max_seq_length", "measure seconds",
])
def test_the_key_covers_what_would_change_the_answer(tiny_dir, tmp_path, monkeypatch, change):
    tiny_dir = Path(shutil.copytree(tiny_dir, tmp_path / "model"))  # "source files" edits it
    same = _key(tiny_dir)
    assert _key(tiny_dir) == same
    identity = auto.cpu_identity()
    versions = model_cache.library_versions()
    changed = {
        "threads": lambda: _key(tiny_dir, threads=2),
        "candidates": lambda: _key(tiny_dir, backends=["torch", "torch-bf16", *CANDIDATES[1:]]),
        "cpu flags": lambda: _patched(monkeypatch, auto, "cpu_identity",
                                      {**identity, "isa": ["avx2", "avx512_vnni"]}, tiny_dir),
        "cpu model": lambda: _patched(monkeypatch, auto, "cpu_identity",
                                      {**identity, "model": "another CPU"}, tiny_dir),
        "cores": lambda: _patched(monkeypatch, auto, "cpu_identity",
                                  {**identity, "cores": identity["cores"] + 8}, tiny_dir),
        "versions": lambda: _patched(monkeypatch, model_cache, "library_versions",
                                     {**versions, "onnxruntime": "0.0.1"}, tiny_dir),
        "threshold": lambda: _key(tiny_dir, spec={"accuracy_threshold": 0.95}),
        "source files": lambda: (tiny_dir / "README.md").write_text("v2") and _key(tiny_dir),
        "max_seq_length": lambda: _key(tiny_dir, spec={"max_seq_length": 64}),
        "measure seconds": lambda: _key(tiny_dir, seconds=3.0),
    }[change]()
    assert changed != same


def _patched(monkeypatch, module, name: str, value: object, tiny_dir: Path) -> str:
    monkeypatch.setattr(module, name, lambda: value)
    return _key(tiny_dir)


def test_a_changed_key_measures_again_and_keeps_both(tiny_dir, tmp_path):
    measure = Measurements()
    for threads in (1, 2, 1, 2):
        auto.remember_choice(_spec(tiny_dir), tiny_dir, CANDIDATES, threads, measure, tmp_path)
    assert measure.calls == 2 and len(_entries(tmp_path)) == 2


# --- corrupt, partial or forged records ------------------------------------------------

def _remembered(tiny_dir: Path, cache: Path, measure: auto.Measure):
    return auto.remember_choice(_spec(tiny_dir), tiny_dir, CANDIDATES, 1, measure, cache)


def _rewrite(record: Path, change) -> None:
    meta = json.loads(record.read_text())
    change(meta)
    record.write_text(json.dumps(meta))


CORRUPTIONS = {
    "truncated": lambda record: record.write_text(record.read_text()[:40]),
    "empty": lambda record: record.write_text(""),
    "no record": lambda record: record.unlink(),
    "no choice": lambda record: _rewrite(record, lambda m: m.pop("choice")),
    "no parts": lambda record: _rewrite(record, lambda m: m.pop("parts")),
    "other parts": lambda record: _rewrite(record, lambda m: m["parts"].update(threads=64)),
    "winner not measured": lambda record: _rewrite(
        record, lambda m: m["choice"].update(chosen="torch-bf16")),
    "not a candidate": lambda record: _rewrite(
        record, lambda m: m["choice"].update(chosen="evil", rates={"evil": {"1": 1.0}})),
    "a rate not a number": lambda record: _rewrite(
        record, lambda m: m["choice"]["rates"]["torch"].update({"1": "fast"})),
    "a size not a number": lambda record: _rewrite(
        record, lambda m: m["choice"]["rates"]["torch"].update({"one": 1.0})),
    "a file outside": lambda record: _rewrite(
        record, lambda m: m["contents"].update({"../../x": 1})),
}


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_a_corrupt_or_partial_record_is_measured_again_and_rewritten(tiny_dir, tmp_path,
                                                                     caplog, corruption):
    measure = Measurements()
    [record] = [_remembered(tiny_dir, tmp_path, measure).record / model_cache.ENTRY_FILE]
    CORRUPTIONS[corruption](record)
    with caplog.at_level(logging.WARNING, logger="blitz.model_cache"):
        again = _remembered(tiny_dir, tmp_path, measure)
    assert measure.calls == 2 and again.how == "measured"
    assert "is corrupt" in caplog.text
    assert _entries(tmp_path) == [record]  # rewritten in place, and whole
    third = _remembered(tiny_dir, tmp_path, measure)
    assert third.how == "cached" and third.choice == again.choice and measure.calls == 2


def test_a_failed_measurement_records_nothing(tiny_dir, tmp_path):
    def fails() -> AutoChoice:
        raise RuntimeError("every candidate failed")

    with pytest.raises(RuntimeError, match="every candidate failed"):
        auto.remember_choice(_spec(tiny_dir), tiny_dir, CANDIDATES, 1, fails, tmp_path)
    assert _entries(tmp_path) == []
    assert _remembered(tiny_dir, tmp_path, Measurements()).how == "measured"


# --- concurrent starts -----------------------------------------------------------------

def test_concurrent_starts_measure_once_and_leave_one_valid_record(tiny_dir, tmp_path):
    """Four replicas starting at once: the first measures under the entry's lock, the
    others wait for it and reuse its record (the lock is a file lock: threads of one
    process contend as processes do)."""
    measure, started = Measurements(), threading.Event()
    release = threading.Event()

    def slow_measure() -> AutoChoice:
        started.set()
        assert release.wait(30)
        return measure()

    results: list = []
    errors: list = []

    def start() -> None:
        try:
            results.append(_remembered(tiny_dir, tmp_path, slow_measure))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for thread in threads:
        thread.start()
    assert started.wait(30)
    release.set()
    for thread in threads:
        thread.join(60)
    assert not errors and len(results) == 4
    assert measure.calls == 1
    assert sorted(r.how for r in results) == ["cached", "cached", "cached", "measured"]
    assert all(r.choice == results[0].choice for r in results)
    [record] = _entries(tmp_path)
    assert json.loads(record.read_text())["choice"]["chosen"] == "torch"
    assert [p.name for p in (tmp_path / auto.AREA).iterdir()] == [record.parent.name]
