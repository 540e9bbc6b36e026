"""Bulk inputs read row by row: every line or row of a file ends as a row with a text to
embed or as a row refused with its reason. Only I/O errors raise.

A reader turns one file (JSON lines, CSV or Parquet, opened through fsspec) into Arrow
tables of at most ``batch_rows`` rows with the columns of ``ROWS``:

    _unit     the file's index in the job (every table holds one file's rows)
    _row      the row's position in its file (JSON lines: among the non-blank lines)
    _line     the 1-based line of a JSON line or of a malformed CSV row; -1 otherwise
    _id_int   the id when ``_id_kind`` is ``ID_INT`` (or the position, ``ID_POSITION``)
    _id_str   the id when ``_id_kind`` is ``ID_STR``
    _text     the text to embed ("" when refused)
    _refused  why the row is refused ("" when it is not)
    _offset   how far into the file the reader was (bytes, an estimate for progress)

Ids keep the type a file gives them: integers stay integers, anything else becomes a
string, and a file without the id column numbers its rows. Within one file every good
row has the same kind of id (a row whose id does not fit is refused, with its position).
Each reader's work is linear in its file's size: lines and cells over ``max_row_bytes``
are refused without being held whole.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from blitz.bulk.csv_split import (
    CHUNK,
    LongRow,
    RowSplitter,
    Segment,
    csv_columns,
    header_names,
    parse_rows,
)

ID_POSITION, ID_INT, ID_STR = 0, 1, 2
ROWS = pa.schema([("_unit", pa.int32()), ("_row", pa.int64()), ("_line", pa.int64()),
                  ("_id_int", pa.int64()), ("_id_str", pa.string()), ("_id_kind", pa.int8()),
                  ("_text", pa.string()), ("_refused", pa.string()), ("_offset", pa.int64())])
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def refusal(value: Any) -> str | None:
    """Why a text cannot be embedded, or None when it can."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "null text"  # pandas and numpy write a missing value as NaN
    if not isinstance(value, str):
        return f"not a string ({type(value).__name__})"
    if not value.strip():
        return "empty text"
    return None


class Rows:
    """Collects one file's rows and hands them out as tables of ``batch_rows``."""

    def __init__(self, unit: int, batch_rows: int):
        self.unit, self.batch_rows = unit, batch_rows
        self.offset = 0  # set by the reader as it goes
        self.columns: dict[str, list[Any]] = {name: [] for name in ROWS.names[1:-1]}

    def add(self, row: int, line: int, kind: int, ident: Any, text: str | None,
            reason: str | None) -> None:
        c = self.columns
        c["_row"].append(row)
        c["_line"].append(line)
        c["_id_kind"].append(kind)
        c["_id_int"].append(ident if kind != ID_STR else 0)
        c["_id_str"].append(ident if kind == ID_STR else "")
        c["_text"].append(text if reason is None else "")
        c["_refused"].append(reason or "")

    def __len__(self) -> int:
        return len(self.columns["_row"])

    def full(self) -> bool:
        return len(self) >= self.batch_rows

    def take(self) -> pa.Table:
        rows = len(self)
        arrays = [pa.array([self.unit] * rows, pa.int32())] + [
            pa.array(self.columns[name], ROWS.field(name).type) for name in ROWS.names[1:-1]
        ] + [pa.array([self.offset] * rows, pa.int64())]
        self.columns = {name: [] for name in ROWS.names[1:-1]}
        return pa.Table.from_arrays(arrays, schema=ROWS)


def read_rows(f: Any, kind: str, unit: int, *, text_column: str, id_column: str,
              batch_rows: int, max_row_bytes: int) -> Iterator[pa.Table]:
    """The rows of the open binary file ``f`` of format ``kind`` (``json``, ``csv``,
    ``parquet``) as ``ROWS`` tables."""
    readers = {"json": _json_rows, "csv": _csv_rows, "parquet": _parquet_rows}
    rows = Rows(unit, batch_rows)
    for _ in readers[kind](f, rows, text_column, id_column, max_row_bytes):
        yield rows.take()
    if len(rows):
        yield rows.take()


# --- JSON lines -------------------------------------------------------------------------

def iter_lines(f: Any, max_bytes: int) -> Iterator[tuple[int, bytes | None]]:
    """(1-based line number, the line without its end) for each line of ``f``; the line is
    None when it is longer than ``max_bytes`` (its bytes are skipped, never joined)."""
    number, held, skipping = 0, 0, False
    parts: list[bytes] = []
    while data := f.read(CHUNK):
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            number += 1
            piece = data[start:end]
            if skipping or held + len(piece) > max_bytes:
                yield number, None
            else:
                yield number, b"".join([*parts, piece]).removesuffix(b"\r")
            parts, held, skipping, start = [], 0, False, end + 1
        if not skipping:
            held += len(data) - start
            parts.append(data[start:])
            if held > max_bytes:
                parts, held, skipping = [], 0, True
    if skipping or held:
        yield number + 1, None if skipping else b"".join(parts).removesuffix(b"\r")


