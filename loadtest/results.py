"""The results files BENCHMARKS.md is rendered from: one JSON file per table under
``loadtest/results/`` (committed for the current tables), written by the load tool that
measures it, or, for a table no tool writes yet, kept by hand in the same form.

A file is a JSON object with ``kind``: a tool's own (``vector-cache``, ``grpc-vs-http``:
its raw ``rounds``, rendered by the tool's ``table``), or ``table``: ``columns`` and
``rows`` of Markdown cells. ``python -m loadtest.render`` renders them all.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def path_of(name: str) -> Path:
    return RESULTS / f"{name}.json"


def save(name: str, result: dict[str, Any], folder: Path = RESULTS) -> Path:
    """Write ``result`` as the results file ``name`` (what the current table shows once
    rendered and committed)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def load(name: str, folder: Path = RESULTS) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((folder / f"{name}.json").read_text(encoding="utf-8"))
    return result


def markdown(columns: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table of ``columns`` and ``rows`` (cells as they are written)."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)
