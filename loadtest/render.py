"""BENCHMARKS.md's tables and charts, rendered from the results files (``loadtest.results``).

``python -m loadtest.render`` rewrites each table between its markers in BENCHMARKS.md
(``<!-- results:NAME:start ... -->`` and ``<!-- results:NAME:end -->``, NAME a file under
``loadtest/results/``) and writes the charts (``docs/charts/*.svg``, plain SVG written
here: no plotting library); ``--check`` exits 1 when anything differs
(``tests/unit/test_benchmarks_render.py`` does the same).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest import results

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "BENCHMARKS.md"
CHARTS = ROOT / "docs" / "charts"
COMMAND = "python -m loadtest.render"
MARKER = re.compile(r"<!-- results:([\w-]+):start[^>]*-->\n(.*?)<!-- results:\1:end -->",
                    re.DOTALL)


def _tool_tables() -> dict[str, Callable[[list[dict[str, Any]]], str]]:
    from loadtest.grpc_vs_http import table as grpc_table
    from loadtest.vector_cache import table as cache_table

    return {"vector-cache": cache_table, "grpc-vs-http": grpc_table}


def table(name: str) -> str:
    """The Markdown table the results file ``name`` holds."""
    result = results.load(name)
    if result["kind"] == "table":
        return results.markdown(result["columns"], result["rows"])
    return _tool_tables()[result["kind"]](result["rounds"])


def rendered_benchmarks(text: str) -> str:
    """``text`` (BENCHMARKS.md) with each marked table rendered from its results file."""
    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        return (f"<!-- results:{name}:start ({COMMAND}) -->\n{table(name)}\n"
                f"<!-- results:{name}:end -->")

    return MARKER.sub(one, text)


# --- charts ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Series:
    name: str
    values: list[float]  # one per group


COLOURS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#b07aa1")


def _nice_top(value: float) -> tuple[float, float]:
    """An axis top at or above ``value`` and its tick step (1, 2 or 5 times a power of 10)."""
    raw = max(value, 1e-9) / 5
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return step * math.ceil(value / step), step


def _number(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 or value == int(value) else f"{value:g}"


def bar_chart(title: str, unit: str, groups: list[str], series: list[Series]) -> str:
    """A grouped bar chart as an SVG document: one group per label, one bar per series."""
    width, height, left, right, top, bottom = 760, 400, 70, 20, 70, 40
    plot_w, plot_h = width - left - right, height - top - bottom
    highest = max((v for s in series for v in s.values), default=1.0)
    axis_top, step = _nice_top(highest)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2:.0f}" y="20" text-anchor="middle" font-size="15">'
           f'{title}</text>']
    ticks = round(axis_top / step)
    for i in range(ticks + 1):
        y = top + plot_h - plot_h * i / ticks
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" '
                   f'stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">'
                   f'{_number(step * i)}</text>')
    out.append(f'<text x="16" y="{top + plot_h / 2:.0f}" text-anchor="middle" '
               f'transform="rotate(-90 16 {top + plot_h / 2:.0f})">{unit}</text>')
    group_w = plot_w / max(len(groups), 1)
    bar_w = group_w * 0.8 / max(len(series), 1)
    for g, label in enumerate(groups):
        x0 = left + g * group_w + group_w * 0.1
        for s, one in enumerate(series):
            value = one.values[g]
            h = plot_h * value / axis_top
            out.append(f'<rect x="{x0 + s * bar_w:.1f}" y="{top + plot_h - h:.1f}" '
                       f'width="{bar_w - 2:.1f}" height="{h:.1f}" '
                       f'fill="{COLOURS[s % len(COLOURS)]}"><title>{one.name}, {label}: '
                       f'{value:g} {unit}</title></rect>')
        out.append(f'<text x="{x0 + group_w * 0.4:.1f}" y="{height - bottom + 18}" '
                   f'text-anchor="middle">{label}</text>')
    for s, one in enumerate(series):  # the legend, two rows of three
        x, y = left + (s % 3) * 220, 38 + (s // 3) * 16
        out.append(f'<rect x="{x}" y="{y - 9}" width="10" height="10" '
                   f'fill="{COLOURS[s % len(COLOURS)]}"/>')
        out.append(f'<text x="{x + 14}" y="{y}">{one.name}</text>')
    out.append(f'<line x1="{left}" y1="{top + plot_h}" x2="{width - right}" '
               f'y2="{top + plot_h}" stroke="#333"/>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _by_round(rounds: list[dict[str, Any]], keep: Callable[[dict[str, Any]], bool],
              field: str) -> list[float]:
    return [float(row[field]) for row in sorted(rounds, key=lambda r: r["round"]) if keep(row)]


def _round_series(field: str) -> tuple[list[str], list[Series]]:
    cache = results.load("vector-cache")["rounds"]
    wire = results.load("grpc-vs-http")["rounds"]
    groups = [f"round {n}" for n in sorted({row["round"] for row in cache})]
    series = [Series(f"vector cache {app}", _by_round(cache, lambda r, a=app: r["app"] == a,
                                                       field))
              for app in ("off", "on")]
    for profile in ("single", "batch32"):
        for api, label in (("http-msgpack", "HTTP msgpack"), ("grpc", "gRPC")):
            series.append(Series(f"{label}, {profile}", _by_round(
                wire, lambda r, p=profile, a=api: r["profile"] == p and r["api"] == a, field)))
    return groups, series


def charts() -> dict[Path, str]:
    """Each chart file and its SVG: throughput and latency by round, from the vector cache's
    and the gRPC comparison's results files."""
    groups, throughput = _round_series("texts_per_s")
    _, latency = _round_series("p50_ms")
    return {
        CHARTS / "throughput.svg": bar_chart(
            "Texts per second by round (higher is better)", "texts/s", groups, throughput),
        CHARTS / "latency.svg": bar_chart(
            "Median latency by round (lower is better)", "p50 ms", groups, latency),
    }


def rendered() -> dict[Path, str]:
    """Every file this command writes, as the results files say it now."""
    return {BENCHMARKS: rendered_benchmarks(BENCHMARKS.read_text(encoding="utf-8")),
            **charts()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a file differs")
    args = parser.parse_args(argv)
    files = rendered()
    stale = [path for path, text in files.items()
             if not path.exists() or path.read_text(encoding="utf-8") != text]
    if args.check:
        for path in stale:
            print(f"{path.relative_to(ROOT)} is stale: run `{COMMAND}`", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(files[path], encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