def json_object(line: str | bytes) -> dict[str, Any] | None:
    """The JSON object on ``line``; None when the line is not JSON (undecodable, invalid,
    nested deeper than the parser goes) or holds another value. A byte-order mark before
    it is skipped, as ``json.loads`` skips it in bytes."""
    if isinstance(line, str):
        line = line.removeprefix("\ufeff")
    try:
        row = json.loads(line)
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are
        return None  # ValueErrors; json's C parser raises RecursionError at its depth limit
    return row if isinstance(row, dict) else None


def encodable(text: str) -> bool:
    """Whether ``text`` has a UTF-8 form (JSON's ``\\ud800`` escapes give lone surrogates)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class JsonRow:
    """One JSON line as (kind of id, id, text, reason). Ids keep the first object's type
    (int or str); a line without an id gets its position, and so does a line whose id
    does not fit that type (refused, with the reason)."""

    def __init__(self, text_column: str, id_column: str):
        self.text_column, self.id_column = text_column, id_column
        self.kind: int | None = None  # fixed by the first object

    def __call__(self, row: dict[str, Any] | None,
                 position: int) -> tuple[int, Any, str | None, str | None]:
        if row is None:
            return ID_POSITION, position, None, "not a JSON object"
        if self.kind is None:
            first_id = row.get(self.id_column)
            self.kind = ID_POSITION if first_id is None else (
                ID_INT if type(first_id) is int else ID_STR)
        text: Any = row.get(self.text_column)
        reason = refusal(text) or (None if encodable(text) else
                                   "text is not valid Unicode (a lone surrogate)")
        kind, ident = self.kind, row.get(self.id_column)
        if kind == ID_POSITION:
            ident = position
        elif kind == ID_INT:
            if type(ident) is not int:
                ident, reason = position, reason or "id is not an integer"
            elif not INT64_MIN <= ident <= INT64_MAX:
                ident, reason = position, reason or "id is outside the 64-bit integer range"
        elif ident is None:
            ident = str(position)
        elif type(ident) not in (str, int, float, bool):
            ident, reason = str(position), reason or "id is not a string or number"
        elif not encodable(str(ident)):
            ident, reason = str(position), reason or "id is not valid Unicode (a lone surrogate)"
        else:
            ident = str(ident)
        return kind, ident, (text if reason is None else None), reason


def _json_rows(f: Any, rows: Rows, text_column: str, id_column: str,
               max_row_bytes: int) -> Iterator[None]:
    parse = JsonRow(text_column, id_column)
    position = 0
    for number, line in iter_lines(f, max_row_bytes):
        rows.offset = f.tell()
        if line is None:
            rows.add(position, number, ID_POSITION, position, None,
                     f"line longer than {max_row_bytes} bytes")
        elif not line.strip():
            continue  # blank lines are not rows
        else:
            kind, ident, text, reason = parse(json_object(line), position)
            rows.add(position, number, kind, ident, text, reason)
        position += 1
        if rows.full():
            yield None


# --- CSV and Parquet: columns of cells --------------------------------------------------

def text_cells(column: pa.Array, max_bytes: int) -> list[tuple[str | None, str | None]]:
    """(text, reason) for each cell of a text column of any Arrow type."""
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    kind = column.type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)
            or pa.types.is_binary(kind) or pa.types.is_large_binary(kind)):
        return [(None, refusal(value) or f"not a string ({kind})")
                for value in column.to_pylist()]
    out: list[tuple[str | None, str | None]] = []
    for value in column.cast(pa.large_binary()).to_pylist():
        if value is None:
            out.append((None, "null text"))
        elif len(value) > max_bytes:
            out.append((None, f"text longer than {max_bytes} bytes"))
        else:
            try:
                text = value.decode("utf-8")
            except UnicodeDecodeError:
                out.append((None, "text is not valid UTF-8"))
                continue
            out.append((text, refusal(text)))
    return out


def id_cells(column: pa.Array | None, positions: range,
             kind: int | None) -> tuple[int, list[tuple[Any, str | None]]]:
    """(kind of id, [(id, reason)]) for a column of ids (None: the file has none).
    ``kind`` is the file's kind when an earlier batch fixed it."""
    if column is None:
        return ID_POSITION, [(p, None) for p in positions]
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if pa.types.is_integer(column.type):
        return ID_INT, [_int_id(v, p) for v, p in zip(column.to_pylist(), positions,
                                                       strict=True)]
    if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
        values = [_decoded(v) for v in column.to_pylist()]  # CSV cells: ints or strings
        if kind is None:
            kind = ID_INT if values and all(_as_int(v) is not None for v in values) else ID_STR
        if kind == ID_INT:
            return ID_INT, [_int_id(_as_int(v), p) for v, p in zip(values, positions,
                                                                    strict=True)]
        return ID_STR, [_str_id(v, p) for v, p in zip(values, positions, strict=True)]
    nested = pa.types.is_nested(column.type)
    return ID_STR, [(str(p), "id is not a string or number") if nested and v is not None
                    else _str_id(v, p) for v, p in zip(column.to_pylist(), positions,
                                                       strict=True)]


