"""A CSV stream cut into whole rows before any parser sees it.

pyarrow's CSV reader needs every row inside one block and gives up on the rest of a file
at the first row longer than a block. Cut here first, each row reaches it whole and alone
in size: rows come out in ``Segment``s of about ``chunk`` bytes, and a row longer than
``max_row_bytes`` comes out as a ``LongRow`` whose bytes were skipped, never held. The
cut follows pyarrow's default dialect (``,`` between cells, ``"`` quoting when it opens
a cell, ``""`` a quote inside one, a row ending at ``\\n``, ``\\r`` or ``\\r\\n`` outside
quotes), so a cell may hold line ends. One pass, linear in the file's size.

Rows are numbered as pyarrow numbers them: the header is row 1 and blank lines do not
count. ``parse_rows`` then hands whole rows to pyarrow (one block each time), a row with
the wrong number of cells to a callback; ``csv_columns`` reads a file's header alone.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

CHUNK = 1 << 20
_OPEN = re.compile(rb'["\n\r]')  # outside quotes: what can open a quote or end a row
_CELL_START = b',\n\r'
_BLANK = frozenset({b"", b"\n", b"\r", b"\r\n"})
_BOM = b"\xef\xbb\xbf"


@dataclass
class Segment:
    data: bytes  # whole rows, each ending where it ended in the file
    first: int  # the number of its first row
    rows: list[int]  # each row's length in bytes, in order
    offset: int  # bytes of the file read so far


@dataclass
class LongRow:
    number: int
    size: int  # at least this many bytes
    offset: int


Piece = Segment | LongRow


class RowSplitter:
    """``iter(RowSplitter(f, max_row_bytes))``: the data rows as pieces, once the first
    row is read as ``header`` (None for a file without rows; a header longer than the
    limit comes out as the only piece, a ``LongRow``)."""

    def __init__(self, f: Any, max_row_bytes: int, chunk: int | None = None):
        self.f, self.max_row_bytes, self.chunk = f, max_row_bytes, chunk or CHUNK
        self.header: bytes | None = None

    def __iter__(self) -> Iterator[Piece]:
        rows = self._rows()
        for number, row, size, offset in rows:
            if row is None:  # a header too long to read: nothing after it can be
                yield LongRow(number, size, offset)
                return
            self.header = row
            break
        parts: list[bytes] = []
        lengths: list[int] = []
        held, first, offset = 0, 0, 0
        for number, row, size, offset in rows:
            if row is None:
                if parts:
                    yield Segment(b"".join(parts), first, lengths, offset)
                    parts, lengths, held = [], [], 0
                yield LongRow(number, size, offset)
                continue
            if not parts:
                first = number
            parts.append(row)
            lengths.append(len(row))
            held += len(row)
            if held >= self.chunk:
                yield Segment(b"".join(parts), first, lengths, offset)
                parts, lengths, held = [], [], 0
        if parts:
            yield Segment(b"".join(parts), first, lengths, offset)

    def _rows(self) -> Iterator[tuple[int, bytes | None, int, int]]:
        """(row number, the row's bytes or None when longer than the limit, its size,
        bytes read so far) for each row that is not blank."""
        limit = self.max_row_bytes
        number, read = 0, 0
        quoted, quote_at_end = False, False
        previous = ord("\n")  # the byte before the chunk: a quote at the start opens a cell
        held: list[bytes] = []  # the current row's bytes from earlier chunks
        size, skipping = 0, False
        first_chunk = True
        while data := self.f.read(self.chunk):
            floor = 0  # a quote at this index opens a cell whatever byte comes before it
            if first_chunk:
                first_chunk = False
                while len(data) < len(_BOM) and _BOM.startswith(data) and (
                        more := self.f.read(self.chunk)):
                    data += more  # a chunk shorter than a BOM: enough to tell
                if data.startswith(_BOM):
                    floor = len(_BOM)  # the first cell starts after the BOM
            read += len(data)
            start, pos = 0, floor  # start: where the current row (the BOM's too) begins here
            if quote_at_end:  # a quote ended the last chunk inside a quoted cell
                quote_at_end = False
                if data[:1] == b'"':
                    pos = max(pos, 1)  # "" : a quote inside the cell
                else:
                    quoted = False
            end = len(data)
            while pos < end:
                if quoted:
                    at = data.find(b'"', pos)
                    if at < 0:
                        pos = end
                    elif at + 1 == end:
                        quote_at_end, pos = True, end
                    elif data[at + 1] == 0x22:
                        pos = at + 2
                    else:
                        quoted, pos = False, at + 1
                    continue
                match = _OPEN.search(data, pos)
                if match is None:
                    pos = end
                    continue
                at = match.start()
                if data[at] == 0x22:  # a quote opens a cell only at the cell's start
                    before = data[at - 1] if at > floor else previous
                    quoted = before in _CELL_START
                    pos = at + 1
                    continue
                row_end = at + 1
                if data[at] == 0x0D and at + 1 < end and data[at + 1] == 0x0A:
                    row_end = at + 2
                size += row_end - start
                if skipping or size > limit:
                    number += 1
                    yield number, None, size, read
                elif held:
                    row = b"".join([*held, data[start:row_end]])
                    if row not in _BLANK:
                        number += 1
                        yield number, row, size, read
                else:
                    row = data[start:row_end]
                    if row not in _BLANK:
                        number += 1
                        yield number, row, size, read
                held, size, skipping = [], 0, False
                start = pos = row_end
            if start < end:  # the row goes on in the next chunk
                size += end - start
                if not skipping:
                    if size > limit:
                        held, skipping = [], True
                    else:
                        held.append(data[start:])
            if end > floor:
                previous = data[-1]
        if size:  # the last row, without a line end
            if skipping or size > limit:
                yield number + 1, None, size, read
            else:
                row = b"".join(held)
                if row.strip(b"\r\n"):
                    yield number + 1, row, size, read


# --- parsed by pyarrow -------------------------------------------------------------------

def parse_rows(data: bytes, names: list[str], wanted: list[str], first: int,
               refuse: Callable[[int, str], None]) -> pa.Table:
    """Whole CSV rows without the header, the first numbered ``first``: the ``wanted``
    columns as binary cells; a row with another number of cells than ``names`` goes to
    ``refuse(number, reason)`` instead."""
    import pyarrow.csv as pa_csv

    def invalid(row: Any) -> str:
        number = first + row.number - 1 if row.number is not None else -1
        refuse(number, f"row has {row.actual_columns} cells, the header "
                       f"{row.expected_columns}")
        return "skip"

    return pa_csv.read_csv(
        io.BytesIO(data),
        read_options=pa_csv.ReadOptions(column_names=names, block_size=len(data) + 1,
                                        use_threads=False),
        parse_options=pa_csv.ParseOptions(newlines_in_values=True, invalid_row_handler=invalid),
        convert_options=pa_csv.ConvertOptions(
            include_columns=wanted, column_types={c: pa.large_binary() for c in wanted},
            strings_can_be_null=False, quoted_strings_can_be_null=False))


def header_names(header: bytes) -> list[str]:
    """The column names of a header row; ``ValueError`` when it is not one."""
    import pyarrow.csv as pa_csv

    try:
        reader = pa_csv.open_csv(io.BytesIO(header), read_options=pa_csv.ReadOptions(
            block_size=len(header) + 1, use_threads=False),
            parse_options=pa_csv.ParseOptions(newlines_in_values=True))
    except pa.ArrowInvalid as exc:
        raise ValueError(f"not a CSV header: {exc}") from exc
    return list(reader.schema.names)


def csv_columns(f: Any) -> list[str] | None:
    """The header of a CSV file (None when the file is empty); raises ``ValueError``
    when it is not one (not UTF-8, not CSV, longer than ``CHUNK``)."""
    splitter = RowSplitter(f, CHUNK)
    first = next(iter(splitter), None)
    if isinstance(first, LongRow) and splitter.header is None:
        raise ValueError(f"not a CSV header: its first row is longer than {CHUNK} bytes")
    return None if splitter.header is None else header_names(splitter.header)
