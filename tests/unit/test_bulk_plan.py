"""A bulk job's planning and in-order publishing (blitz.bulk.plan, blitz.bulk.publish),
without Ray: the pipeline here is the same readers and batch encoder run in process, the
stream a list of tables in order."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from blitz.bulk.job import BatchEncoder, output_metadata
from blitz.bulk.plan import BulkPlan, BulkReport
from blitz.bulk.publish import UnitPublisher, by_unit
from blitz.bulk.read import read_rows
from blitz.bulk.units import Unit
from blitz.bulk.write import UnitWriter
from blitz.errors import InvalidValue
from blitz.settings.bulk import BulkSettings
from blitz.settings.config import BlitzSettings

SETTINGS = BlitzSettings.from_args({"models": [{"id": "fake", "source": "fake:8"}]})


class Bar:
    """Stands in for tqdm: the bytes credited."""

    def __init__(self):
        self.total = 0

    def update(self, n):
        self.total += n

    def set_postfix_str(self, *_, **__):
        pass


class Writer:
    """Stands in for UnitWriter: the rows added, published once."""

    def __init__(self, unit, events):
        self.unit, self.events = unit, events
        self.rows = self.offset = 0
        self.closed = False

    def add(self, table):
        self.rows += table.num_rows
        self.offset = max(self.offset, max(table.column("_offset").to_pylist()))

    def publish(self, job):
        self.events.append(("publish", self.unit.index, self.rows))
        return {"rows": self.rows, "refused": 1}

    def close(self):
        self.closed = True


def unit(index, size=100) -> Unit:
    return Unit(index=index, file=f"/in/{index}.jsonl", url=f"/in/{index}.jsonl", kind="json",
                directory=f"/out/{index}", fingerprint={"size": size, "version": "v"})


def rows(*units: int) -> pa.Table:
    return pa.table({"_unit": list(units), "_offset": [10 * (i + 1) for i in range(len(units))]})


def test_by_unit_cuts_a_table_into_runs_of_one_unit():
    runs = by_unit(rows(0, 0, 1, 1, 1, 3))
    assert [(i, t.num_rows) for i, t in runs] == [(0, 2), (1, 3), (3, 1)]
    assert by_unit(rows()) == []


def test_units_are_published_in_order_as_soon_as_the_stream_moves_past_them():
    events: list = []
    writers: dict[int, Writer] = {}

    def writer(u):
        writers[u.index] = Writer(u, events)
        return writers[u.index]

    report, bar, log = BulkReport(), Bar(), io.StringIO()
    publisher = UnitPublisher([unit(0), unit(1), unit(2), unit(3)], writer, {"model": "m"},
                              report, 0.0, bar, log)
    publisher.add(rows(0, 0))
    assert events == []  # unit 0 may get more rows
    publisher.add(rows(0, 2, 2))  # past 0, and past 1, which had no rows
    assert events == [("publish", 0, 3), ("publish", 1, 0)]
    with pytest.raises(RuntimeError, match="unit 1 arrived after it was published"):
        publisher.add(rows(1))
    publisher.finish()
    assert events[2:] == [("publish", 2, 2), ("publish", 3, 0)]
    assert (report.rows_written, report.rows_total, report.refused_now) == (5, 5, 4)
    assert [rows for _, rows in report.timeline] == [3, 3, 5, 5]
    assert bar.total == 400  # every unit's bytes, each credited once
    assert log.getvalue().splitlines()[0].startswith("/in/0.jsonl: 3 rows, 1 refused; ")


def test_a_failed_stream_closes_the_open_writers():
    events: list = []
    made: list[Writer] = []

    def writer(u):
        made.append(Writer(u, events))
        return made[-1]

    publisher = UnitPublisher([unit(0), unit(1)], writer, {}, BulkReport(), 0.0, Bar())
    publisher.add(rows(0, 1))  # unit 0 published, unit 1 open when the stream fails
    publisher.close()
    assert events == [("publish", 0, 1)]
    assert [w.unit.index for w in made if w.closed] == [1]


def in_process(plan: BulkPlan, device: str = "cpu"):
    """The pipeline ``deployments.bulk`` runs on Ray Data, run here in order."""
    encoder = BatchEncoder(plan.spec, plan.options, device)
    metadata = output_metadata(plan.spec, plan.options, device)

    def embed(pending, attempt, job, report, started):
        def writer(u):
            return UnitWriter(plan.out_fs, f"{attempt}/{Path(u.directory).name}", u,
                              plan.options.id_column, metadata)

        publisher = UnitPublisher(pending, writer, job, report, started, Bar())
        for u in pending:
            with plan.in_fs.open(u.file, "rb") as f:
                for table in read_rows(f, u.kind, u.index, text_column="text", id_column="id",
                                       batch_rows=2, max_row_bytes=1 << 16):
                    publisher.add(encoder.encode(table))
        publisher.finish()

    return embed


def write_inputs(root: Path) -> None:
    root.mkdir()
    for name, texts in (("a", ["one", "two", "three"]), ("b", ["four", ""])):
        (root / f"{name}.jsonl").write_text("".join(
            json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))


def test_a_planned_job_embeds_each_unit_once_and_a_rerun_skips_them(tmp_path):
    root, out = tmp_path / "in", tmp_path / "out"
    write_inputs(root)
    plan = BulkPlan.prepare(str(root), str(out), SETTINGS, BulkSettings())
    assert (plan.spec.id, plan.images, len(plan.files)) == ("fake", False, 2)
    assert plan.job_record("cpu")["text_column"] == "text"
    report = plan.run("cpu", in_process(plan))
    assert (report.files, report.rows_written, report.refused_now, report.refused) == (2, 4, 1, 1)
    assert report.skipped == []
    table = pq.read_table(next(out.glob("a.jsonl-*/part-*.parquet")))
    assert table.column("id").to_pylist() == [0, 1, 2]
    again = BulkPlan.prepare(str(root), str(out), SETTINGS, BulkSettings()).run(
        "cpu", lambda *_: pytest.fail("nothing is pending"))
    assert (again.rows_written, again.rows_total, len(again.skipped)) == (0, 4, 2)


def test_a_plan_refuses_an_output_inside_its_input_and_a_missing_column(tmp_path):
    root = tmp_path / "in"
    write_inputs(root)
    with pytest.raises(InvalidValue):
        BulkPlan.prepare(str(root), str(root / "out"), SETTINGS, BulkSettings())
    (root / "c.csv").write_text("id,body\n1,x\n")
    plan = BulkPlan.prepare(str(root / "c.csv"), str(tmp_path / "out"), SETTINGS,
                            BulkSettings())
    with pytest.raises(InvalidValue, match="has no column 'text'"):
        plan.run("cpu", lambda *_: pytest.fail("refused before it runs"))
