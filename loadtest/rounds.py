"""``python -m loadtest rounds DIR``: interleaved rounds, as median ratios and their spread.

This machine's speed moves by tens of percent within minutes, so a served figure is only
compared with figures measured beside it. ``loadtest/benchmark.sh`` measures, round after
round and profile after profile, the in-process ceiling, each Blitz model and each
Infinity engine, DUR seconds each, and writes one JSON report per figure::

    DIR/rounds/r1/ceiling-single.json            # loadtest inprocess --sizes 1
    DIR/rounds/r1/blitz-minilm-int8-single.json  # loadtest run
    DIR/rounds/r1/infinity-optimum-single.json   # loadtest run (one file per engine)
    DIR/rounds/r2/...

A ratio is computed within one round (Blitz over the ceiling, or over the best Infinity
engine, of the same round and profile); the report gives the median over rounds and
the spread (smallest and largest per-round ratio), the raw figures of every round, and
whether each target's median is met. A missing or failed figure drops that round from
the ratios it belongs to, and the table says how many rounds each median rests on.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from loadtest.report import fmt, markdown_table

PROFILES = {"single": 1, "batch32": 32}  # profile -> texts per in-process call
CEILING = "ceiling"
BEST_INFINITY = "infinity"  # the best of the round's infinity-* figures
BLITZ = ("blitz-minilm-int8", "blitz-minilm")
MIN_ROUNDS = 3  # fewer rounds do not settle a target


@dataclass(frozen=True)
class Figure:
    """One measurement: emb/s, plus what else the report shows beside it."""

    emb_s: float
    errors: int = 0
    others_pct: float | None = None  # machine CPU used by other processes (in process)


@dataclass(frozen=True)
class Round:
    number: int
    figures: Mapping[str, Mapping[str, Figure]]  # profile -> name -> figure
    best_infinity: Mapping[str, str]  # profile -> the infinity-* name that was best


@dataclass(frozen=True)
class Target:
    label: str
    numerator: str
    denominator: str
    profile: str
    at_least: float


TARGETS = (
    Target("int8 single >= 0.8x the 2 callers x 1 thread ceiling",
           "blitz-minilm-int8", CEILING, "single", 0.8),
    Target("int8 batch32 >= 1.0x the 2 callers x 1 thread ceiling",
           "blitz-minilm-int8", CEILING, "batch32", 1.0),
    Target("int8 single >= 2x Infinity's best", "blitz-minilm-int8", BEST_INFINITY,
           "single", 2.0),
    Target("int8 batch32 >= 2x Infinity's best", "blitz-minilm-int8", BEST_INFINITY,
           "batch32", 2.0),
)

LABELS = {CEILING: "in-process int8, 2 callers x 1 thread",
          "blitz-minilm-int8": "Blitz `minilm-int8`",
          "blitz-minilm": "Blitz `minilm` (auto)",
          BEST_INFINITY: "Infinity's best"}


def _number(value: Any) -> float | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return float(value)


def read_figure(path: Path, profile: str) -> Figure | None:
    """The figure in a ``loadtest run`` or ``loadtest inprocess`` report; None when the
    file is unreadable or holds no throughput (a run where nothing succeeded)."""
    try:
        document = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    results = document.get("results") or []
    if document.get("kind") == "inprocess":
        for row in results:
            if row.get("engine") == "blitz" and row.get("texts_per_call") == PROFILES[profile]:
                emb_s = _number(row.get("embeddings_per_s"))
                return None if emb_s is None else Figure(
                    emb_s, others_pct=_number(row.get("others_busy_pct")))
        return None
    if not results:
        return None
    emb_s = _number(results[0].get("embeddings_per_s"))
    return None if emb_s is None else Figure(emb_s, errors=int(results[0].get("errors", 0)))


def read_round(directory: Path, number: int) -> Round:
    figures: dict[str, dict[str, Figure]] = {}
    best: dict[str, str] = {}
    for profile in PROFILES:
        found: dict[str, Figure] = {}
        for path in sorted(directory.glob(f"*-{profile}.json")):
            name = path.name[:-len(f"-{profile}.json")]
            figure = read_figure(path, profile)
            if figure is not None:
                found[name] = figure
        peers = {name: f for name, f in found.items() if name.startswith("infinity-")}
        if peers:
            best[profile] = max(peers, key=lambda name: peers[name].emb_s)
            found[BEST_INFINITY] = peers[best[profile]]
        figures[profile] = found
    return Round(number, figures, best)


def load_rounds(directory: str | Path) -> list[Round]:
    """Every ``rN`` folder under DIR/rounds (or under DIR itself), in round order."""
    directory = Path(directory)
    if (directory / "rounds").is_dir():
        directory = directory / "rounds"
    numbered = []
    for path in directory.iterdir() if directory.is_dir() else ():
        match = re.fullmatch(r"r(\d+)", path.name)
        if match and path.is_dir():
            numbered.append((int(match.group(1)), path))
    return [read_round(path, number) for number, path in sorted(numbered)]


def ratios(rounds: Sequence[Round], numerator: str, denominator: str,
           profile: str) -> list[float | None]:
    """Per round: numerator / denominator of that round, None where either is missing."""
    out: list[float | None] = []
    for r in rounds:
        top, bottom = r.figures[profile].get(numerator), r.figures[profile].get(denominator)
        out.append(top.emb_s / bottom.emb_s if top and bottom and bottom.emb_s else None)
    return out


@dataclass(frozen=True)
class Spread:
    median: float
    low: float
    high: float
    rounds: int


def spread(values: Sequence[float | None]) -> Spread | None:
    """Median, min and max of the values present; None when there are none."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    return Spread(statistics.median(present), min(present), max(present), len(present))


