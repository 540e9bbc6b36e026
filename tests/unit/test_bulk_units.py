"""What a bulk job may skip, redo, delete or must refuse (blitz/bulk/units.py): overlap
with INPUT, OUTPUT that another program wrote, unit names that cannot collide, records
that keep one OUTPUT to one model, units published whole, and no secret in a task."""

from __future__ import annotations

import json
import os
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from blitz.bulk import units as bulk_units
from blitz.bulk.read import ID_INT
from blitz.bulk.units import (
    DONE,
    PUBLISHING,
    Unit,
    check_errors_target,
    check_no_overlap,
    claim_output,
    plan_units,
    unit_name,
)
from blitz.bulk.write import UnitWriter, merge_errors
from blitz.errors import InvalidValue

JOB = {"model": "m", "backend": "torch", "dtype": "float32", "dimensions": None}


@pytest.fixture
def fs():
    return fsspec.filesystem("file")


def test_unit_names_never_collide_and_stay_readable():
    names = {unit_name("/in", "/in/a/b.csv"), unit_name("/in", "/in/a__b.csv"),
             unit_name("bucket", "bucket/x/a.csv"), unit_name("bucket", "bucket/y/a.csv"),
             unit_name("", "/abs/x/a.csv"), unit_name("", "/abs/y/a.csv")}
    assert len(names) == 6
    assert unit_name("/in", "/in/a/b.csv").startswith("a__b.csv-")
    assert unit_name("/in", "/in/a/b.csv") == unit_name("/in", "/in/a/b.csv")


@pytest.mark.parametrize(("input_", "output"), [
    ("data/corpus.csv", "data"),  # OUTPUT holds INPUT: the unit would be the input file
    ("data", "data"),
    ("data", "data/out"),  # OUTPUT under INPUT: the next run would read its own output
    ("data/corpus.csv", "data/corpus.csv"),
])
def test_output_overlapping_input_is_refused(tmp_path, fs, input_, output):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "corpus.csv").write_text("text\na\n")
    root = str(tmp_path / input_)
    files = [str(tmp_path / "data" / "corpus.csv")]
    with pytest.raises(InvalidValue, match="overlaps INPUT"):
        check_no_overlap(fs, root, files, fs, str(tmp_path / output))
    check_no_overlap(fs, root, files, fs, str(tmp_path / "elsewhere"))


def test_overlap_sees_through_links(tmp_path, fs):
    (tmp_path / "data").mkdir()
    os.symlink(tmp_path / "data", tmp_path / "link")
    with pytest.raises(InvalidValue, match="overlaps"):
        check_no_overlap(fs, str(tmp_path / "data"), [], fs, str(tmp_path / "link" / "out"))


def test_output_holding_foreign_files_is_refused_and_ours_is_marked(tmp_path, fs):
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "notes.txt").write_text("keep me")
    with pytest.raises(InvalidValue, match="did not write"):
        claim_output(fs, str(tmp_path / "theirs"))
    assert (tmp_path / "theirs" / "notes.txt").read_text() == "keep me"
    claim_output(fs, str(tmp_path / "ours"))
    (tmp_path / "ours" / "x").write_text("")
    claim_output(fs, str(tmp_path / "ours"))  # marked: ours from now on


def test_an_errors_file_is_only_overwritten_when_it_is_ours(tmp_path, fs):
    (tmp_path / "notes.jsonl").write_text('{"important": true}\n')
    with pytest.raises(InvalidValue, match="not one blitz embed wrote"):
        check_errors_target(fs, str(tmp_path / "notes.jsonl"))
    (tmp_path / "errors.jsonl").write_text('{"id": 1, "reason": "null text", "file": "a"}\n')
    check_errors_target(fs, str(tmp_path / "errors.jsonl"))
    check_errors_target(fs, str(tmp_path / "new.jsonl"))
    (tmp_path / "empty.jsonl").write_text("")  # a run without refusals writes this
    check_errors_target(fs, str(tmp_path / "empty.jsonl"))
    for first in ("\n", "  \r\n", "\n\n"):  # a blank first line is not ours
        (tmp_path / "blank.jsonl").write_text(first + '{"id": 1, "reason": "x", "file": "a"}\n')
        with pytest.raises(InvalidValue, match="not one blitz embed wrote"):
            check_errors_target(fs, str(tmp_path / "blank.jsonl"))


