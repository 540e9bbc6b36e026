"""``python -m loadtest report DIR``: the tables of one ``loadtest/benchmark.sh`` run.

benchmark.sh writes one JSON report per measurement into DIR under fixed names
(``blitz-minilm-single.json``, ``inprocess-int8.json``...). This module reads the ones
present and prints markdown: emb/s for the single and batch32 profiles per system, each
served figure divided by the in-process ceiling of the same backend (1 text per call for
single, 32 for batch32), and Blitz divided by the best Infinity engine. A missing file
shows as ``-``, so a partial run still reports what it measured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from loadtest.report import fmt, markdown_table

PROFILE_TEXTS = {"single": 1, "batch32": 32}


@dataclass(frozen=True)
class Ceiling:
    """Rows of an in-process report: ``file`` (a stem in DIR), engine and backend."""

    file: str
    engine: str = "blitz"
    backend: str | None = None  # None: whatever the file's rows say


@dataclass(frozen=True)
class Row:
    """One table row: served (``stem``-single/batch32.json) or in process (``inprocess``)."""

    label: str
    stem: str | None = None
    inprocess: Ceiling | None = None
    ceiling: Ceiling | None = None  # what the served figure is divided by
    peer: bool = False  # an Infinity row, for the "x best Infinity" column
    blitz: bool = False


@dataclass(frozen=True)
class Table:
    title: str
    rows: tuple[Row, ...]


MINILM_TORCH = Ceiling("inprocess-torch", backend="torch")
MINILM_INT8 = Ceiling("inprocess-int8", backend="onnx-int8")
MINILM_ST = Ceiling("inprocess-torch", engine="sentence-transformers")
# two threads calling at once, one intra-op thread each: what a pool with `workers: 2`,
# `torch_threads: 1` (serve_config.yaml) runs
MINILM_TORCH_2X1 = Ceiling("inprocess-torch-2x1", backend="torch")
MINILM_INT8_2X1 = Ceiling("inprocess-int8-2x1", backend="onnx-int8")
BERT_TORCH = Ceiling("inprocess-bert-base-torch", backend="torch")
BERT_ST = Ceiling("inprocess-bert-base-torch", engine="sentence-transformers")
BERT_BF16 = Ceiling("inprocess-bert-base-bf16", backend="torch-bf16")
BERT_INT8 = Ceiling("inprocess-bert-base-int8", backend="onnx-int8")
BERT_BF16_2X1 = Ceiling("inprocess-bert-base-bf16-2x1", backend="torch-bf16")
BERT_INT8_2X1 = Ceiling("inprocess-bert-base-int8-2x1", backend="onnx-int8")

TABLES = (
    Table("all-MiniLM-L6-v2 (384 dimensions)", (
        Row("in-process `load_encoder().embed`, torch fp32", inprocess=MINILM_TORCH),
        Row("in-process `SentenceTransformer.encode`, torch fp32", inprocess=MINILM_ST),
        Row("in-process `load_encoder().embed`, ONNX int8", inprocess=MINILM_INT8),
        Row("in-process, torch fp32, 2 callers x 1 thread", inprocess=MINILM_TORCH_2X1),
        Row("in-process, ONNX int8, 2 callers x 1 thread", inprocess=MINILM_INT8_2X1),
        Row("naive: FastAPI + sentence-transformers, 2 gunicorn workers (JSON)", "naive",
            ceiling=MINILM_ST),
        Row("Infinity, torch engine (OpenAI API, float)", "infinity-minilm-torch",
            ceiling=MINILM_ST, peer=True),
        Row("Infinity, optimum engine, ONNX fp32 (OpenAI API, float)",
            "infinity-minilm-optimum", peer=True),
        Row("**Blitz `minilm-fp32` (torch fp32), msgpack**", "blitz-minilm-fp32",
            ceiling=MINILM_TORCH, blitz=True),
        Row("**Blitz `minilm-int8` (ONNX int8), msgpack**", "blitz-minilm-int8",
            ceiling=MINILM_INT8, blitz=True),
        Row("**Blitz `minilm` (`cpu_backend: auto`, the default), msgpack**", "blitz-minilm",
            ceiling=MINILM_INT8, blitz=True),
        Row("Blitz `minilm-int8`, OpenAI API, base64", "blitz-int8-openai",
            ceiling=MINILM_INT8, blitz=True),
    )),
    Table("BERT-base-sized model, random weights (12 x 768, 768 dimensions)", (
        Row("in-process `load_encoder().embed`, torch fp32", inprocess=BERT_TORCH),
        Row("in-process `SentenceTransformer.encode`, torch fp32", inprocess=BERT_ST),
        Row("in-process `load_encoder().embed`, torch bf16", inprocess=BERT_BF16),
        Row("in-process `load_encoder().embed`, ONNX int8", inprocess=BERT_INT8),
        Row("in-process, torch bf16, 2 callers x 1 thread", inprocess=BERT_BF16_2X1),
        Row("in-process, ONNX int8, 2 callers x 1 thread", inprocess=BERT_INT8_2X1),
        Row("Infinity, torch engine (OpenAI API, float)", "infinity-bert-base-torch",
            ceiling=BERT_ST, peer=True),
        Row("Infinity, optimum engine, ONNX fp32 (OpenAI API, float)",
            "infinity-bert-base-optimum", peer=True),
        Row("**Blitz `bert-base` (torch fp32), msgpack**", "blitz-bert-base",
            ceiling=BERT_TORCH, blitz=True),
        Row("**Blitz `bert-base-bf16` (torch bf16), msgpack**", "blitz-bert-base-bf16",
            ceiling=BERT_BF16, blitz=True),
        Row("**Blitz `bert-base-int8` (ONNX int8), msgpack**", "blitz-bert-base-int8",
            ceiling=BERT_INT8, blitz=True),
    )),
)


def _load(directory: Path, stem: str) -> dict[str, Any] | None:
    path = directory / f"{stem}.json"
    if not path.exists():
        return None
    return orjson.loads(path.read_bytes())


def served(directory: Path, stem: str, profile: str) -> dict[str, Any] | None:
    """The first result of ``STEM-PROFILE.json``, or None when it is absent or empty."""
    document = _load(directory, f"{stem}-{profile}")
    if not document or not document.get("results"):
        return None
    return document["results"][0]


def ceiling(directory: Path, spec: Ceiling, texts_per_call: int) -> float | None:
    """emb/s of ``spec``'s in-process row at ``texts_per_call``."""
    document = _load(directory, spec.file)
    for row in (document or {}).get("results", []):
        if (row["engine"] == spec.engine and row["texts_per_call"] == texts_per_call
                and (spec.backend is None or spec.engine != "blitz"
                     or row["backend"] == spec.backend)):
            return float(row["embeddings_per_s"])
    return None