def ratio_cell(s: Spread | None) -> str:
    if s is None:
        return "-"
    return f"{s.median:.2f}x ({s.low:.2f}-{s.high:.2f}x, {s.rounds} rounds)"


def verdict(s: Spread | None, at_least: float) -> str:
    if s is None or s.rounds < MIN_ROUNDS:
        return f"not settled (fewer than {MIN_ROUNDS} rounds)"
    return "met" if s.median >= at_least else f"**not met** ({s.median / at_least:.2f} of it)"


def _per_round(values: Sequence[float | None]) -> str:
    return ", ".join("-" if v is None else f"{v:.2f}" for v in values)


def ratios_markdown(rounds: Sequence[Round]) -> str:
    body = []
    for numerator in BLITZ:
        for denominator in (CEILING, BEST_INFINITY):
            for profile in PROFILES:
                values = ratios(rounds, numerator, denominator, profile)
                s = spread(values)
                body.append([f"{LABELS[numerator]} / {LABELS[denominator]}", profile,
                             "-" if s is None else f"{s.median:.2f}x",
                             "-" if s is None else f"{s.low:.2f}-{s.high:.2f}x",
                             _per_round(values)])
    return markdown_table(["pair", "profile", "median", "spread (min-max)", "per round"], body)


def targets_markdown(rounds: Sequence[Round], targets: Sequence[Target] = TARGETS) -> str:
    body = []
    for t in targets:
        s = spread(ratios(rounds, t.numerator, t.denominator, t.profile))
        body.append([t.label, ratio_cell(s), verdict(s, t.at_least)])
    return markdown_table(["target (median over rounds)", "measured", "verdict"], body)


def raw_markdown(rounds: Sequence[Round]) -> str:
    names = (CEILING, *BLITZ, BEST_INFINITY)
    body = []
    for r in rounds:
        for profile in PROFILES:
            figures = r.figures[profile]
            cells = [str(r.number), profile]
            for name in names:
                figure = figures.get(name)
                cell = fmt(figure.emb_s if figure else None)
                if figure and figure.errors:
                    cell += f" ({figure.errors} errors)"
                cells.append(cell)
            cells.append(r.best_infinity.get(profile, "-").removeprefix("infinity-"))
            ceiling = figures.get(CEILING)
            cells.append(fmt(ceiling.others_pct if ceiling else None, 0))
            body.append(cells)
    headers = ["round", "profile", *(f"{LABELS[n]} emb/s" for n in names),
               "Infinity engine", "others % during the ceiling"]
    return markdown_table(headers, body)


# ---- one user: 1 text, 1 in flight (``loadtest hops``), beside the in-process call ----

ONE_USER = "oneuser-"  # DIR/rounds/rN/oneuser-<name>.json
ONE_USER_NAME = "blitz-minilm-int8"  # the figure the targets are about
FLOOR_NAME = "floor"  # loadtest.floor_server: the least HTTP server, the same model call
OVER_INPROCESS_MS = 1.5  # target: served p50 <= in-process call p50 + this
P99_OVER_P50 = 2.0  # target: served p99 <= this x served p50


def read_one_user(directory: Path) -> dict[str, dict[str, Any]]:
    """{name: the ``summary`` of its ``loadtest hops`` report} for one round."""
    found = {}
    for path in sorted(directory.glob(f"{ONE_USER}*.json")):
        try:
            summary = orjson.loads(path.read_bytes())["summary"]
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError):
            continue
        found[path.stem.removeprefix(ONE_USER)] = summary
    return found


def one_user_rounds(directory: str | Path) -> list[dict[str, dict[str, Any]]]:
    directory = Path(directory)
    if (directory / "rounds").is_dir():
        directory = directory / "rounds"
    numbered = sorted((int(m.group(1)), p) for p in directory.glob("r*")
                      if (m := re.fullmatch(r"r(\d+)", p.name)) and p.is_dir())
    return [read_one_user(path) for _, path in numbered]


def _get(summary: Mapping[str, Any] | None, *keys: str) -> float | None:
    value: Any = summary
    for key in keys:
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    return _number(value)