def unit(tmp_path, name="a.csv", size=10) -> Unit:
    return Unit(index=0, file=f"/in/{name}", url=f"/in/{name}", kind="csv",
                directory=f"{tmp_path}/out/{name}-00000000",
                fingerprint={"size": size, "version": "1"})


def embedded(ids: list[int], refused: list[str]) -> pa.Table:
    rows = len(ids)
    return pa.table({
        "_unit": pa.array([0] * rows, pa.int32()), "_row": pa.array(ids, pa.int64()),
        "_line": pa.array([-1] * rows, pa.int64()), "_id_int": pa.array(ids, pa.int64()),
        "_id_str": pa.array([""] * rows), "_id_kind": pa.array([ID_INT] * rows, pa.int8()),
        "_refused": pa.array(refused), "_offset": pa.array([5] * rows, pa.int64()),
        "embedding": pa.FixedSizeListArray.from_arrays(
            pa.array([float(i) for i in ids for _ in range(2)], pa.float32()), 2),
        "tokens": pa.array([3] * rows, pa.int32())})


def write_unit(fs, tmp_path, u: Unit, ids=(1, 2, 3)) -> dict:
    writer = UnitWriter(fs, f"{tmp_path}/out/_attempts/x/{u.directory.rsplit('/', 1)[1]}",
                        u, "id", {b"blitz.model": b"m"})
    writer.add(embedded(list(ids), ["", "null text", ""]))
    return writer.publish(JOB)


def test_a_unit_is_published_whole_with_its_record_last(tmp_path, fs):
    u = unit(tmp_path)
    record = write_unit(fs, tmp_path, u)
    assert (record["rows"], record["refused"]) == (2, 1)
    assert sorted(os.listdir(u.directory)) == ["_SUCCESS", "_errors.jsonl", "part-00000.parquet"]
    table = pq.read_table(f"{u.directory}/part-00000.parquet")
    assert table.column("id").to_pylist() == [1, 3]
    assert table.schema.metadata[b"blitz.model"] == b"m"
    errors = [json.loads(line) for line in Path(u.directory, "_errors.jsonl").read_text()
              .splitlines()]
    assert errors == [{"id": 2, "reason": "null text", "file": "/in/a.csv", "row": 2}]
    assert json.loads(Path(u.directory, DONE).read_text())["input"] == u.fingerprint


def test_publishing_on_an_object_store_writes_the_record_after_the_files():
    store = fsspec.filesystem("memory")
    u = Unit(index=0, file="in/a.csv", url="memory://in/a.csv", kind="csv",
             directory="/out/a.csv-1", fingerprint={"size": 1, "version": "e"})
    writer = UnitWriter(store, "/out/_attempts/x/a.csv-1", u, "id", {})
    writer.add(embedded([1], [""]))
    writer.publish(JOB)
    assert sorted(p.rsplit("/", 1)[1] for p in store.ls("/out/a.csv-1", detail=False)) == [
        "_SUCCESS", "part-00000.parquet"]
    store.rm("/out", recursive=True)


def test_a_rerun_skips_matching_units_and_refuses_to_mix_models(tmp_path, fs):
    u = unit(tmp_path)
    write_unit(fs, tmp_path, u)
    plan = plan_units(fs, f"{tmp_path}/out", [unit(tmp_path)], JOB, force=False)
    assert plan.pending == [] and plan.units[0].done["rows"] == 2

    other = {**JOB, "model": "m2", "dtype": "int8"}
    with pytest.raises(InvalidValue, match=r"model 'm' \(this run: 'm2'\).*--force"):
        plan_units(fs, f"{tmp_path}/out", [unit(tmp_path)], other, force=False)
    with pytest.raises(InvalidValue, match="input file changed"):
        plan_units(fs, f"{tmp_path}/out", [unit(tmp_path, size=11)], JOB, force=False)
    forced = plan_units(fs, f"{tmp_path}/out", [unit(tmp_path)], other, force=True)
    assert len(forced.pending) == 1 and forced.pending[0].stale is not None


