"""Interleaved rounds: per-round ratios, their median and spread (loadtest.rounds)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from loadtest import cli, rounds, summary


def _served(path: Path, emb_s: float | None, errors: int = 0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps({"kind": "loadtest", "results": [
        {"embeddings_per_s": emb_s, "errors": errors,
         "latency_ms": {"p50": 10.0, "p99": 20.0}}]}))


def _ceiling(path: Path, texts_per_call: int, emb_s: float, others: float = 3.0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps({"kind": "inprocess", "results": [
        {"engine": "blitz", "backend": "onnx-int8", "texts_per_call": texts_per_call,
         "embeddings_per_s": emb_s, "others_busy_pct": others, "callers": 2}]}))


def _round(directory: Path, n: int, *, ceiling: tuple[float, float],
           int8: tuple[float, float], optimum: tuple[float, float] | None = None,
           torch: tuple[float, float] | None = None) -> None:
    r = directory / "rounds" / f"r{n}"
    for i, (profile, texts) in enumerate((("single", 1), ("batch32", 32))):
        _ceiling(r / f"ceiling-{profile}.json", texts, ceiling[i])
        _served(r / f"blitz-minilm-int8-{profile}.json", int8[i])
        if optimum:
            _served(r / f"infinity-optimum-{profile}.json", optimum[i])
        if torch:
            _served(r / f"infinity-torch-{profile}.json", torch[i])


def _cells(markdown: str, *first: str) -> list[str]:
    for line in markdown.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if cells[:len(first)] == list(first):
            return cells
    raise AssertionError(f"no row {first} in\n{markdown}")


def test_ratios_pair_figures_of_the_same_round(tmp_path: Path):
    # the machine doubles its speed in round 2: both sides move, the ratio does not
    _round(tmp_path, 1, ceiling=(400.0, 500.0), int8=(360.0, 550.0), optimum=(150.0, 200.0))
    _round(tmp_path, 2, ceiling=(800.0, 1000.0), int8=(720.0, 1100.0), optimum=(300.0, 400.0))
    _round(tmp_path, 3, ceiling=(500.0, 600.0), int8=(400.0, 600.0), optimum=(250.0, 250.0))
    loaded = rounds.load_rounds(tmp_path)
    assert [r.number for r in loaded] == [1, 2, 3]
    single = rounds.ratios(loaded, "blitz-minilm-int8", rounds.CEILING, "single")
    assert single == pytest.approx([0.9, 0.9, 0.8])
    s = rounds.spread(single)
    assert (s.median, s.low, s.high, s.rounds) == pytest.approx((0.9, 0.8, 0.9, 3))
    # a pooled mean of each side would say 1480/1700 = 0.87x; the per-round median is 0.9
    assert rounds.spread(rounds.ratios(loaded, "blitz-minilm-int8", rounds.BEST_INFINITY,
                                       "batch32")).median == pytest.approx(2.75)


def test_best_infinity_is_chosen_per_round_and_profile(tmp_path: Path):
    _round(tmp_path, 1, ceiling=(400.0, 500.0), int8=(400.0, 600.0),
           optimum=(200.0, 100.0), torch=(100.0, 150.0))
    [r] = rounds.load_rounds(tmp_path / "rounds")  # the rounds folder itself works too
    assert r.best_infinity == {"single": "infinity-optimum", "batch32": "infinity-torch"}
    assert rounds.ratios([r], "blitz-minilm-int8", rounds.BEST_INFINITY, "single") == [2.0]
    assert rounds.ratios([r], "blitz-minilm-int8", rounds.BEST_INFINITY, "batch32") == [4.0]


def test_missing_or_failed_figures_drop_only_their_round(tmp_path: Path):
    _round(tmp_path, 1, ceiling=(400.0, 500.0), int8=(400.0, 500.0), optimum=(100.0, 100.0))
    _round(tmp_path, 2, ceiling=(400.0, 500.0), int8=(200.0, 500.0), optimum=(100.0, 100.0))
    _round(tmp_path, 3, ceiling=(400.0, 500.0), int8=(300.0, 500.0), optimum=(100.0, 100.0))
    (tmp_path / "rounds/r2/ceiling-single.json").unlink()            # never written
    _served(tmp_path / "rounds/r3/infinity-optimum-single.json", None)  # nothing succeeded
    (tmp_path / "rounds/r3/blitz-minilm-int8-batch32.json").write_text("{trunc")
    (tmp_path / "rounds/notes").mkdir()                              # not a round: ignored
    loaded = rounds.load_rounds(tmp_path)
    assert len(loaded) == 3
    assert rounds.ratios(loaded, "blitz-minilm-int8", rounds.CEILING, "single") == [
        1.0, None, 0.75]
    assert rounds.ratios(loaded, "blitz-minilm-int8", rounds.BEST_INFINITY, "single") == [
        4.0, 2.0, None]
    assert rounds.ratios(loaded, "blitz-minilm-int8", rounds.CEILING, "batch32") == [
        1.0, 1.0, None]
    assert rounds.spread([None, None]) is None
    text = rounds.report(tmp_path)
    # two rounds left: the median is shown, the target is not called settled
    assert _cells(text, "int8 single >= 0.8x the 2 callers x 1 thread ceiling")[1:] == [
        "0.88x (0.75-1.00x, 2 rounds)", "not settled (fewer than 3 rounds)"]
    assert _cells(text, "Blitz `minilm-int8` / in-process int8, 2 callers x 1 thread",
                  "single")[2:] == ["0.88x", "0.75-1.00x", "1.00, -, 0.75"]
    assert _cells(text, "2", "single")[2:4] == ["-", "200.0"]  # raw figures of round 2


def test_report_says_which_targets_are_met(tmp_path: Path):
    for n, int8_single in enumerate((350.0, 300.0, 330.0), start=1):
        _round(tmp_path, n, ceiling=(400.0, 500.0), int8=(int8_single, 450.0),
               optimum=(150.0, 200.0))
    _served(tmp_path / "rounds/r2/blitz-minilm-int8-batch32.json", 450.0, errors=3)
    text = rounds.report(tmp_path)
    assert "3 rounds" in text.splitlines()[0]
    assert _cells(text, "int8 single >= 0.8x the 2 callers x 1 thread ceiling")[1:] == [
        "0.82x (0.75-0.88x, 3 rounds)", "met"]
    assert _cells(text, "int8 batch32 >= 1.0x the 2 callers x 1 thread ceiling")[1:] == [
        "0.90x (0.90-0.90x, 3 rounds)", "**not met** (0.90 of it)"]
    assert _cells(text, "int8 single >= 2x Infinity's best")[2] == "met"
    assert _cells(text, "int8 batch32 >= 2x Infinity's best")[2] == "met"
    # a Blitz model not measured shows "-", not a guess
    assert _cells(text, "Blitz `minilm` (auto) / in-process int8, 2 callers x 1 thread",
                  "single")[2:] == ["-", "-", "-, -, -"]
    raw = _cells(text, "2", "batch32")
    assert raw[2:4] == ["500.0", "450.0 (3 errors)"] and raw[-2:] == ["optimum", "3"]


def test_rounds_command_and_report_folders(tmp_path: Path, capsys: pytest.CaptureFixture):
    assert cli.main(["rounds", str(tmp_path)]) == 0
    assert "no rounds" in capsys.readouterr().out
    assert cli.main(["rounds", str(tmp_path / "missing")]) == 2
    _round(tmp_path, 1, ceiling=(400.0, 500.0), int8=(400.0, 500.0), optimum=(100.0, 100.0))
    assert cli.main(["rounds", str(tmp_path)]) == 0
    assert "### Interleaved rounds: 1 rounds" in capsys.readouterr().out
    # `report` puts the rounds first, then the one-shot tables that hold a figure
    text = summary.report(tmp_path)
    assert "None measured in this folder" in text and "### all-MiniLM" not in text
    _served(tmp_path / "naive-single.json", 90.0)
    text = summary.report(tmp_path)
    assert text.index("Interleaved rounds") < text.index("## One-shot extras") \
        < text.index("### all-MiniLM-L6-v2")
    assert "### BERT-base" not in text


def test_before_after_report_gives_the_median_of_per_round_ratios(tmp_path: Path):
    for n, (before, after) in enumerate(((100.0, 120.0), (200.0, 220.0), (100.0, 130.0)), 1):
        for model in ("minilm", "minilm-int8"):
            for profile in ("single", "batch32"):
                _served(tmp_path / f"before-r{n}-{model}-{profile}.json", before)
                if (n, model) != (3, "minilm-int8"):
                    _served(tmp_path / f"after-r{n}-{model}-{profile}.json", after)
    out = subprocess.run([sys.executable, "-m", "loadtest.before_after", str(tmp_path), "3"],
                         text=True, capture_output=True, check=True).stdout
    assert _cells(out, "minilm", "single")[2:] == [
        "100.0 / 200.0 / 100.0", "120.0 / 220.0 / 130.0", "1.20x", "1.10-1.30x",
        "1.20, 1.10, 1.30"]
    assert _cells(out, "minilm-int8", "batch32")[3:] == [
        "120.0 / 220.0 / -", "1.15x", "1.10-1.20x", "1.20, 1.10, -"]


def _one_user(path: Path, served: tuple[float, float], inprocess: float,
              hops: dict[str, float] | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps({"summary": {
        "served": {"p50": served[0], "p99": served[1]}, "inprocess": {"p50": inprocess},
        "served_p99_over_p50": served[1] / served[0], "hops_p50_ms": hops or {}}}))


def test_one_user_reports_medians_the_targets_and_the_hops(tmp_path):
    for n, (p50, p99, inproc) in enumerate([(4.0, 7.0, 2.0), (3.0, 9.0, 1.0),
                                            (5.0, 8.0, 2.5)], start=1):
        _round(tmp_path, n, ceiling=(800, 600), int8=(500, 700))
        _one_user(tmp_path / "rounds" / f"r{n}" / "oneuser-blitz-minilm-int8.json",
                  (p50, p99), inproc, {"model": 1.0 + n, "handle": 0.5, "total": p50 - 1,
                                       "proxy": 1.0})
    text = rounds.report(tmp_path)
    # p50 - in-process: 2.0, 2.0, 2.5 -> median 2.0 > 1.5; p99/p50: 1.75, 3.0, 1.6 -> 1.75
    assert "| blitz-minilm-int8 p50 <= in-process call + 1.5 ms | +2.00 ms (2.00-2.50) | " \
           "**not met**" in text
    assert "| blitz-minilm-int8 p99 <= 2x p50 | 1.75x (1.60-3.00) | met |" in text
    assert "| blitz-minilm-int8 | 4.00 (3.00-5.00) | 8.00 (7.00-9.00) | 2.00 (1.00-2.50) | - |" \
        in text
    hop_lines = [line for line in text.splitlines() if line.startswith("| total")
                 or line.startswith("| handle") or line.startswith("| model")
                 or line.startswith("| proxy")]
    assert [line.split("|")[1].strip() for line in hop_lines] == [
        "total", "handle", "model", "proxy"]  # outside in, the proxy last


def test_one_user_is_left_out_when_not_measured(tmp_path):
    _round(tmp_path, 1, ceiling=(800, 600), int8=(500, 700))
    assert "One user" not in rounds.report(tmp_path)


def test_one_user_reports_the_http_floor_and_what_blitz_adds_to_it(tmp_path):
    # Blitz p50 4, 3, 5; the floor server's p50 3.0, 2.5, 3.5 beside in-process 2.0, 1.5, 2.0
    for n, (blitz_p50, floor_p50, floor_inproc) in enumerate(
            [(4.0, 3.0, 2.0), (3.0, 2.5, 1.5), (5.0, 3.5, 2.0)], start=1):
        _round(tmp_path, n, ceiling=(800, 600), int8=(500, 700))
        folder = tmp_path / "rounds" / f"r{n}"
        _one_user(folder / "oneuser-blitz-minilm-int8.json", (blitz_p50, 8.0), 2.0)
        _one_user(folder / "oneuser-floor.json", (floor_p50, 6.0), floor_inproc)
    text = rounds.report(tmp_path)
    # floor over its in-process call: 1.0, 1.0, 1.5; Blitz over the floor: 1.0, 0.5, 1.5
    assert "answers one user **+1.00 ms** (1.00 to 1.50) beyond its in-process call" in text
    assert "blitz-minilm-int8 answers **+1.00 ms** (0.50 to 1.50) beyond the floor" in text


def test_the_floor_is_left_out_when_not_measured(tmp_path):
    _round(tmp_path, 1, ceiling=(800, 600), int8=(500, 700))
    _one_user(tmp_path / "rounds" / "r1" / "oneuser-blitz-minilm-int8.json", (4.0, 8.0), 2.0)
    assert "HTTP floor" not in rounds.report(tmp_path)
