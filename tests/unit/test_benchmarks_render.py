"""BENCHMARKS.md's tables and charts are the ones rendered from the results files under
loadtest/results/ (``python -m loadtest.render``), and BENCHMARKS.md stays short and
cites no issue."""

from __future__ import annotations

import re

from loadtest import render, results


def test_the_committed_tables_and_charts_are_rendered_from_the_results():
    stale = [str(path.relative_to(render.ROOT)) for path, text in render.rendered().items()
             if not path.exists() or path.read_text(encoding="utf-8") != text]
    assert stale == [], f"{stale} differ from loadtest/results/: run `{render.COMMAND}`"


def test_every_results_file_has_its_table_in_benchmarks_and_every_table_a_file():
    marked = set(render.MARKER.findall(render.BENCHMARKS.read_text(encoding="utf-8")))
    files = {path.stem for path in results.RESULTS.glob("*.json")}
    assert {name for name, _ in marked} == files


def test_benchmarks_is_short_and_cites_no_issue():
    text = render.BENCHMARKS.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 400
    assert [line for line in text.splitlines() if re.search(r"#[0-9]|issue", line)] == []


def test_a_tool_table_is_rendered_by_the_tool(tmp_path):
    rounds = [{"round": 1, "app": "off", "texts_per_s": 100.0, "p50_ms": 10.0, "p99_ms": 20.0,
               "hit_share": None},
              {"round": 1, "app": "on", "texts_per_s": 250.0, "p50_ms": 4.0, "p99_ms": 9.0,
               "hit_share": 0.61}]
    results.save("cache", {"kind": "vector-cache", "rounds": rounds}, tmp_path)
    assert results.load("cache", tmp_path)["rounds"] == rounds
    assert results.markdown(["a", "b"], [[1, "x"]]) == "| a | b |\n|---|---|\n| 1 | x |"


def test_a_bar_chart_scales_to_a_round_axis_and_names_every_bar():
    svg = render.bar_chart("title", "texts/s", ["round 1", "round 2"],
                           [render.Series("off", [180.0, 170.0]),
                            render.Series("on", [305.0, 399.8])])
    assert svg.startswith("<svg ") and svg.rstrip().endswith("</svg>")
    assert svg.count("<title>") == 4 and "on, round 2: 399.8 texts/s" in svg
    assert ">400</text>" in svg  # the axis's top: the next round number above 399.8
    assert render._nice_top(399.8) == (400, 100) and render._nice_top(0.73) == (0.8, 0.2)
