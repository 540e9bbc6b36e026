"""A bulk job's output as its pipeline streams it: each unit written, and published whole
as soon as the stream has moved past it, in the units' order.

The pipeline (Ray Data with ``preserve_order``, ``deployments/bulk.py``) yields tables of
embedded rows in order, each row tagged with its unit (``_unit``); ``UnitPublisher`` splits
them by unit (``by_unit``), writes each unit's rows (``blitz.bulk.write.UnitWriter``),
publishes a unit once rows of a later one arrive (or the stream ends), and keeps the
report, the progress bar (bytes of input, rows/s) and the log up to date.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TextIO

import numpy as np

from blitz.bulk.plan import BulkReport
from blitz.bulk.units import Unit
from blitz.bulk.write import UnitWriter


def by_unit(table: Any) -> list[tuple[int, Any]]:
    """``table``'s rows as (unit, rows) runs, in order."""
    units = table.column("_unit").to_numpy()
    if len(units) == 0:
        return []
    cuts = [0, *(np.flatnonzero(np.diff(units)) + 1).tolist(), len(units)]
    return [(int(units[a]), table.slice(a, b - a)) for a, b in zip(cuts, cuts[1:],
                                                                    strict=False)]


class UnitPublisher:
    """Writes and publishes ``pending``'s units from the pipeline's stream, in order."""

    def __init__(self, pending: list[Unit], writer: Callable[[Unit], UnitWriter],
                 job: dict[str, Any], report: BulkReport, started: float, bar: Any,
                 log: TextIO | None = None):
        self.by_index = {u.index: u for u in pending}
        self.order = [u.index for u in pending]
        self.writer, self.job, self.report = writer, job, report
        self.started, self.bar, self.log = started, bar, log
        self.writers: dict[int, UnitWriter] = {}
        self.credited: dict[int, int] = {}  # bytes of each open unit the bar has shown

    def add(self, table: Any) -> None:
        """One table of the stream: its rows written, the units it has moved past published."""
        for index, part in by_unit(table):
            if index not in self.order:
                raise RuntimeError(f"rows of unit {index} arrived after it was published")
            while self.order[0] != index:  # the stream has moved past it
                self._publish(self.order.pop(0))
            writer = self.writers.get(index)
            if writer is None:
                writer = self.writers[index] = self.writer(self.by_index[index])
            writer.add(part)
            seen = min(writer.offset, int(self.by_index[index].fingerprint["size"]))
            self.bar.update(seen - self.credited.get(index, 0))
            self.credited[index] = seen
            rows = self.report.rows_written + sum(w.rows for w in self.writers.values())
            self.bar.set_postfix_str(
                f"{rows} rows, {rows / max(time.perf_counter() - self.started, 1e-9):.0f} "
                "rows/s", refresh=False)

    def finish(self) -> None:
        """The stream has ended: every unit not yet published is (one with no rows too)."""
        while self.order:
            self._publish(self.order.pop(0))

    def close(self) -> None:
        """Close the writers of units left unpublished (the stream failed)."""
        for writer in self.writers.values():
            writer.close()

    def _publish(self, index: int) -> None:
        unit, report = self.by_index[index], self.report
        writer = self.writers.pop(index, None) or self.writer(unit)
        record = writer.publish(self.job)
        report.rows_written += record["rows"]
        report.refused_now += record["refused"]
        report.rows_total += record["rows"]
        self.bar.update(int(unit.fingerprint["size"]) - self.credited.pop(index, 0))
        report.timeline.append((time.perf_counter() - self.started, report.rows_written))
        if self.log is not None:
            elapsed = time.perf_counter() - self.started
            self.log.write(f"{unit.file}: {record['rows']} rows, {record['refused']} refused; "
                           f"{report.rows_written} rows this run, "
                           f"{report.rows_written / max(elapsed, 1e-9):.0f} rows/s\n")
