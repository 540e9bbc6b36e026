"""``cpu_backend: auto``: the measurement, the choice, dispatch per micro-batch, and a
real load. Speeds come from a fake clock, never from the wall clock."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from blitz.loading import auto
from blitz.loading import child_work as load_children
from blitz.loading.accuracy import AccuracyRefused
from blitz.loading.auto import AutoChoice
from blitz.loading.load import load_encoder
from blitz.settings.registry import ModelSpec

SHORT = ["hello", "ok then", "Where is the station?"]
LONG = [f"sentence number {i} says a little more about the weather in town" for i in range(40)]


pytestmark = pytest.mark.usefixtures("no_home_cache")



@pytest.fixture(scope="module")
def onnx_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("onnx-cache")


def _spec(source: Path, backend: str = "auto", **fields) -> ModelSpec:
    return ModelSpec(id="tiny", source=str(source), cpu_backend=backend, **fields)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# seconds per call of 1 text and of 32 texts: int8 is fastest alone, bf16 in bulk,
# onnx would beat both but fails its accuracy guard in these tests
COSTS = {"torch": {1: 0.010, 32: 0.100}, "torch-bf16": {1: 0.008, 32: 0.040},
         "onnx": {1: 0.001, 32: 0.010}, "onnx-int8": {1: 0.004, 32: 0.060}}


# --- the measurement and the choice ---------------------------------------------------

def test_measure_rates_times_each_backend_and_size_with_the_given_timer():
    clock, calls = FakeClock(), []

    def run(backend: str, size: int, start: int) -> None:
        calls.append((backend, size, start))
        clock.now += COSTS[backend][size]

    rates = auto.measure_rates(run, ["torch", "onnx-int8"], (1, 32), seconds=1.0, rounds=2,
                               timer=clock)
    assert rates["torch"][1] == pytest.approx(100) and rates["torch"][32] == pytest.approx(320)
    assert rates["onnx-int8"][1] == pytest.approx(250)
    assert rates["onnx-int8"][32] == pytest.approx(32 / 0.06)
    # one warm-up per (backend, size), then each slot of 1.0 / (2 sizes x 2 rounds) s
    assert calls[:2] == [("torch", 1, 0), ("torch", 1, 0)] and calls[2] == ("torch", 1, 1)
    per_backend = {b: sum(COSTS[b][s] for x, s, _ in calls if x == b) for b in COSTS}
    assert 1.0 <= per_backend["torch"] <= 1.0 + 2 * 0.1 + 0.11  # bounded by `seconds`
    # rounds interleave: torch, int8, torch, int8
    order = [b for i, (b, _, _) in enumerate(calls) if i == 0 or calls[i - 1][0] != b]
    assert order == ["torch", "onnx-int8", "torch", "onnx-int8"]


def test_measure_rates_ends_even_when_the_timer_stands_still():
    rates = auto.measure_rates(lambda *_: None, ["torch"], (1,), seconds=1.0,
                               timer=lambda: 0.0)
    assert rates["torch"][1] > 0


def test_choose_takes_one_backend_best_over_both_sizes():
    rates = {"torch": {1: 100.0, 32: 300.0}, "onnx-int8": {1: 400.0, 32: 500.0},
             "torch-bf16": {1: 150.0, 32: 700.0}}
    # relative to the best at each size: int8 1.0 x 0.71, bf16 0.38 x 1.0, torch 0.25 x 0.43
    choice = auto.choose(rates)
    assert choice.chosen == "onnx-int8" and choice.backend == "auto(onnx-int8)"
    bulk = auto.choose({**rates, "torch-bf16": {1: 350.0, 32: 900.0}})
    assert bulk.chosen == "torch-bf16"  # 0.88 x 1.0 beats 1.0 x 0.56
    tie = auto.choose({"torch": {1: 5.0, 32: 5.0}, "onnx": {1: 5.0, 32: 5.0}})
    assert tie.chosen == "torch"  # the first listed wins a tie


def test_candidates_include_bf16_only_on_native_bf16():
    assert auto.candidates(native_bf16=False) == ["torch", "onnx", "onnx-int8"]
    assert auto.candidates(native_bf16=True) == ["torch", "torch-bf16", "onnx", "onnx-int8"]


# --- loading: guard failures dropped, losers closed -------------------------------------

def _timed_opener(tiny_dir: Path, clock: FakeClock, refuse: set[str], opened: dict):
    """Opens the tiny torch model under each backend name; its calls cost COSTS on the
    fake clock, and the backends in ``refuse`` fail as the accuracy guard fails them."""
    def open_backend(name: str):
        if name in refuse:
            raise AccuracyRefused(f"model 'tiny': the {name} build is not accurate enough")
        encoder = load_encoder(_spec(tiny_dir, "torch"))
        embed = encoder.embed

        def timed_embed(texts, **kwargs):
            clock.now += COSTS[name][len(texts)]
            return embed(texts, **kwargs)

        encoder.embed = timed_embed
        opened[name] = encoder
        return encoder
    return open_backend


def test_auto_keeps_one_fastest_passing_backend_and_closes_the_rest(tiny_dir, caplog):
    clock, opened = FakeClock(), {}
    with caplog.at_level(logging.INFO, logger="blitz.encoders"):
        encoder = auto.load_auto(_spec(tiny_dir), _timed_opener(tiny_dir, clock, {"onnx"}, opened),
                                 backends=list(COSTS), timer=clock, seconds=0.05)
    # int8 is fastest alone, bf16 in bulk: one of them serves every call, here int8
    # (1.0 x 0.67 of the best against bf16's 0.5 x 1.0)
    assert encoder is opened["onnx-int8"] and encoder.backend == "auto(onnx-int8)"
    assert "onnx" not in opened
    assert all(opened[b].model is None for b in ("torch", "torch-bf16"))  # losers closed
    assert "chose onnx-int8 for every call" in caplog.text
    assert "onnx: dropped" in caplog.text and "not accurate enough" in caplog.text

    opened.clear()
    clock = FakeClock()
    fastest = auto.load_auto(_spec(tiny_dir), _timed_opener(tiny_dir, clock, set(), opened),
                             backends=list(COSTS), timer=clock, seconds=0.05)
    assert fastest is opened["onnx"] and fastest.backend == "auto(onnx)"


def test_auto_fails_when_every_backend_fails(tiny_dir):
    with pytest.raises(AccuracyRefused, match="torch build is not accurate"):
        auto.load_auto(_spec(tiny_dir), _timed_opener(tiny_dir, FakeClock(), set(COSTS), {}),
                       backends=list(COSTS), timer=FakeClock(), seconds=0.1)


def test_auto_is_for_bi_encoders_only(tiny_dir):
    with pytest.raises(ValidationError, match="cpu_backend auto is for embedding models"):
        _spec(tiny_dir, kind="cross-encoder")


@pytest.fixture(scope="module")
def fixed(tiny_dir, onnx_cache):
    return {name: load_encoder(_spec(tiny_dir, name), cache_dir=onnx_cache)
            for name in ("torch", "onnx")}


# --- end to end -------------------------------------------------------------------------

@pytest.mark.slow  # builds both ONNX graphs and times every candidate: ~45 s
def test_auto_loads_end_to_end(tiny_dir, onnx_cache, fixed, monkeypatch, caplog):
    monkeypatch.setattr(auto, "MEASURE_SECONDS", 0.1)
    with caplog.at_level(logging.INFO, logger="blitz.encoders"):
        encoder = load_encoder(_spec(tiny_dir, accuracy_threshold=0.9), cache_dir=onnx_cache)
    measured = caplog.text.split("on the probe set: ", 1)[1]
    for name in auto.candidates():  # every candidate passed the lowered guard and was timed
        assert f"{name}: " in measured and f"{name}: dropped" not in measured
    assert encoder.backend.removeprefix("auto(").rstrip(")") in auto.candidates()
    got = encoder.embed(SHORT + LONG, normalize=True).values
    want = fixed["torch"].embed(SHORT + LONG, normalize=True).values
    assert np.sum(got * want, axis=1).min() > 0.9
    assert fixed["torch"].backend == "torch" and fixed["onnx"].backend == "onnx"


@pytest.mark.slow  # builds both ONNX graphs and times every candidate: ~40 s
def test_cli_optimize_prints_what_auto_chose(tiny_dir, onnx_cache, tmp_path, monkeypatch,
                                             capsys):
    from blitz.cli import main

    monkeypatch.setattr(auto, "MEASURE_SECONDS", 0.1)
    config = tmp_path / "serve.yaml"
    config.write_text("applications:\n  - name: blitz\n    args:\n      models:\n"
                      f"        - {{id: tiny, source: '{tiny_dir}', cpu_backend: auto, "
                      "accuracy_threshold: 0.9}\n")
    assert main(["optimize", "tiny", "--config", str(config), "--cache-dir", str(onnx_cache),
                 "--no-speed"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^cpu_backend auto chose auto\([a-z0-9-]+\) ", out, re.MULTILINE), out


# --- choosing in a child process ----------------------------------------------------------

def test_with_a_chooser_only_the_winner_is_opened(tiny_dir):
    choice = AutoChoice("onnx-int8", rates={"onnx-int8": {1: 9.0, 32: 1.0}})
    opened: dict = {}
    encoder = auto.load_auto(_spec(tiny_dir), _timed_opener(tiny_dir, FakeClock(), set(), opened),
                             chooser=lambda spec: choice)
    assert set(opened) == {"onnx-int8"}  # no candidate opened only to be closed
    assert encoder is opened["onnx-int8"] and encoder.backend == "auto(onnx-int8)"


def test_a_failed_chooser_means_measuring_in_process(tiny_dir):
    clock, opened = FakeClock(), {}
    encoder = auto.load_auto(_spec(tiny_dir), _timed_opener(tiny_dir, clock, set(), opened),
                             backends=list(COSTS), timer=clock, seconds=0.05,
                             chooser=lambda spec: None)
    assert set(opened) == set(COSTS) and encoder is opened["onnx"]


def test_a_choice_survives_the_trip_from_the_child():
    choice = AutoChoice("onnx-int8", rates={"onnx-int8": {1: 759.0, 32: 634.0},
                                            "torch": {1: 127.0, 32: 900.0}},
                        dropped={"onnx": "not accurate enough"})
    assert AutoChoice.from_json(choice.to_json()) == choice


@pytest.mark.slow  # a child that builds and times every candidate: ~45 s
def test_the_child_process_measures_and_chooses(tiny_dir, onnx_cache, caplog):
    with caplog.at_level(logging.INFO, logger="blitz.encoders"):
        choice = load_children.choose_in_child(_spec(tiny_dir), tiny_dir, onnx_cache, threads=1,
                                               timeout_s=600)
    assert choice is not None, caplog.text
    assert choice.chosen in set(choice.rates) <= set(auto.candidates())
    assert all(rate > 0 for rates in choice.rates.values() for rate in rates.values())
    encoder = load_encoder(_spec(tiny_dir), cache_dir=onnx_cache)  # the loader's own path
    assert encoder.backend == choice.backend or encoder.backend.startswith("auto(")
    assert "measures its candidates in a child process" in caplog.text


@pytest.mark.slow  # the child fails, then every candidate is built and timed here: ~35 s
def test_a_child_that_fails_is_logged_and_answers_none(tmp_path, caplog):
    missing = ModelSpec(id="gone", source=str(tmp_path / "no-such-model"), cpu_backend="auto")
    with caplog.at_level(logging.WARNING, logger="blitz.encoders"):
        assert load_children.choose_in_child(missing, tmp_path / "no-such-model", tmp_path,
                                             threads=1, timeout_s=600) is None
    assert "the cpu_backend auto child failed" in caplog.text