def test_a_redo_deletes_only_what_the_record_lists(tmp_path, fs):
    u = unit(tmp_path)
    write_unit(fs, tmp_path, u)
    (tmp_path / "out" / u.directory.rsplit("/", 1)[1] / "mine.txt").write_text("user file")
    redo = plan_units(fs, f"{tmp_path}/out", [unit(tmp_path)], {**JOB, "model": "m2"},
                      force=True).pending[0]
    write_unit(fs, tmp_path, redo, ids=(7, 8, 9))
    assert (tmp_path / "out" / u.directory.rsplit("/", 1)[1] / "mine.txt").exists()
    table = pq.read_table(f"{u.directory}/part-00000.parquet")
    assert table.column("id").to_pylist() == [7, 9]


def test_a_cut_off_publish_is_redone_and_foreign_unit_files_are_refused(tmp_path, fs):
    u = unit(tmp_path)
    record = write_unit(fs, tmp_path, u)
    os.rename(f"{u.directory}/{DONE}", f"{u.directory}/{PUBLISHING}")  # cut off mid-publish
    plan = plan_units(fs, f"{tmp_path}/out", [unit(tmp_path)], JOB, force=False)
    assert plan.pending[0].stale == record

    stranger = unit(tmp_path, name="b.csv")
    os.makedirs(stranger.directory)
    (tmp_path / "out" / stranger.directory.rsplit("/", 1)[1] / "x.parquet").write_text("")
    with pytest.raises(InvalidValue, match="did not record"):
        plan_units(fs, f"{tmp_path}/out", [stranger], JOB, force=True)


def test_errors_merge_into_one_file(tmp_path, fs):
    a, b = unit(tmp_path), unit(tmp_path, name="b.csv")
    write_unit(fs, tmp_path, a)
    write_unit(fs, tmp_path, b)
    target = f"{tmp_path}/out/errors.jsonl"
    assert merge_errors(fs, [a.directory, b.directory], target) == 2
    assert [json.loads(line)["file"] for line in Path(target).read_text().splitlines()] == [
        "/in/a.csv", "/in/b.csv"]
    assert sorted(os.listdir(tmp_path / "out"))[0] != ".errors.jsonl"  # no partial left


def test_a_second_job_on_the_same_output_is_refused(tmp_path, fs):
    with bulk_units.output_lock(fs, str(tmp_path / "out")):
        with pytest.raises(InvalidValue, match="another blitz embed"):
            with bulk_units.output_lock(fs, str(tmp_path / "out")):
                pass
    with bulk_units.output_lock(fs, str(tmp_path / "out")):
        pass


def test_the_job_s_task_payloads_hold_no_secret(monkeypatch):
    """Everything the job hands to Ray (the files, the reader's and the encoders' arguments,
    the tasks' runtime environment) is pickled into GCS and the object store: no key,
    secret or token may be in it. Workers open storage with their own credentials."""
    import cloudpickle

    from blitz.bulk.plan import job_payloads
    from blitz.settings.bulk import BulkSettings
    from blitz.settings.registry import ModelSpec
    from blitz.sources.storage import filesystem_for

    secrets = {"AWS_ACCESS_KEY_ID": "AKIDSECRETKEY123", "AWS_SECRET_ACCESS_KEY": "s3cr3t-value",
               "AWS_SESSION_TOKEN": "session-token-xyz"}
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    fs, path = filesystem_for("s3://bucket/in/a.csv")
    units = [Unit(index=0, file=path, url="s3://bucket/in/a.csv", kind="csv",
                  directory="bucket/out/a", fingerprint={"size": 1, "version": "e"})]
    payloads = job_payloads(units, ModelSpec(id="m", source="fake:4"), BulkSettings(), "cpu",
                            "/cache")
    blob = cloudpickle.dumps(payloads)
    assert payloads["read_remote_args"] == {
        "runtime_env": {"env_vars": {"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}}}
    for value in secrets.values():
        assert value.encode() not in blob
        assert value.encode() not in cloudpickle.dumps(fs)
