"""Reports: a JSON document for files and a markdown table for people.

A load-test document looks like::

    {"kind": "loadtest", "mode": "run" | "sweep", "environment": {...},
     "results": [{"config": {...}, "warmup_requests": 12, "requests": 950, "errors": 0,
                  "error_kinds": {}, "requests_per_s": 47.5, "embeddings_per_s": 1520.0,
                  "latency_ms": {"mean", "p50", "p95", "p99", "max"},
                  "reply_bytes_per_request": 49262.0, ...}]}

NaN (no successful request) is written as ``null``.
"""

from __future__ import annotations

import datetime as dt
import math
import os
import platform
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from loadtest.runner import RunResult
from loadtest.stats import Summary


def environment() -> dict[str, Any]:
    return {
        "time_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "argv": sys.argv[1:],
    }


def fmt(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def result_to_dict(result: RunResult) -> dict[str, Any]:
    return {"config": result.config.public(), "warmup_requests": result.warmup_requests,
            **result.summary.to_dict()}


def loadtest_document(results: Sequence[RunResult], mode: str) -> dict[str, Any]:
    return {"kind": "loadtest", "mode": mode, "environment": environment(),
            "results": [result_to_dict(r) for r in results]}


def errors_cell(summary: Summary) -> str:
    if not summary.errors:
        return "0"
    kinds = ", ".join(f"{k}: {v}" for k, v in summary.error_kinds.items())
    return f"{summary.errors} ({kinds})"


def loadtest_markdown(rows: Sequence[tuple[dict[str, Any], Summary]]) -> str:
    """One table row per (config, summary)."""
    headers = ["API", "texts/req", "conc", "req/s", "emb/s", "p50 ms", "p95 ms", "p99 ms",
               "max ms", "reply B/req", "client CPU ms/req", "server CPU ms/req",
               "machine busy %", "others %", "errors"]
    body = []
    for config, s in rows:
        lat = s.latency_ms
        body.append([config["api"], str(config["texts_per_request"]), str(config["concurrency"]),
                     fmt(s.requests_per_s), fmt(s.embeddings_per_s), fmt(lat.p50), fmt(lat.p95),
                     fmt(lat.p99), fmt(lat.max), fmt(s.reply_bytes_per_request, 0),
                     fmt(s.client_cpu_ms_per_request, 2), fmt(s.server_cpu_ms_per_request, 2),
                     fmt(s.machine_busy_pct, 0), fmt(s.others_busy_pct, 0), errors_cell(s)])
    return markdown_table(headers, body)


def results_markdown(results: Sequence[RunResult]) -> str:
    return loadtest_markdown([(r.config.public(), r.summary) for r in results])


def write_json(path: str | os.PathLike, document: dict[str, Any]) -> None:
    Path(path).write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n")


def read_loadtest(path: str | os.PathLike) -> list[tuple[dict[str, Any], Summary]]:
    """(config, summary) pairs from a document ``write_json`` wrote."""
    document = orjson.loads(Path(path).read_bytes())
    if document.get("kind") != "loadtest":
        raise ValueError(f"{path} is not a load-test report")
    pairs = []
    for item in document["results"]:
        item = dict(item)
        config, _ = item.pop("config"), item.pop("warmup_requests", None)
        latency = {k: (math.nan if v is None else v) for k, v in item["latency_ms"].items()}
        pairs.append((config, Summary.from_dict({**item, "latency_ms": latency})))
    return pairs