def one_user_markdown(rounds: Sequence[Mapping[str, Mapping[str, Any]]]) -> str:
    names = sorted({name for r in rounds for name in r})
    if not names:
        return ""
    body = []
    for name in names:
        cells = [name]
        for keys in (("served", "p50"), ("served", "p99"), ("inprocess", "p50"),
                     ("inprocess_after_gaps", "p50")):
            s = spread([_get(r.get(name), *keys) for r in rounds])
            cells.append("-" if s is None else f"{s.median:.2f} ({s.low:.2f}-{s.high:.2f})")
        body.append(cells)
    table = markdown_table(["server", "p50 ms", "p99 ms", "in-process call p50 ms (same run)",
                            "in-process call after an idle gap, p50 ms"], body)
    mine = [r.get(ONE_USER_NAME) for r in rounds]
    over = spread([_over(m, ("served", "p50"), m, ("inprocess", "p50")) for m in mine])
    tail = spread([_get(m, "served_p99_over_p50") for m in mine])
    targets = markdown_table(["target (median over rounds)", "measured", "verdict"], [
        [f"{ONE_USER_NAME} p50 <= in-process call + {OVER_INPROCESS_MS} ms",
         "-" if over is None else f"+{over.median:.2f} ms ({over.low:.2f}-{over.high:.2f})",
         _at_most(over, OVER_INPROCESS_MS, "ms")],
        [f"{ONE_USER_NAME} p99 <= {P99_OVER_P50:g}x p50",
         "-" if tail is None else f"{tail.median:.2f}x ({tail.low:.2f}-{tail.high:.2f})",
         _at_most(tail, P99_OVER_P50, "x")]])
    floor = _floor_markdown(rounds)
    hops = sorted({h for m in mine if m for h in (m.get("hops_p50_ms") or {})},
                  key=_hop_order)
    hop_rows = []
    for hop in hops:
        s = spread([_get(m, "hops_p50_ms", hop) for m in mine])
        if s is not None:
            hop_rows.append([hop, f"{s.median:.3f}", f"{s.low:.3f}-{s.high:.3f}"])
    return "\n".join([
        "### One user: 1 text, 1 in flight, beside the in-process call\n",
        "Medians over rounds (spread min-max); each round alternates blocks of served "
        "requests and in-process calls (`loadtest hops`).\n", targets, table,
        *([floor] if floor else []),
        f"Where {ONE_USER_NAME}'s time goes (server-timing p50 per hop, ms; `proxy` is the "
        "client's latency beyond the server's total):\n",
        markdown_table(["hop", "median of p50s", "spread"], hop_rows)])


def _over(a: Mapping[str, Any] | None, a_keys: tuple[str, ...], b: Mapping[str, Any] | None,
          b_keys: tuple[str, ...]) -> float | None:
    x, y = _get(a, *a_keys), _get(b, *b_keys)
    return None if x is None or y is None else x - y


def _floor_markdown(rounds: Sequence[Mapping[str, Mapping[str, Any]]]) -> str:
    """What any HTTP server pays here (the floor server's p50 beyond its in-process call)
    and what Blitz adds to it (Blitz's p50 beyond the floor server's), per round."""
    p50 = ("served", "p50")
    floor = spread([_over(r.get(FLOOR_NAME), p50, r.get(FLOOR_NAME), ("inprocess", "p50"))
                    for r in rounds])
    beyond = spread([_over(r.get(ONE_USER_NAME), p50, r.get(FLOOR_NAME), p50) for r in rounds])
    if floor is None or beyond is None:
        return ""
    return (f"The HTTP floor (`python -m loadtest.floor_server`: one uvicorn process, the "
            f"same model call on a worker thread, no proxy, queue or checks) answers one user "
            f"**+{floor.median:.2f} ms** ({floor.low:.2f} to {floor.high:.2f}) beyond its "
            f"in-process call; {ONE_USER_NAME} answers **+{beyond.median:.2f} ms** "
            f"({beyond.low:.2f} to {beyond.high:.2f}) beyond the floor (medians over "
            f"{beyond.rounds} rounds).\n")


def _at_most(s: Spread | None, limit: float, unit: str) -> str:
    if s is None or s.rounds < MIN_ROUNDS:
        return f"not settled (fewer than {MIN_ROUNDS} rounds)"
    return "met" if s.median <= limit else f"**not met** ({s.median:.2f} {unit} > {limit:g})"


def _hop_order(hop: str) -> int:
    from blitz.timing import ENTRIES

    order = [*ENTRIES, "proxy"]
    return order.index(hop) if hop in order else len(order)


def report(directory: str | Path) -> str:
    rounds = load_rounds(directory)
    if not rounds:
        return f"no rounds (rN folders) under {directory}\n"
    one_user = one_user_markdown(one_user_rounds(directory))
    return "\n".join([*([one_user] if one_user else []),
        f"### Interleaved rounds: {len(rounds)} rounds, medians of per-round ratios\n",
        "Each ratio divides a Blitz figure by the ceiling or by the best Infinity engine "
        "measured in the same round and profile (single: 1 text/request at 32 in flight "
        "against 1 text per in-process call; batch32: 32 texts/request at 4 in flight "
        "against 32 per call). Spread: the smallest and largest per-round ratio.\n",
        targets_markdown(rounds), ratios_markdown(rounds),
        "Raw figures, emb/s, in the order measured within each round:\n",
        raw_markdown(rounds)])