def _decoded(value: bytes | None) -> str | bool | None:
    if value is None:
        return None
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return False  # marks an undecodable id


def _as_int(value: Any) -> int | None:
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit() and len(value) < 30:
        return int(value)
    return None


def _int_id(value: Any, position: int) -> tuple[int, str | None]:
    if type(value) is not int:
        return position, "id is not an integer"
    if not INT64_MIN <= value <= INT64_MAX:
        return position, "id is outside the 64-bit integer range"
    return value, None


def _str_id(value: Any, position: int) -> tuple[str, str | None]:
    if value is None or value == "":
        return str(position), None
    if value is False:
        return str(position), "id is not valid UTF-8"
    if isinstance(value, bytes):
        decoded = _decoded(value)
        return (str(position), "id is not valid UTF-8") if decoded is False else (
            str(decoded), None)
    return str(value), None


def _add_cells(rows: Rows, table: pa.Table, first: int, text_column: str,
               id_column: str, kind: int | None, max_row_bytes: int) -> int:
    """Add a table of cells to ``rows``; returns the file's kind of id."""
    positions = range(first, first + table.num_rows)
    texts = text_cells(table.column(text_column).combine_chunks(), max_row_bytes)
    ids_column = (table.column(id_column).combine_chunks()
                  if id_column in table.column_names else None)
    kind, ids = id_cells(ids_column, positions, kind)
    for position, (text, reason), (ident, id_reason) in zip(positions, texts, ids,
                                                            strict=True):
        rows.add(position, -1, kind, ident, text, reason or id_reason)
    return kind


def _csv_rows(f: Any, rows: Rows, text_column: str, id_column: str,
              max_row_bytes: int) -> Iterator[None]:
    splitter = RowSplitter(f, max_row_bytes)
    pieces = iter(splitter)
    first = next(pieces, None)
    if splitter.header is None:  # an empty file, or only blank lines
        return
    names = header_names(splitter.header)
    wanted = [c for c in (text_column, id_column) if c in names]
    position, kind = 0, None
    for piece in itertools.chain([first] if first is not None else [], pieces):
        rows.offset = piece.offset
        if isinstance(piece, LongRow):
            rows.add(position, piece.number, ID_POSITION, position, None,
                     f"row longer than {max_row_bytes} bytes")
            position += 1
        else:
            for table in _segment_tables(piece, names, wanted, rows.batch_rows, rows):
                kind = _add_cells(rows, table, position, text_column, id_column, kind,
                                  max_row_bytes)
                position += table.num_rows
                if rows.full():
                    yield None
        if rows.full():
            yield None


def _segment_tables(segment: Segment, names: list[str], wanted: list[str], batch_rows: int,
                    rows: Rows) -> Iterator[pa.Table]:
    """The cells of a segment's rows in tables of ``batch_rows``; a row with another
    number of cells, or one pyarrow cannot parse, is added to ``rows`` as refused."""
    def refuse(number: int, reason: str) -> None:
        rows.add(-1, number, ID_POSITION, None, None, reason)

    try:
        table = parse_rows(segment.data, names, wanted, segment.first, refuse)
    except pa.ArrowInvalid:  # one row spoils the segment: parse each alone
        tables, at = [], 0
        for number, length in enumerate(segment.rows, segment.first):
            row = segment.data[at:at + length]
            at += length
            try:
                tables.append(parse_rows(row, names, wanted, number, refuse))
            except pa.ArrowInvalid as exc:
                refuse(number, f"row is not CSV ({exc})")
        table = pa.concat_tables(tables) if tables else None
    if table is not None:
        for start in range(0, table.num_rows, batch_rows):
            yield table.slice(start, batch_rows)


def _parquet_rows(f: Any, rows: Rows, text_column: str, id_column: str,
                  max_row_bytes: int) -> Iterator[None]:
    import pyarrow.parquet as pq

    source = pq.ParquetFile(f)
    names = source.schema_arrow.names
    wanted = [c for c in (text_column, id_column) if c in names]
    position, kind = 0, None
    size, total = getattr(f, "size", 0) or 0, max(source.metadata.num_rows, 1)
    for batch in source.iter_batches(batch_size=rows.batch_rows, columns=wanted):
        kind = _add_cells(rows, pa.Table.from_batches([batch]), position, text_column,
                          id_column, kind, max_row_bytes)
        position += batch.num_rows
        rows.offset = size * position // total
        if rows.full():
            yield None


def columns_of(f: Any, kind: str) -> list[str] | None:
    """The column names of a CSV or Parquet file (None: JSON lines, or an empty CSV)."""
    if kind == "csv":
        return csv_columns(f)
    if kind == "parquet":
        import pyarrow.parquet as pq

        return list(pq.ParquetFile(f).schema_arrow.names)
    return None
