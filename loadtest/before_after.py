"""``python -m loadtest.before_after OUT ROUNDS MODEL...``: what before_after.sh measured.

``loadtest/before_after.sh`` serves two trees in turn, round after round, and writes, for
each serve (SIDE ``before`` or ``after``, round N)::

    OUT/SIDE-rN-settle.json                # the wait before it started (process_cpu settle)
    OUT/SIDE-rN-idle0.json, -idle1.json    # process_cpu snapshots around the idle minute
    OUT/SIDE-rN-MODEL-PROFILE.json         # loadtest run (with the server's CPU time)
    OUT/SIDE-rN-MODEL-PROFILE-procs0.json, -procs1.json   # snapshots around that run

The report: emb/s per round and the median of the per-round after/before ratios (each
round's after over its before, so a drift in the machine's speed hits both sides alike),
then the server's CPU-ms per request by process role and its idle CPU by role as % of a
core, each the median over rounds, before against after, then how long each serve
waited for the previous one to be gone and the machine quiet.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from loadtest.process_cpu import ROLES, role_cpu_s
from loadtest.report import markdown_table
from loadtest.rounds import read_figure, spread

SIDES = ("before", "after")
PROFILES = ("single", "batch32")
TOTAL = "**total**"


def _load(path: Path) -> dict[str, Any] | None:
    try:
        document = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return document if isinstance(document, dict) else None


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _cell(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def cpu_ms_per_request(out: Path, label: str, model: str, profile: str
                       ) -> dict[str, float] | None:
    """CPU-ms per request by role for one run: each role's share of the server's CPU
    time between the snapshots around the run (its warm-up included) times the CPU-ms
    per request the run measured over its measured window (``--server-pids``)."""
    stem = f"{label}-{model}-{profile}"
    before, after = _load(out / f"{stem}-procs0.json"), _load(out / f"{stem}-procs1.json")
    run = _load(out / f"{stem}.json")
    results = (run or {}).get("results") or [{}]
    per_request = results[0].get("server_cpu_ms_per_request")
    if before is None or after is None or per_request is None:
        return None
    used = role_cpu_s(before, after)
    total = sum(used.values())
    if total <= 0:
        return None
    shares = {name: float(per_request) * s / total for name, s in used.items()}
    shares[TOTAL] = float(per_request)
    return shares


def idle_pct(out: Path, label: str) -> dict[str, float] | None:
    """Each role's CPU over the idle minute as % of one core."""
    before, after = _load(out / f"{label}-idle0.json"), _load(out / f"{label}-idle1.json")
    if before is None or after is None or after["at"] <= before["at"]:
        return None
    seconds = after["at"] - before["at"]
    pct = {name: 100 * s / seconds for name, s in role_cpu_s(before, after).items()}
    pct[TOTAL] = sum(pct.values())
    return pct


def _by_role_table(per_column: Mapping[str, Sequence[Mapping[str, float] | None]],
                   digits: int) -> str:
    """Rows: the roles (and the total); columns: the medians over each column's rounds."""
    rows = []
    for name in (*ROLES, TOTAL):
        cells = [_median([r.get(name, 0.0) if r is not None else None for r in rounds])
                 for rounds in per_column.values()]
        if name != TOTAL and all(c is None or abs(c) < 0.5 * 10 ** -digits for c in cells):
            continue
        rows.append([name, *(_cell(c, digits) for c in cells)])
    return markdown_table(["process", *per_column], rows)


def _label(side: str, n: int) -> str:
    return f"{side}-r{n}"


def throughput_markdown(out: Path, rounds: int, models: Sequence[str]) -> str:
    body = []
    for model in models:
        for profile in PROFILES:
            rate = {side: [read_figure(out / f"{_label(side, n)}-{model}-{profile}.json",
                                       profile) for n in range(1, rounds + 1)]
                    for side in SIDES}
            per_round = [a.emb_s / b.emb_s if a and b else None
                         for b, a in zip(rate["before"], rate["after"], strict=True)]
            s = spread(per_round)
            cells = {side: " / ".join("-" if f is None else f"{f.emb_s:.1f}" for f in figures)
                     for side, figures in rate.items()}
            body.append([model, profile, cells["before"], cells["after"],
                         "-" if s is None else f"{s.median:.2f}x",
                         "-" if s is None else f"{s.low:.2f}-{s.high:.2f}x",
                         ", ".join("-" if r is None else f"{r:.2f}" for r in per_round)])
    return markdown_table(["model", "profile", "before emb/s (per round)",
                           "after emb/s (per round)", "after / before, median",
                           "spread (min-max)", "per round"], body)


def cpu_markdown(out: Path, rounds: int, models: Sequence[str]) -> str:
    columns = {f"{model} {profile}, {side}": [
        cpu_ms_per_request(out, _label(side, n), model, profile) for n in range(1, rounds + 1)]
        for model in models for profile in PROFILES for side in SIDES}
    return _by_role_table(columns, 3)


def idle_markdown(out: Path, rounds: int) -> str:
    columns = {side: [idle_pct(out, _label(side, n)) for n in range(1, rounds + 1)]
               for side in SIDES}
    if all(v is None for values in columns.values() for v in values):
        return ""
    return _by_role_table(columns, 2)


def waits_markdown(out: Path, rounds: int, order: Sequence[tuple[int, str]]) -> str:
    body = []
    for n, side in order:
        w = _load(out / f"{_label(side, n)}-settle.json")
        if w is None:
            continue
        body.append([str(n), side, f"{w['waited_s']:.0f}", f"{w['gone_s']:.0f}",
                     f"{w['busy_pct']:.0f}",
                     "timed out" + (f" ({len(w['left_over'])} processes left)"
                                    if w["left_over"] else " (machine busy)")
                     if w["timed_out"] else "settled",
                     ", ".join(f"{name} {pct:.0f}%" for name, pct in w.get("busiest") or [])
                     or "-"])
    return markdown_table(["round", "serve", "waited s", "of which for processes to go",
                           "busy % of all cores at start", "outcome",
                           "busiest processes then (% of a core)"], body) if body else ""


def order(rounds: int) -> list[tuple[int, str]]:
    """The serves in the order before_after.sh runs them: ABBA (before, after; after,
    before; ...), so a drift within a round hits both sides alike."""
    return [(n, side) for n in range(1, rounds + 1)
            for side in (SIDES if n % 2 else SIDES[::-1])]


def report(out: Path, rounds: int, models: Sequence[str]) -> str:
    parts = ["after / before: the median of the per-round ratios (each round's after over "
             "its before), spread = smallest and largest per-round ratio; rounds alternate "
             "which tree goes first (ABBA).\n", throughput_markdown(out, rounds, models), "",
             "Server CPU-ms per request by process (median over rounds; each role's share of "
             "the tree's CPU over the run times the run's measured CPU-ms per request):\n",
             cpu_markdown(out, rounds, models)]
    idle = idle_markdown(out, rounds)
    if idle:
        parts += ["", "Idle, after warm-up and before the profiles: CPU by process as % of "
                  "one core (median over rounds):\n", idle]
    waits = waits_markdown(out, rounds, order(rounds))
    if waits:
        parts += ["", "The wait before each serve (for the previous server's processes to "
                  "go and the machine to be quiet):\n", waits]
    return "\n".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2:
        print("usage: python -m loadtest.before_after OUT ROUNDS [MODEL ...]", file=sys.stderr)
        return 2
    print(report(Path(args[0]), int(args[1]), args[2:] or ["minilm", "minilm-int8"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
