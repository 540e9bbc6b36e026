"""Property-based tests of the bulk job's row readers (blitz/bulk.py) on arbitrary files.

Every line or row of a JSONL, CSV or Parquet file ends as an embedded row or as a refused
one with a reason (errors.jsonl): no content makes a reader or the batch step raise. The
file-level refusals are Ray Data's readers' (``read_text`` decodes the whole file as
UTF-8; pyarrow's CSV reader refuses a row with another number of cells, or a header that
is not UTF-8) and the job's check that the text column exists.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from blitz.bulk import (
    LINE,
    REFUSED,
    BatchEncoder,
    JsonLines,
    RowNumberer,
    error_lines,
    first_json_row,
)
from blitz.config import BulkSettings
from blitz.registry import ModelSpec
from tests.unit.test_fuzz_codecs import MAX_RATIO, cost_ratio

FAKE = ModelSpec(id="fake", source="fake:4")
_files = itertools.count()


@pytest.fixture(scope="module")
def encoder() -> BatchEncoder:
    return BatchEncoder(FAKE, BulkSettings())


def embed_rows(encoder: BatchEncoder, batch: dict[str, np.ndarray], rows: int) -> None:
    """The job's batch step on ``batch``: every row is embedded or refused with a reason,
    and the refused ones make an errors file."""
    table, refused = encoder.encode(batch)
    assert table.num_rows + len(refused) == rows
    assert all(isinstance(r.reason, str) and r.reason for r in refused)
    for line in error_lines(refused, "in.jsonl").splitlines():
        assert set(json.loads(line)) == {"id", "reason", "file"}


def numpy_batch(table: pa.Table) -> dict[str, np.ndarray]:
    """``table`` as Ray Data's numpy batches hold it (a column of nulls is NaN)."""
    return {name: (np.full(len(column), np.nan, np.float32) if pa.types.is_null(column.type)
                   else column.combine_chunks().to_numpy(zero_copy_only=False))
            for name, column in zip(table.column_names, table.columns, strict=True)}


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


def read_lines(data: bytes) -> list[str]:
    """``data``'s lines as Ray Data's ``read_text`` gives them (it fails the whole file on
    bytes that are not UTF-8; here they arrive as lone surrogates instead)."""
    text = data.decode("utf-8", "surrogateescape")
    return [line for line in text.splitlines() if line.strip()]


@given(JSONL)
def test_any_json_lines_file_becomes_embedded_or_refused_rows(encoder, data):
    fs = fsspec.filesystem("memory")
    path = f"/fuzz-bulk/{next(_files)}.jsonl"
    fs.pipe(path, data)
    try:
        first = first_json_row(fs, path)
    finally:
        fs.rm(path)
    assert isinstance(first, dict)
    lines = read_lines(data)
    rows = JsonLines("text", "id", first)({"text": np.array(lines, dtype=object),
                                            LINE: np.arange(len(lines))})
    assert len(rows["id"]) == len(rows["text"]) == len(rows[REFUSED]) == len(lines)
    embed_rows(encoder, rows, len(lines))


@given(st.lists(LINES, max_size=8), st.sampled_from([{}, {"id": 1}, {"id": "a"}]))
def test_json_lines_as_bytes_are_read_as_lines_of_text(lines, first):
    reader = JsonLines("text", "id", first)
    as_text = reader({"text": np.array(lines, dtype=object), LINE: np.arange(len(lines))})
    raw = [line.encode("utf-8", "surrogatepass") for line in lines]
    as_bytes = reader({"text": np.array(raw, dtype=object), LINE: np.arange(len(lines))})
    assert as_bytes[REFUSED].tolist() == as_text[REFUSED].tolist()


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


@pytest.mark.parametrize("family", list(LINE_FAMILIES))
def test_reading_a_line_costs_linear_time(family):
    reader = JsonLines("text", "id", {"id": 1})

    def batch(n: int) -> dict[str, np.ndarray]:
        return {"text": np.array([LINE_FAMILIES[family](n)], dtype=object), LINE: np.arange(1)}

    assert cost_ratio(batch, reader, LINE_SIZES[family]) <= MAX_RATIO


def test_reading_many_lines_costs_linear_time():
    reader = JsonLines("text", "id", {"id": 1})
    lines = ['{"id": 1, "text": "a"}', "[" * 50, "bad", '{"text": "\\ud800"}',
             '{"id": 1180591620717411303424, "text": "a"}']

    def batch(n: int) -> dict[str, np.ndarray]:
        return {"text": np.array(lines * n, dtype=object), LINE: np.arange(len(lines) * n)}

    assert cost_ratio(batch, reader, 200) <= MAX_RATIO


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
        table = pa_csv.read_csv(io.BytesIO(data))
        names = table.column_names
    except (pa.ArrowInvalid, UnicodeDecodeError):  # the reader fails the file: a row of
        return  # another length, a header that is not UTF-8
    if "text" not in names:  # the job refuses the file (InvalidValue)
        return
    batch = numpy_batch(table.select(["text", *(["id"] if "id" in names else [])]))
    if "id" not in batch:
        batch = RowNumberer("id")(batch)
    embed_rows(encoder, batch, table.num_rows)


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
    batch = numpy_batch(pq.read_table(io.BytesIO(sink.getvalue())))
    if "id" not in batch:
        batch = RowNumberer("id")(batch)
    embed_rows(encoder, batch, len(text))
