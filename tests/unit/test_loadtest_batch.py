"""``loadtest.batch_bench``'s pure parts: the request lines, the exactly-once check of a
batch's output file, the latency percentiles, the medians and the table. No Ray, no server."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from loadtest.batch_bench import (
    COLUMNS,
    check_output,
    custom_ids,
    latency,
    markdown,
    medians,
    request_lines,
    round_ratios,
    table_rows,
    vector,
    write_jsonl,
)


def test_one_text_a_line_sends_it_as_a_string_with_its_id():
    lines = list(request_lines(["a", "b", "c"], "minilm", 1))
    assert lines[1] == {"custom_id": "1", "method": "POST", "url": "/v1/embeddings",
                        "body": {"model": "minilm", "input": "b"}}
    assert [line["custom_id"] for line in lines] == custom_ids(3, 1) == ["0", "1", "2"]


def test_several_texts_a_line_send_a_list_named_by_the_first_id():
    lines = list(request_lines(["a", "b", "c", "d", "e"], "m", 2))
    assert [line["body"]["input"] for line in lines] == [["a", "b"], ["c", "d"], ["e"]]
    assert [line["custom_id"] for line in lines] == custom_ids(5, 2) == ["0", "2", "4"]
    with pytest.raises(ValueError):
        list(request_lines(["a"], "m", 0))


def test_the_lines_round_trip_through_the_file(tmp_path: Path):
    path = tmp_path / "requests.jsonl"
    size = write_jsonl(path, request_lines(["x", "y"], "m", 1))
    assert size == path.stat().st_size
    assert [orjson.loads(raw)["body"]["input"] for raw in path.read_bytes().splitlines()] == [
        "x", "y"]


def _answer(cid: str, vectors: list[Any], status: int = 200) -> dict[str, Any]:
    body = ({"object": "list", "data": [{"object": "embedding", "index": i, "embedding": v}
                                        for i, v in enumerate(vectors)]}
            if status == 200 else {"error": {"message": "no"}})
    return {"id": f"batch_req_{cid}", "custom_id": cid, "error": None,
            "response": {"status_code": status, "request_id": "r", "body": body}}


def _output(tmp_path: Path, rows: list[dict[str, Any]]) -> Path:
    path = tmp_path / "output.jsonl"
    write_jsonl(path, rows)
    return path


def test_every_request_answered_once_passes_in_any_order(tmp_path: Path):
    rows = [_answer("2", [[0.0, 1.0]]), _answer("0", [[1.0, 0.0]]), _answer("1", [[1.0, 1.0]])]
    check = check_output(_output(tmp_path, rows), custom_ids(3, 1), 3)
    assert check.problems() == []
    assert (check.lines, check.texts, check.first_id) == (3, 3, "2")
    assert check.first_vector is not None and check.first_vector.tolist() == [0.0, 1.0]


def test_missing_repeated_foreign_and_failed_lines_are_each_named(tmp_path: Path):
    rows = [_answer("0", [[1.0]]), _answer("0", [[1.0]]), _answer("7", [[1.0]]),
            _answer("2", [], status=429)]
    check = check_output(_output(tmp_path, rows), custom_ids(4, 1), 4)
    problems = check.problems()
    assert check.missing == ["1", "3"]
    assert check.duplicates == ["0"]
    assert check.unexpected == ["7"]
    assert check.failed == ["2: 429 {'message': 'no'}"]
    assert not any("lines for" in p for p in problems)  # 4 lines, as many as requests
    assert any("missing: 1, 3" in p for p in problems)
    assert any("more than once: 0" in p for p in problems)
    assert any("not requested: 7" in p for p in problems)
    assert any("1 custom_ids failed" in p for p in problems)


def test_a_line_short_of_vectors_is_caught(tmp_path: Path):
    rows = [_answer("0", [[1.0], [1.0]]), _answer("2", [[1.0]])]  # 2 texts a line, 4 texts
    assert check_output(_output(tmp_path, rows), custom_ids(4, 2), 4).problems() == [
        "3 vectors for 4 texts"]


def test_a_short_file_is_caught_even_without_repeats(tmp_path: Path):
    check = check_output(_output(tmp_path, [_answer("0", [[1.0]])]), custom_ids(2, 1), 2)
    assert check.problems()[0] == "1 lines for 2 requests"


def test_base64_vectors_are_read_as_float32():
    raw = np.array([0.5, -1.25, 3.0], dtype="<f4")
    assert vector(base64.b64encode(raw.tobytes()).decode()).tolist() == raw.tolist()
    assert vector([1, 2]).dtype == np.float32


def test_latency_is_p50_and_p99_in_milliseconds():
    summary = latency([i / 1000 for i in range(1, 101)], errors=2)  # 1..100 ms
    assert summary["requests"] == 100 and summary["errors"] == 2
    assert summary["p50_ms"] == pytest.approx(50.5)
    assert summary["p99_ms"] == pytest.approx(99.01)
    assert latency([]) == {"requests": 0, "errors": 0, "p50_ms": None, "p99_ms": None}


def _round(n: int, embed: float, batch: float, idle: float | None,
           during: float | None) -> dict[str, Any]:
    row: dict[str, Any] = {
        "round": n, "order": ["embed", "batch"] if n % 2 else ["batch", "embed"],
        "embed": {"texts_per_s": embed, "seconds": 100.0, "ray": "its own Ray"},
        "batch": {"texts_per_s": batch, "upload_s": 0.5, "seconds": 120.0},
        "user": {"idle": {"p50_ms": idle, "p99_ms": None if idle is None else 2 * idle},
                 "during": {"p50_ms": during,
                            "p99_ms": None if during is None else 3 * during}}}
    row["ratios"] = round_ratios(row)
    return row


def test_ratios_and_medians_are_per_round_then_the_middle():
    rounds = [_round(1, 1000.0, 800.0, 10.0, 20.0), _round(2, 900.0, 900.0, 12.0, 18.0),
              _round(3, 1100.0, 660.0, None, None)]
    assert rounds[0]["ratios"] == {"batch_vs_embed": 0.8, "p50_during_vs_idle": 2.0,
                                   "p99_during_vs_idle": 3.0}
    assert rounds[2]["ratios"]["p50_during_vs_idle"] is None
    middle = medians(rounds)
    assert middle["embed_texts_per_s"] == 1000.0
    assert middle["batch_vs_embed"] == pytest.approx(0.8)  # of 0.8, 1.0, 0.6
    assert middle["idle_p50_ms"] == 11.0  # the rounds that have one
    assert middle["p50_during_vs_idle"] == pytest.approx(1.75)


def test_the_table_has_a_row_a_round_and_the_medians():
    rounds = [_round(1, 1000.0, 800.0, 10.0, 20.0), _round(2, 900.0, 900.0, 12.0, 18.0)]
    rows = table_rows(rounds, medians(rounds))
    assert rows[0] == ["1 (embed then batch)", "1,000", "800", "0.80x", "0.50",
                       "10.0 / 20.0", "20.0 / 60.0", "2.00x"]
    assert rows[-1][0] == "median" and rows[-1][3] == "**0.90x**"
    result = {"columns": COLUMNS, "rows": rows, "rounds": rounds,
              "config": {"texts": 100000, "model": "minilm", "texts_per_line": 1, "cores": 2,
                         "server": "scripts/serve.sh started each round", "poll_s": 1.0,
                         "idle_s": 10.0}}
    text = markdown(result)
    assert text.startswith("| round | blitz embed texts/s | batch API texts/s |")
    assert "| median | 950 | 850 | **0.90x** |" in text
    assert "100,000 texts, model minilm" in text and "on its own Ray" in text
