"""Property-based tests of the bulk job's readers (blitz/bulk/read.py) on arbitrary files.

Every line or row of a JSONL, CSV or Parquet file ends as a row to embed or as a refused
row with a reason (errors.jsonl), and the batch step takes whatever the readers give: no
content makes a reader or the batch step raise. The one file-level refusal is the job's
check that a CSV or Parquet file has the text column (and a CSV header that can be read).
"""

from __future__ import annotations

import csv
import io
import itertools
import json
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from blitz.bulk.job import BatchEncoder
from blitz.bulk.read import ROWS, columns_of, read_rows
from blitz.settings.bulk import BulkSettings
from blitz.settings.registry import ModelSpec
from tests.unit.test_fuzz_codecs import MAX_RATIO, cost_ratio

FAKE = ModelSpec(id="fake", source="fake:4")
_files = itertools.count()


@pytest.fixture(scope="module")
def encoder() -> BatchEncoder:
    return BatchEncoder(FAKE, BulkSettings())


def read(data: bytes, kind: str, batch_rows: int = 3, max_row_bytes: int = 1 << 16) -> pa.Table:
    tables = list(read_rows(io.BytesIO(data), kind, 0, text_column="text", id_column="id",
                            batch_rows=batch_rows, max_row_bytes=max_row_bytes))
    assert all(t.schema.equals(ROWS) for t in tables)
    return pa.concat_tables(tables) if tables else ROWS.empty_table()


def embed_rows(encoder: BatchEncoder, rows: pa.Table) -> None:
    """The job's batch step on ``rows``: each row either has a text or a reason, and the
    batch step returns every row."""
    texts, reasons = rows.column("_text").to_pylist(), rows.column("_refused").to_pylist()
    assert all(bool(t.strip()) != bool(r) for t, r in zip(texts, reasons, strict=True))
    if rows.num_rows:
        out = encoder.encode(rows)
        assert out.column("_refused").to_pylist() == reasons


# --- JSON lines -------------------------------------------------------------------------

SURROGATES = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
TEXTS = st.text(max_size=8) | st.text(SURROGATES, min_size=1, max_size=2) | st.just(" ")
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | TEXTS,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=3), kids,
                                                              max_size=3),
    max_leaves=8)
OBJECTS = st.fixed_dictionaries({}, optional={"id": VALUES, "text": VALUES | TEXTS,
                                              "other": VALUES})
LINES = (OBJECTS.map(json.dumps) | VALUES.map(json.dumps)
         | st.sampled_from(["", " ", "not json", "{", '{"text": "a"', "[" * 5000, "\ufeff{}",
                            '{"text": "a"} trailing', "1" * 5000, '{"text": "\\ud800"}'])
         | st.text(max_size=20))
JSONL = (st.lists(LINES, max_size=8).map(lambda lines: "\n".join(lines).encode(
             "utf-8", "surrogatepass"))
         | st.binary(max_size=80))


@given(JSONL)
def test_any_json_lines_file_becomes_embedded_or_refused_rows(encoder, data):
    rows = read(data, "json")
    assert rows.num_rows == sum(1 for line in data.split(b"\n") if line.strip())
    embed_rows(encoder, rows)


# (line at size n): one batch holding the line, read with integer ids
LINE_FAMILIES: dict[str, Any] = {
    "deep nesting": lambda n: "[" * n,
    "deep maps": lambda n: '{"a":' * n + "1" + "}" * n,
    "long text": lambda n: '{"id": 1, "text": "' + "a" * n + '"}',
    "escape-heavy text": lambda n: '{"id": 1, "text": "' + '\\"\\u00e9' * n + '"}',
    "lone surrogates": lambda n: '{"id": 1, "text": "' + "\\ud800" * n + '"}',
    "many keys": lambda n: '{"id": 1, ' + '"key": 0, ' * n + '"text": "a"}',  # one key
    "unterminated string": lambda n: '{"text": "' + '\\"[' * n,
}
LINE_SIZES = {"deep nesting": 100_000, "deep maps": 30_000, "long text": 50_000,
              "escape-heavy text": 20_000, "lone surrogates": 20_000, "many keys": 15_000,
              "unterminated string": 50_000}


