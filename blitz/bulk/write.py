"""Writing a bulk unit: its rows into Parquet and its refusals into ``_errors.jsonl``
under the attempt's directory, then published into OUTPUT whole, record last (see
``blitz.bulk.units`` for the layout and the rules)."""

from __future__ import annotations

import json
import os
import posixpath
import uuid
from typing import Any

import pyarrow as pa

from blitz.bulk.units import (
    DONE,
    PART,
    PUBLISHING,
    RECORD_FORMAT,
    ROW_GROUP,
    UNIT_ERRORS,
    Unit,
    is_local,
    remove_recorded,
)


class UnitWriter:
    """One unit's rows as they arrive: good rows to a Parquet part (row groups of
    ``ROW_GROUP``), refused rows to the unit's errors file, both in the attempt's
    directory until ``publish``."""

    def __init__(self, fs: Any, staging: str, unit: Unit, id_column: str,
                 metadata: dict[bytes, bytes]):
        self.fs, self.staging, self.unit = fs, staging, unit
        self.id_column, self.metadata = id_column, metadata
        self.rows = self.refused = 0
        self.pending: list[pa.Table] = []
        self.held = 0
        self.writer: Any = None
        self.sink: Any = None
        self.errors: Any = None
        self.id_kind: int | None = None
        self.offset = 0
        fs.makedirs(staging, exist_ok=True)

    def add(self, table: pa.Table) -> None:
        """Rows of this unit as the encoder returned them (``blitz.bulk.job.PASSED`` columns and its outputs)."""
        import pyarrow.compute as pc

        if table.num_rows:
            self.offset = max(self.offset, int(pc.max(table.column("_offset")).as_py()))
        refused = pc.not_equal(table.column("_refused"), "")
        bad = table.filter(refused)
        if bad.num_rows:
            self._refuse(bad)
        good = table.filter(pc.invert(refused))
        if good.num_rows:
            self.pending.append(self._output(good))
            self.held += good.num_rows
            self.rows += good.num_rows
            if self.held >= ROW_GROUP:
                self._flush()

    def _output(self, good: pa.Table) -> pa.Table:
        from blitz.bulk.read import ID_STR

        kinds = set(good.column("_id_kind").to_pylist())
        kind = ID_STR if ID_STR in kinds else min(kinds)
        if self.id_kind is None:
            self.id_kind = kind
        if kind != self.id_kind or len(kinds) > 1 and ID_STR in kinds:
            raise RuntimeError(f"{self.unit.file}: rows with two kinds of id")
        ids = good.column("_id_str" if kind == ID_STR else "_id_int")
        table = pa.table({self.id_column: ids, "embedding": good.column("embedding"),
                          "tokens": good.column("tokens")})
        return table.replace_schema_metadata(self.metadata)

    def _flush(self) -> None:
        if not self.pending:
            return
        import pyarrow.parquet as pq

        table = pa.concat_tables(self.pending).combine_chunks()
        if self.writer is None:
            self.sink = self.fs.open(f"{self.staging}/{PART}", "wb")
            self.writer = pq.ParquetWriter(self.sink, table.schema)
        self.writer.write_table(table, row_group_size=max(table.num_rows, 1))
        self.pending, self.held = [], 0

    def _refuse(self, bad: pa.Table) -> None:
        if self.errors is None:
            self.errors = self.fs.open(f"{self.staging}/{UNIT_ERRORS}", "wb")
        ids = [s if k == 2 else i for s, i, k in zip(
            bad.column("_id_str").to_pylist(), bad.column("_id_int").to_pylist(),
            bad.column("_id_kind").to_pylist(), strict=True)]
        sources = (bad.column("_source").to_pylist() if "_source" in bad.column_names
                   else [""] * bad.num_rows)  # an image row: its image's path or URI
        for ident, row, line, reason, source in zip(
                ids, bad.column("_row").to_pylist(), bad.column("_line").to_pylist(),
                bad.column("_refused").to_pylist(), sources, strict=True):
            entry = {"id": ident, "reason": reason, "file": self.unit.url,
                     "row": row if row >= 0 else None}
            if line >= 0:
                entry["line"] = line
            if source:  # a chunk's row is its image file; a table's row names one
                entry["file" if self.unit.members is not None else "image"] = source
                if self.unit.members is not None:
                    entry["row"] = None  # its place in a chunk means nothing to a reader
            self.errors.write(json.dumps(entry).encode() + b"\n")
        self.refused += bad.num_rows

    def close(self) -> list[str]:
        """Finish the files; returns their names."""
        self._flush()
        names = []
        if self.writer is not None:
            self.writer.close()
            self.sink.close()
            names.append(PART)
        if self.errors is not None:
            self.errors.close()
            names.append(UNIT_ERRORS)
        return names

    def publish(self, job: dict[str, Any]) -> dict[str, Any]:
        """Move the unit into OUTPUT with its record last; returns the record."""
        names = self.close()
        unit = self.unit
        record = {"format": RECORD_FORMAT, "input": unit.fingerprint, "file": unit.url,
                  "job": job, "rows": self.rows, "refused": self.refused, "files": names}
        if unit.stale is not None:
            remove_recorded(self.fs, unit.directory, unit.stale)
        body = json.dumps(record, indent=1).encode() + b"\n"
        if is_local(self.fs) and not self.fs.exists(unit.directory):
            with self.fs.open(f"{self.staging}/{DONE}", "wb") as out:
                out.write(body)
            os.rename(self.staging, unit.directory)  # the unit appears whole, at once
            return record
        self.fs.makedirs(unit.directory, exist_ok=True)
        with self.fs.open(f"{unit.directory}/{PUBLISHING}", "wb") as out:
            out.write(body)
        for name in names:
            self.fs.mv(f"{self.staging}/{name}", f"{unit.directory}/{name}")
        with self.fs.open(f"{unit.directory}/{DONE}", "wb") as out:
            out.write(body)
        self.fs.rm_file(f"{unit.directory}/{PUBLISHING}")
        return record


def merge_errors(fs: Any, unit_dirs: list[str], target: str) -> int:
    """Write every unit's refused rows to ``target`` (through a temporary name, so a
    reader never sees half of it); returns how many there are."""
    count = 0
    parent = posixpath.dirname(target)
    if parent:
        fs.makedirs(parent, exist_ok=True)
    partial = posixpath.join(parent, f".{posixpath.basename(target)}.{uuid.uuid4().hex[:8]}")
    with fs.open(partial, "wb") as out:
        for unit_dir in unit_dirs:
            part = f"{unit_dir}/{UNIT_ERRORS}"
            if fs.exists(part):
                body = fs.cat_file(part)
                count += body.count(b"\n")
                out.write(body)
    fs.mv(partial, target)
    return count
