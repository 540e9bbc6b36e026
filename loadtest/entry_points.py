"""``python -m loadtest entry-points DIR``: what ``loadtest/entry_points.sh`` measured.

Each round folder ``DIR/rN`` holds, per entry point (LEG: ``card``, ``serve-hop``,
``default-proxy``, ``serve-sh``), ``LEG-single.json`` and ``LEG-batch32.json`` (``loadtest run`` with the
server's CPU time) and ``oneuser-LEG.json`` (``loadtest hops``), plus
``oneuser-floor.json`` (the HTTP floor), and ``LEG-pss-idle.jsonl`` / ``LEG-pss-peak.jsonl``
(``python -m loadtest.memory --json``: PSS per process, idle and at the largest sample
under load). Every ratio is taken within one round, against
``serve-sh`` (``scripts/serve.sh``, the path Blitz was tuned on), then the median over
rounds and its spread are reported, as ``loadtest rounds`` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from loadtest.report import markdown_table
from loadtest.rounds import Spread, ratio_cell, spread

BASE = "serve-sh"
LEGS = {"card": "`serve run serve_config.yaml` (the card; its controller_options: fast path)",
        "serve-hop": "the card with `ingress.pool_hop: serve` (Serve's handle to the CPU pool)",
        "default-proxy": "`serve run`, a config without them (Serve's default proxy)",
        "serve-sh-again": "`bash scripts/serve.sh` again (A/A control: the same entry point)",
        "serve-sh": "`bash scripts/serve.sh` (fast path, no driver)"}
PROFILES = ("single", "batch32")
TARGET = 0.9  # the card's `serve run` against scripts/serve.sh, each profile, every round
PSS_TARGET = 1.10  # the card's PSS against scripts/serve.sh's, idle and peak, every round
PSS_KINDS = ("idle", "peak")


def _load(path: Path) -> dict[str, Any] | None:
    try:
        return orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None


def run_figure(path: Path) -> tuple[float, float | None] | None:
    """(emb/s, server CPU-ms per request) of a ``loadtest run`` report with no errors."""
    document = _load(path)
    results = (document or {}).get("results") or []
    if not results or results[0].get("errors"):
        return None
    return float(results[0]["embeddings_per_s"]), results[0].get("server_cpu_ms_per_request")


def one_user_p50(path: Path) -> tuple[float, float] | None:
    """(served p50, in-process p50) in ms of a ``loadtest hops`` report."""
    summary = (_load(path) or {}).get("summary") or {}
    served, inprocess = summary.get("served") or {}, summary.get("inprocess") or {}
    if "p50" not in served or "p50" not in inprocess:
        return None
    return float(served["p50"]), float(inprocess["p50"])


def pss_processes(path: Path) -> list[dict[str, Any]] | None:
    """The processes of a ``loadtest.memory --json`` file (pid, name, pss_kib)."""
    try:
        lines = path.read_bytes().splitlines()
    except OSError:
        return None
    processes = [orjson.loads(line) for line in lines if line.strip()]
    return processes or None


def pss_mib(path: Path) -> float | None:
    processes = pss_processes(path)
    return None if processes is None else sum(p["pss_kib"] for p in processes) / 1024


def round_dirs(directory: Path) -> list[Path]:
    return sorted((p for p in directory.glob("r*") if p.name[1:].isdigit()),
                  key=lambda p: int(p.name[1:]))


def _ratios(rounds: Sequence[Path], leg: str, profile: str) -> list[float | None]:
    """Per round: ``leg``'s emb/s over serve-sh's, None where either is missing."""
    ratios: list[float | None] = []
    for r in rounds:
        top, base = run_figure(r / f"{leg}-{profile}.json"), run_figure(
            r / f"{BASE}-{profile}.json")
        ratios.append(top[0] / base[0] if top and base and base[0] else None)
    return ratios


def _pss_ratios(rounds: Sequence[Path], leg: str, kind: str) -> list[float | None]:
    """Per round: ``leg``'s total PSS over serve-sh's."""
    ratios: list[float | None] = []
    for r in rounds:
        top, base = pss_mib(r / f"{leg}-pss-{kind}.jsonl"), pss_mib(r / f"{BASE}-pss-{kind}.jsonl")
        ratios.append(top / base if top is not None and base else None)
    return ratios


def _per_round(values: Sequence[float | None]) -> str:
    return ", ".join("-" if v is None else f"{v:.2f}" for v in values)


def _cell(s: Spread | None, unit: str = "") -> str:
    if s is None:
        return "-"
    return f"{s.median:.2f}{unit} ({s.low:.2f}-{s.high:.2f}, {s.rounds} rounds)"


def report(directory: str | Path) -> str:
    rounds = round_dirs(Path(directory))
    rows = []
    for leg, label in LEGS.items():
        row = [label, *(ratio_cell(spread(_ratios(rounds, leg, p))) for p in PROFILES)]
        cpu = [run_figure(r / f"{leg}-single.json") for r in rounds]
        row.append(_cell(spread([c[1] if c else None for c in cpu])))
        users = [one_user_p50(r / f"oneuser-{leg}.json") for r in rounds]
        floors = [one_user_p50(r / "oneuser-floor.json") for r in rounds]
        row.append(_cell(spread([u[0] if u else None for u in users]), " ms"))
        row.append(_cell(spread([u[0] - f[0] if u and f else None
                                 for u, f in zip(users, floors, strict=True)]), " ms"))
        rows.append(row)
    floors = [one_user_p50(r / "oneuser-floor.json") for r in rounds]
    floor_row = ["the HTTP floor (`loadtest.floor_server`)", "-", "-", "-",
                 _cell(spread([f[0] if f else None for f in floors]), " ms"), "0"]
    table = markdown_table(
        ["entry point", "single / serve.sh", "batch32 / serve.sh",
         "server CPU-ms per single request", "one user p50", "one user p50 - the floor's"],
        [*rows, floor_row])
    per_round = markdown_table(
        ["entry point", *(f"{p} / serve.sh per round" for p in PROFILES),
         *(f"PSS {k} MiB (/ serve.sh) per round" for k in PSS_KINDS)],
        [[label, *(_per_round(_ratios(rounds, leg, p)) for p in PROFILES),
          *(", ".join("-" if m is None else
                      f"{m:.0f} ({x:.2f}x)" if x is not None else f"{m:.0f}"
                      for m, x in zip([pss_mib(r / f"{leg}-pss-{k}.jsonl") for r in rounds],
                                      _pss_ratios(rounds, leg, k), strict=True))
            for k in PSS_KINDS)]
         for leg, label in LEGS.items()
         if any((r / f"{leg}-single.json").exists() for r in rounds)])
    return "\n".join([f"Entry points, {len(rounds)} interleaved rounds (median, min-max):",
                      "", table, "", "Per round (rounds 1, 2, ...):", "", per_round, "",
                      *targets(rounds), "", pss_by_process(rounds), "",
                      cpu_by_process(rounds, "single"), "", cpu_by_process(rounds, "batch32")])


def cpu_shares(directory: Path, leg: str, profile: str) -> dict[str, float] | None:
    """CPU-ms per request by process name: each process's share of the tree's CPU time
    between ``LEG-PROFILE-procs0/1.jsonl`` (the profile, its warm-up included) times the
    run's measured server CPU-ms per request."""
    before, after = (pss_processes(directory / f"{leg}-{profile}-procs{i}.jsonl")
                     for i in (0, 1))
    run = run_figure(directory / f"{leg}-{profile}.json")
    if before is None or after is None or run is None or run[1] is None:
        return None
    start = {p["pid"]: p.get("cpu_s") or 0.0 for p in before}
    used: dict[str, float] = {}
    for p in after:
        if p.get("cpu_s") is not None:
            used[p["name"]] = used.get(p["name"], 0.0) + p["cpu_s"] - start.get(p["pid"], 0.0)
    total = sum(used.values())
    if total <= 0:
        return None
    return {name: run[1] * s / total for name, s in used.items()}