def read_json(data: bytes) -> pa.Table:
    return read(data, "json", batch_rows=256, max_row_bytes=1 << 24)


@pytest.mark.parametrize("family", list(LINE_FAMILIES))
def test_reading_a_line_costs_linear_time(family):
    def file(n: int) -> bytes:
        return ('{"id": 1, "text": "first"}\n' + LINE_FAMILIES[family](n)).encode(
            "utf-8", "surrogatepass")

    assert cost_ratio(file, read_json, LINE_SIZES[family]) <= MAX_RATIO


def test_reading_many_lines_costs_linear_time():
    lines = ['{"id": 1, "text": "a"}', "[" * 50, "bad", '{"text": "\\ud800"}',
             '{"id": 1180591620717411303424, "text": "a"}', "\xff"]

    def file(n: int) -> bytes:
        return "\n".join(lines * n).encode("utf-8", "surrogateescape")

    assert cost_ratio(file, read_json, 200) <= MAX_RATIO


def test_a_line_longer_than_the_limit_is_skipped_in_linear_time():
    def file(n: int) -> bytes:
        return b'{"id": 1, "text": "a"}\n' + b"[" * n + b"\n" + b'{"id": 2, "text": "b"}'

    assert cost_ratio(file, lambda data: read(data, "json", max_row_bytes=1000),
                      1 << 20) <= MAX_RATIO


# --- CSV and Parquet --------------------------------------------------------------------

CELLS = (st.text(max_size=8) | st.integers(-(2**70), 2**70).map(str) | st.floats().map(str)
         | st.sampled_from(["", "null", "NaN", "true", "2024-01-01", '"', ",", "\n", "\r\n"]))
HEADERS = st.sampled_from([["id", "text"], ["text"], ["text", "id", "x"], ["x", "text"]])


@st.composite
def csv_files(draw: st.DrawFn) -> bytes:
    header = draw(HEADERS)
    rows = draw(st.lists(st.lists(CELLS, min_size=len(header), max_size=len(header)),
                         max_size=8))
    out = io.StringIO()
    csv.writer(out).writerows([header, *rows])
    text = out.getvalue()
    if draw(st.booleans()):  # and a few bytes changed, cut or spliced in
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.text(max_size=4)) + text[at + draw(st.integers(0, 3)):]
    return text.encode("utf-8", "surrogatepass")


@given(csv_files() | st.binary(max_size=80))
def test_any_csv_file_becomes_embedded_or_refused_rows(encoder, data):
    try:
        columns = columns_of(io.BytesIO(data), "csv")
    except ValueError:  # the job refuses the file: its header cannot be read
        return
    if columns is None or "text" not in columns:  # empty, or refused (no text column)
        return
    embed_rows(encoder, read(data, "csv"))


COLUMNS = st.sampled_from([
    pa.array(["a", None, "", " ", "b"]),
    pa.array(["x", "y", "z", "w", "v"], pa.large_string()),
    pa.array(["a", "b", "a", None, "b"]).dictionary_encode(),
    pa.array([1, None, -(2**63), 2**63 - 1, 0]),
    pa.array([1.5, float("nan"), None, float("inf"), -0.0]),
    pa.array([b"a", b"\xff", None, b"", b"c"]),
    pa.array([True, False, None, True, False]),
    pa.array([None] * 5, pa.null()),
    pa.array([[1, 2], None, [], [3], [4]]),
    pa.array([{"a": 1}, None, {"a": 2}, {"a": 3}, {"a": 4}]),
    pa.array([0, 1, 2, 3, None], pa.timestamp("s")),
])


@given(text=COLUMNS, ids=st.none() | COLUMNS)
def test_any_parquet_columns_become_embedded_or_refused_rows(encoder, text, ids):
    columns = {"text": text} | ({} if ids is None else {"id": ids})
    sink = io.BytesIO()
    pq.write_table(pa.table(columns), sink)
    rows = read(sink.getvalue(), "parquet")
    assert rows.num_rows == len(text)
    embed_rows(encoder, rows)
