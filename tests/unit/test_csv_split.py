"""CSV files cut into whole rows (blitz/bulk/csv_split.py) before pyarrow parses them: a row of
any length up to ``max_row_bytes`` is read, a longer one is refused alone, and whatever
the cut, the rows and cells are those pyarrow reads from the whole file in one block."""

from __future__ import annotations

import csv
import io

import pyarrow as pa
import pyarrow.csv as pa_csv
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blitz.bulk import csv_split
from blitz.bulk.csv_split import LongRow, RowSplitter, Segment
from blitz.bulk.read import ROWS, read_rows
from tests.unit.test_fuzz_codecs import MAX_RATIO, cost_ratio

MIB = 1 << 20


def read(data: bytes, max_row_bytes: int = 4 * MIB, batch_rows: int = 4) -> pa.Table:
    tables = list(read_rows(io.BytesIO(data), "csv", 0, text_column="text", id_column="id",
                            batch_rows=batch_rows, max_row_bytes=max_row_bytes))
    assert all(t.schema.equals(ROWS) for t in tables)
    return pa.concat_tables(tables) if tables else ROWS.empty_table()


def csv_bytes(rows: list[list[str]]) -> bytes:
    out = io.StringIO()
    csv.writer(out).writerows(rows)
    return out.getvalue().encode()


def test_a_cell_longer_than_a_block_is_read_and_so_are_the_rows_after_it():
    # row 5 holds 2 MiB (under --max-row-bytes 4 MiB): pyarrow's 1 MiB blocks must not
    # lose rows 6-10
    long = "x" * (2 * MIB)
    data = csv_bytes([["id", "text"]] + [[str(i), long if i == 5 else f"text {i}"]
                                         for i in range(1, 11)])
    rows = read(data)
    assert rows.column("_id_int").to_pylist() == list(range(1, 11))
    assert rows.column("_refused").to_pylist() == [""] * 10
    assert rows.column("_text").to_pylist()[4] == long


def test_a_row_longer_than_the_limit_is_refused_alone():
    data = csv_bytes([["id", "text"], ["1", "a"], ["2", "y" * (5 * MIB)], ["3", "c"],
                      ["4", "d,\n\"quoted\""]])
    rows = read(data)
    assert rows.column("_refused").to_pylist() == [
        "", f"row longer than {4 * MIB} bytes", "", ""]
    assert rows.column("_row").to_pylist() == [0, 1, 2, 3]
    assert rows.column("_line").to_pylist()[1] == 3  # the header is row 1
    assert rows.column("_text").to_pylist() == ["a", "", "c", 'd,\n"quoted"']


def test_a_long_row_is_skipped_without_being_held():
    splitter = RowSplitter(io.BytesIO(b"text\n" + b"z" * (3 * MIB) + b"\nlast\n"), 1000,
                           chunk=4096)
    pieces = list(splitter)
    assert splitter.header == b"text\n"
    assert isinstance(pieces[0], LongRow) and pieces[0].number == 2
    assert isinstance(pieces[1], Segment) and pieces[1].data == b"last\n"
    assert pieces[1].first == 3


def test_rows_are_cut_at_line_ends_outside_quotes_only():
    data = (b'\xef\xbb\xbf"id","text"\r\n1,"a\r\nb"\r\n\r\n2,c""d\n3,"e""\nf"\n'
            b'4,"g"h"i\n5,last')
    for chunk in (3, 4, 1000):  # a chunk may end between \r and \n
        splitter = RowSplitter(io.BytesIO(data), 1000, chunk=chunk)
        rows = [p for p in splitter if isinstance(p, Segment)]
        assert splitter.header.rstrip(b"\r\n") == b'\xef\xbb\xbf"id","text"'
        assert b"".join(r.data for r in rows).replace(b"\r\n", b"\n") == (
            b'1,"a\nb"\n2,c""d\n3,"e""\nf"\n4,"g"h"i\n5,last')
    assert read(data).column("_text").to_pylist() == ["a\r\nb", 'c""d', 'e"\nf', 'gh"i',
                                                      "last"]


def test_a_quoted_first_header_cell_after_a_bom_is_read_as_quoted():
    # the byte before the cell's quote is the BOM's, and must not keep the quote from
    # opening it: else a line end inside it cuts the header, a comma then a quote opens a
    # false one
    for header in ('"id\nnumber",text', '"a,""b""",text'):
        data = b"\xef\xbb\xbf" + f"{header}\n1,first\n2,second\n".encode()
        for chunk in (1, 2, 3, 4, 5, 1000):
            splitter = RowSplitter(io.BytesIO(data), 1000, chunk=chunk)
            rows = [p for p in splitter if isinstance(p, Segment)]
            assert splitter.header == b"\xef\xbb\xbf" + f"{header}\n".encode()
            assert b"".join(r.data for r in rows) == b"1,first\n2,second\n"
        assert csv_split.csv_columns(io.BytesIO(data)) == [
            "id\nnumber" if "\n" in header else 'a,"b"', "text"]
        assert read(data).column("_text").to_pylist() == ["first", "second"]