def cpu_by_process(rounds: Sequence[Path], profile: str) -> str:
    import statistics

    table: dict[str, dict[str, list[float]]] = {}
    legs = []
    for leg in LEGS:
        for r in rounds:
            shares = cpu_shares(r, leg, profile)
            if shares is None:
                continue
            if leg not in legs:
                legs.append(leg)
            shares["**total**"] = sum(shares.values())
            for name, ms in shares.items():
                table.setdefault(name, {}).setdefault(leg, []).append(ms)
    if not table:
        return ""
    order = sorted(table, key=lambda n: (n == "**total**", -max(
        statistics.median(v) for v in table[n].values())))
    rows = [[name, *(f"{statistics.median(table[name][leg]):.3f}" if leg in table[name]
                     else "-" for leg in legs)] for name in order
            if name == "**total**" or max(statistics.median(v) for v in table[name].values())
            >= 0.0005]
    return (f"Server CPU-ms per request by process, {profile} (median of the rounds):\n\n"
            + markdown_table(["process", *legs], rows))


def pss_by_process(rounds: Sequence[Path], kind: str = "idle") -> str:
    """PSS MiB by process name and leg, median over the rounds."""
    import statistics

    legs = [leg for leg in LEGS if any((r / f"{leg}-pss-{kind}.jsonl").exists() for r in rounds)]
    table: dict[str, dict[str, list[float]]] = {}
    for leg in legs:
        for r in rounds:
            processes = pss_processes(r / f"{leg}-pss-{kind}.jsonl")
            if processes is None:
                continue
            sums: dict[str, float] = {}
            for p in processes:
                sums[p["name"]] = sums.get(p["name"], 0.0) + p["pss_kib"] / 1024
            sums["**total**"] = sum(sums.values())
            for name, mib in sums.items():
                table.setdefault(name, {}).setdefault(leg, []).append(mib)
    if not table:
        return ""
    order = sorted(table, key=lambda n: (n == "**total**", -max(
        statistics.median(v) for v in table[n].values())))
    rows = [[name, *(f"{statistics.median(table[name][leg]):.0f}" if leg in table[name]
                     else "-" for leg in legs)] for name in order]
    return (f"PSS MiB by process, {kind} (median of the rounds; a process missing from a "
            f"round counts in the rounds it ran):\n\n"
            + markdown_table(["process", *legs], rows))


def targets(rounds: Sequence[Path]) -> list[str]:
    lines = []
    for profile in PROFILES:
        s = spread(_ratios(rounds, "card", profile))
        verdict = ("not measured" if s is None else
                   "met" if s.low >= TARGET else f"**not met** (lowest round {s.low:.2f}x)")
        lines.append(f"- the card's `serve run` >= {TARGET}x scripts/serve.sh in every round, "
                     f"{profile}: {verdict}")
    for kind in PSS_KINDS:
        s = spread(_pss_ratios(rounds, "card", kind))
        verdict = ("not measured" if s is None else
                   "met" if s.high <= PSS_TARGET else
                   f"**not met** (highest round {s.high:.2f}x)")
        lines.append(f"- the card's PSS {kind} within {PSS_TARGET - 1:.0%} of scripts/serve.sh's "
                     f"in every round: {verdict}")
    return lines