def _number(value: Any) -> float | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return float(value)


def ratio(numerator: float | None, denominator: float | None) -> str:
    if numerator is None or not denominator:
        return "-"
    return f"{numerator / denominator:.2f}x"


def row_values(directory: Path, row: Row) -> dict[str, dict[str, Any]]:
    """Per profile: emb/s, p50/p99 ms and errors (None where not measured)."""
    values = {}
    for profile, texts in PROFILE_TEXTS.items():
        if row.inprocess is not None:
            values[profile] = {"emb_s": ceiling(directory, row.inprocess, texts)}
            continue
        result = served(directory, row.stem, profile) if row.stem else None
        if result is None:
            values[profile] = {"emb_s": None}
            continue
        latency = result.get("latency_ms", {})
        values[profile] = {
            "emb_s": _number(result.get("embeddings_per_s")),
            "p50": _number(latency.get("p50")), "p99": _number(latency.get("p99")),
            "errors": int(result.get("errors", 0)),
        }
    return values


def table_markdown(directory: Path, table: Table) -> str:
    measured = [(row, row_values(directory, row)) for row in table.rows]
    best_peer = {}
    for profile in PROFILE_TEXTS:
        peers = [v[profile]["emb_s"] for row, v in measured
                 if row.peer and v[profile]["emb_s"] is not None]
        best_peer[profile] = max(peers) if peers else None
    headers = ["system", "single emb/s", "batch32 emb/s", "single / in-process",
               "batch32 / in-process", "single / best Infinity", "batch32 / best Infinity",
               "p50 / p99 ms single", "p50 / p99 ms batch32", "errors"]
    body = []
    for row, values in measured:
        cells = [row.label] + [fmt(values[p]["emb_s"]) for p in PROFILE_TEXTS]
        for profile, texts in PROFILE_TEXTS.items():
            base = ceiling(directory, row.ceiling, texts) if row.ceiling else None
            cells.append(ratio(values[profile]["emb_s"], base))
        for profile in PROFILE_TEXTS:
            cells.append(ratio(values[profile]["emb_s"], best_peer[profile])
                         if row.blitz else "")
        for profile in PROFILE_TEXTS:
            v = values[profile]
            cells.append(f"{fmt(v['p50'], 0)} / {fmt(v['p99'], 0)}" if "p50" in v else "")
        errors = [values[p].get("errors") for p in PROFILE_TEXTS]
        cells.append(" / ".join("-" if e is None else str(e) for e in errors)
                     if any(e is not None for e in errors) else "")
        body.append(cells)
    return f"### {table.title}\n\n" + markdown_table(headers, body)


def report(directory: str | Path, tables: Sequence[Table] = TABLES) -> str:
    """The interleaved rounds (when DIR/rounds exists), then the one-shot tables."""
    from loadtest import rounds

    directory = Path(directory)
    legend = ("single = 1 text/request at 32 in flight, batch32 = 32 texts/request at 4 in "
              "flight. `/ in-process`: the served figure over the same backend's in-process "
              "ceiling at 1 (single) or 32 (batch32) texts per call (Infinity torch and the "
              "naive server: plain `SentenceTransformer.encode`). `/ best Infinity`: over the "
              "best Infinity engine measured one-shot in this folder. errors: single / "
              "batch32.\n")
    if not (directory / "rounds").is_dir():
        return "\n".join([legend] + [table_markdown(directory, t) for t in tables])
    # with rounds, the one-shot tables are extras: only those with a figure in them
    tables = [t for t in tables if any(
        v["emb_s"] is not None for row in t.rows for v in row_values(directory, row).values())]
    extras = ("## One-shot extras\n\nOne run each, not interleaved: compare within a row. "
              "What the rounds measure (Blitz `minilm-int8` and `minilm`, Infinity's "
              "engines in INFINITY_ENGINES on MiniLM) shows as - here.\n")
    if not tables:
        extras = "## One-shot extras\n\nNone measured in this folder.\n"
    return "\n".join([rounds.report(directory), extras]
                      + ([legend] if tables else []) + [table_markdown(directory, t) for t in tables])