def test_a_header_longer_than_a_chunk_is_not_a_header():
    from blitz.bulk.read import columns_of

    with pytest.raises(ValueError, match="longer than"):
        columns_of(io.BytesIO(b"text" * MIB + b"\na\n"), "csv")
    assert columns_of(io.BytesIO(b"\n\r\n"), "csv") is None
    assert columns_of(io.BytesIO(b"id,text\n"), "csv") == ["id", "text"]


# --- against pyarrow on the whole file ----------------------------------------------------

def reference(data: bytes) -> tuple[list[bytes | None], int] | None:
    """pyarrow's reading of ``data`` in one block: the text cells and the rows it skips
    (None when it cannot read the file at all)."""
    skipped = []

    def invalid(row):
        skipped.append(row.number)
        return "skip"

    try:
        table = pa_csv.read_csv(
            io.BytesIO(data), read_options=pa_csv.ReadOptions(block_size=len(data) + 1,
                                                              use_threads=False),
            parse_options=pa_csv.ParseOptions(newlines_in_values=True,
                                              invalid_row_handler=invalid),
            convert_options=pa_csv.ConvertOptions(
                include_columns=["text"], column_types={"text": pa.large_binary()},
                strings_can_be_null=False, quoted_strings_can_be_null=False))
    except (pa.ArrowInvalid, pa.ArrowKeyError, ValueError):
        return None
    if "text" not in table.column_names:
        return None
    return table.column("text").to_pylist(), len(skipped)


CELL = (st.text(alphabet=st.sampled_from('ab",\r\n é'), max_size=12)
        | st.integers(0, 40).map(lambda n: "w" * n))


@st.composite
def csv_files(draw: st.DrawFn) -> bytes:
    header = draw(st.sampled_from([["text"], ["id", "text"], ["text", "other"]]))
    rows = draw(st.lists(st.lists(CELL, min_size=len(header), max_size=len(header)),
                         max_size=10))
    out = io.StringIO()
    csv.writer(out, lineterminator=draw(st.sampled_from(["\n", "\r\n"]))).writerows(
        [header, *rows])
    text = out.getvalue()
    for _ in range(draw(st.integers(0, 2))):  # a few bytes changed, cut or spliced in
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.text(alphabet='a",\r\n', max_size=3)) + text[
            at + draw(st.integers(0, 2)):]
    return text.encode()


@settings(max_examples=400, deadline=None)
@given(data=csv_files(), chunk=st.integers(1, 24))
def test_cut_anywhere_the_rows_are_what_pyarrow_reads_in_one_block(data, chunk):
    expected = reference(data)
    if expected is None:
        return
    texts, skipped = expected
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(csv_split, "CHUNK", chunk)  # block boundaries everywhere
        rows = read(data, max_row_bytes=1 << 16)
    row = rows.column("_row").to_pylist()
    got = [(t.encode() if not r else None, r)
           for t, r, n in zip(rows.column("_text").to_pylist(),
                              rows.column("_refused").to_pylist(), row, strict=True) if n >= 0]
    assert len(got) == len(texts)
    for (text, reason), cell in zip(got, texts, strict=True):
        if not reason:
            assert text == cell
    assert row.count(-1) == skipped


@settings(max_examples=200, deadline=None)
@given(data=csv_files(), limit=st.integers(1, 40))
def test_long_rows_cost_only_themselves(data, limit):
    """With a tiny limit, every row is read or refused as too long, and the rest of the
    file is still read."""
    if reference(data) is None:
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(csv_split, "CHUNK", 7)
        rows = read(data, max_row_bytes=limit + 100)
        short = read(data, max_row_bytes=limit)
    long = [r.startswith("row longer") for r in short.column("_refused").to_pylist()]
    kept = [t for t, is_long, n in zip(short.column("_text").to_pylist(), long,
                                       short.column("_row").to_pylist(), strict=True)
            if not is_long and n >= 0]
    every = iter(t for t, n in zip(rows.column("_text").to_pylist(),
                                   rows.column("_row").to_pylist(), strict=True) if n >= 0)
    assert all(text in every for text in kept)  # in order: only the long rows are missing


def test_cutting_costs_linear_time():
    def file(n: int) -> bytes:
        return b"id,text\n" + b'1,"a ""quoted"" cell, with\nlines"\n' * n + b"2," + b"x" * n

    assert cost_ratio(file, lambda data: list(RowSplitter(io.BytesIO(data), 1 << 30)),
                      20_000) <= MAX_RATIO
