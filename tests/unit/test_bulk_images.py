"""Bulk images, Ray-free (blitz/bulk/images.py and the image half of blitz/bulk/job.py):
which files an image job reads, how image files are grouped into units that survive
additions, every bad image one refused row with its reason, vectors equal to
``DualEncoder.embed_image_bytes``, and units that a rerun skips, or redoes alone when an
image in them changed."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from blitz.bulk import units as bulk_units
from blitz.bulk.images import (
    IMAGE_ROWS,
    chunk_images,
    image_job,
    read_image_files,
    read_image_table,
)
from blitz.bulk.job import BatchEncoder, build_units, check_options, list_inputs
from blitz.bulk.read import ID_INT, ID_STR
from blitz.bulk.write import UnitWriter, merge_errors
from blitz.errors import InvalidValue
from blitz.settings.bulk import BulkSettings
from blitz.settings.registry import ModelSpec
from tests.tiny_vision import build_tiny_dual_encoder


def picture(seed: int, fmt: str = "PNG", size: tuple[int, int] = (32, 32)) -> bytes:
    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(
        out, format=fmt)
    return out.getvalue()


@pytest.fixture
def fs():
    return fsspec.filesystem("file")


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    path = build_tiny_dual_encoder(tmp_path_factory.mktemp("clip"), "clip", seed=7)
    return ModelSpec(id="clip", source=str(path), kind="dual-encoder")


@pytest.fixture(scope="module")
def encoder(clip):
    return BatchEncoder(clip, BulkSettings(image_column=None))


def table_of(tables) -> pa.Table:
    tables = list(tables)
    assert all(t.schema.equals(IMAGE_ROWS) for t in tables)
    return pa.concat_tables(tables) if tables else IMAGE_ROWS.empty_table()


def ids(table: pa.Table) -> list[object]:
    return [s if k == ID_STR else i for i, s, k in zip(
        table.column("_id_int").to_pylist(), table.column("_id_str").to_pylist(),
        table.column("_id_kind").to_pylist(), strict=True)]


# --- what an image job reads ------------------------------------------------------------

def test_folders_list_images_recursively_and_lists_only_when_named(tmp_path, fs):
    root = tmp_path / "photos"
    (root / "cats").mkdir(parents=True)
    (root / ".thumbs").mkdir()
    for name in ("a.JPG", "cats/b.png", "cats/c.webp", "d.gif", "e.bmp", "f.jpeg",
                 ".thumbs/x.png", "_skip.png"):
        (root / name).write_bytes(b"x")
    (root / "cats" / "b.txt").write_text("a caption, not a list\n")
    (root / "notes.pdf").write_bytes(b"%PDF")
    base, files = list_inputs(fs, str(root), image_files=True, lists=True)
    assert [os.path.relpath(f, root) for f in files] == [
        "a.JPG", "cats/b.png", "cats/c.webp", "d.gif", "e.bmp", "f.jpeg"]
    assert base == str(root)
    listed = tmp_path / "list.txt"
    listed.write_text("photos/a.JPG\n")
    assert list_inputs(fs, str(listed), lists=True)[1] == [str(listed)]
    assert list_inputs(fs, str(root / "cats" / "*.txt"), lists=True)[1] == [
        str(root / "cats" / "b.txt")]
    with pytest.raises(InvalidValue, match="need a dual-encoder model"):
        list_inputs(fs, str(root))  # a text model: the images are named, not ignored


def test_an_image_job_is_decided_and_mixing_refused():
    assert image_job("dual-encoder", None, None, ["/in/a.png", "/in/l.txt"])
    assert not image_job("dual-encoder", None, None, ["/in/a.csv"])  # the text tower
    assert image_job("dual-encoder", "path", None, ["/in/a.csv", "/in/b.parquet"])
    with pytest.raises(InvalidValue, match="--image-column"):
        image_job("dual-encoder", None, None, ["/in/a.png", "/in/meta.csv"])
    with pytest.raises(InvalidValue, match="dual-encoder"):
        image_job("embedding", None, None, ["/in/a.png"])
    with pytest.raises(InvalidValue, match="no prompt"):
        image_job("dual-encoder", None, "query", ["/in/a.png"])
    with pytest.raises(InvalidValue, match="dual-encoder"):
        check_options(ModelSpec(id="t", source="fake:4"), BulkSettings(image_column="path"))


def test_chunks_hold_about_n_images_and_an_added_image_changes_one_chunk():
    files = [f"/in/{i // 100:02d}/img{i:05d}.jpg" for i in range(2000)]
    chunks = chunk_images("/in", files, 50)
    sizes = [len(members) for _, members in chunks]
    assert sum(sizes) == 2000 and 20 <= len(chunks) <= 80  # 40 on average
    assert [m for _, members in chunks for m in members] == files
    assert chunk_images("/in", files, 50) == chunks  # the same on every run

    added = sorted([*files, "/in/07/img00750b.jpg"])
    again = chunk_images("/in", added, 50)
    changed = [c for c in again if c not in chunks]
    assert len(changed) == 1 and "/in/07/img00750b.jpg" in changed[0][1]
    assert {start for start, _ in again} >= {start for start, _ in chunks} - {""}
    assert [len(m) for _, m in chunk_images("/in", files[:5], 1)] == [1] * 5


def test_units_of_images_are_named_by_their_start_and_see_a_changed_image(tmp_path, fs):
    root = tmp_path / "in"
    root.mkdir()
    for i in range(12):
        (root / f"img{i:02d}.png").write_bytes(picture(i))
    base, files = list_inputs(fs, str(root), image_files=True)
    units = build_units(fs, base, files, str(tmp_path / "out"), 4)
    assert all(u.kind == "images" and u.members for u in units)
    assert [m[1] for u in units for m in u.members] == [f"img{i:02d}.png" for i in range(12)]
    assert all(Path(u.directory).name.startswith("images-") for u in units)
    os.utime(root / "img05.png", (1, 1))  # an image changed in place
    after = build_units(fs, base, files, str(tmp_path / "out"), 4)
    moved = [(a.directory, a.fingerprint != b.fingerprint) for a, b in zip(units, after,
                                                                           strict=True)]
    assert [d for d, changed in moved if changed] == [
        u.directory for u in units if any(m[1] == "img05.png" for m in u.members)]


# --- reading ----------------------------------------------------------------------------

def test_image_files_are_read_within_the_byte_limit_and_bad_ones_refused(tmp_path):
    good = picture(1)
    (tmp_path / "good.png").write_bytes(good)
    (tmp_path / "big.png").write_bytes(picture(2, size=(64, 64)))
    (tmp_path / "empty.png").write_bytes(b"")
    (tmp_path / "folder.png").mkdir()
    names = ["good.png", "missing.png", "big.png", "empty.png", "folder.png"]
    members = [(str(tmp_path / n), n) for n in names]
    rows = table_of(read_image_files(members, 4, batch_rows=2, max_image_bytes=len(good)))
    assert ids(rows) == names and rows.column("_unit").to_pylist() == [4] * 5
    assert rows.column("_refused").to_pylist() == [
        "", "no such image file", f"an image file over images.max_bytes ({len(good):,} bytes)",
        "an empty image file", "a folder, not an image file"]
    assert rows.column("_image").to_pylist()[0] == good
    assert rows.column("_source").to_pylist()[1] == str(tmp_path / "missing.png")


def test_tables_and_lists_name_images_relative_to_their_folder(tmp_path):
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "a.png").write_bytes(picture(1))
    (tmp_path / "b.jpg").write_bytes(picture(2, "JPEG"))
    csv = b"id,path\n7,img/a.png\n8,\n9,nope.png\n10," + str(tmp_path / "b.jpg").encode() + b"\n"

    def read(data: bytes, kind: str, **kwargs) -> pa.Table:
        return table_of(read_image_table(
            io.BytesIO(data), kind, 0, str(tmp_path / f"t.{kind}"),
            image_column=kwargs.pop("column", "path"), id_column="id", batch_rows=3,
            max_row_bytes=1 << 16, max_image_bytes=1 << 20))

    rows = read(csv, "csv")
    assert ids(rows) == [7, 8, 9, 10] and set(rows.column("_id_kind").to_pylist()) == {ID_INT}
    assert rows.column("_refused").to_pylist()[:3] == [
        "", "empty image path", "no such image file"]
    assert rows.column("_refused").to_pylist()[3].startswith("an absolute path is not read")
    assert rows.column("_source").to_pylist()[0] == str(tmp_path / "img" / "a.png")

    sink = io.BytesIO()  # no id column: the path is the id
    pq.write_table(pa.table({"file": ["img/a.png", "./b.jpg", None]}), sink)
    rows = read(sink.getvalue(), "parquet", column="file")
    assert ids(rows)[:2] == ["img/a.png", "./b.jpg"]
    assert rows.column("_refused").to_pylist() == ["", "", "null image path"]

    jsonl = b'{"path": "img/a.png"}\n{"path": 3}\n'
    assert read(jsonl, "json").column("_refused").to_pylist() == ["", "not a string (int)"]

    listed = b"\xef\xbb\xbfimg/a.png\n\n  b.jpg  \r\nmissing.png\n\xff\xfe\n"
    rows = read(listed, "list")
    assert ids(rows) == ["img/a.png", "b.jpg", "missing.png", "3"]
    assert rows.column("_line").to_pylist() == [1, 3, 4, 5]
    assert rows.column("_refused").to_pylist() == [
        "", "", "no such image file", "line is not valid UTF-8"]


# --- embedding --------------------------------------------------------------------------

def test_vectors_equal_embed_image_bytes_in_any_batch_and_bad_images_are_refused(
        tmp_path, encoder):
    files = [picture(1), picture(2, "JPEG", (50, 20)), picture(3, "WEBP"), picture(4, "GIF"),
             picture(5, "BMP", (40, 40))]
    broken = {"truncated.png": files[0][:60], "text.png": b"hello, not an image",
              "bomb.png": picture(6, size=(20_000, 1))}
    members = []
    for i, data in enumerate(files):
        (tmp_path / f"{i}.img").write_bytes(data)
        members.append((str(tmp_path / f"{i}.img"), f"{i}.img"))
    for name, data in broken.items():
        (tmp_path / name).write_bytes(data)
    members[2:2] = [(str(tmp_path / n), n) for n in broken]
    rows = table_of(read_image_files(members, 0, batch_rows=64, max_image_bytes=1 << 20))
    out = encoder.encode(rows)
    refused = dict(zip(ids(out), out.column("_refused").to_pylist(), strict=True))
    assert refused["truncated.png"].startswith("the image could not be")
    assert refused["text.png"].startswith("image format unknown is not accepted")
    assert "images.max_side" in refused["bomb.png"]
    assert [k for k, v in refused.items() if not v] == [f"{i}.img" for i in range(5)]

    want = encoder.encoder.embed_image_bytes(files, normalize=True).values
    got = np.stack(out.column("embedding").to_numpy(zero_copy_only=False))
    good = [i for i, v in enumerate(out.column("_refused").to_pylist()) if not v]
    np.testing.assert_allclose(got[good], want, atol=1e-5)
    assert not got[[i for i in range(len(members)) if i not in good]].any()
    for i, data in enumerate(files):  # one image alone gives the same vector
        alone = encoder.encoder.embed_image_bytes([data], normalize=True).values[0]
        np.testing.assert_allclose(got[good[i]], alone, atol=1e-5)
    assert out.column("tokens").to_pylist() == [0] * len(members)


def test_a_truncated_animated_gif_is_a_refused_row_and_the_job_goes_on(tmp_path, encoder):
    rng = np.random.default_rng(1)
    frames = [Image.fromarray(rng.integers(0, 255, (12, 12, 3), dtype=np.uint8))
              for _ in range(4)]
    out = io.BytesIO()
    frames[0].save(out, format="GIF", save_all=True, append_images=frames[1:])
    gif = out.getvalue()
    members = []
    for name, data in (("a.png", picture(1)), ("cut.gif", gif[:int(len(gif) * 0.3)]),
                       ("cut2.gif", gif[:int(len(gif) * 0.9)]), ("b.png", picture(2))):
        (tmp_path / name).write_bytes(data)  # on main: IndexError from n_frames, job failed
        members.append((str(tmp_path / name), name))
    rows = table_of(read_image_files(members, 0, batch_rows=64, max_image_bytes=1 << 20))
    out_table = encoder.encode(rows)
    refused = dict(zip(ids(out_table), out_table.column("_refused").to_pylist(), strict=True))
    assert refused["a.png"] == refused["b.png"] == ""
    assert refused["cut.gif"].startswith("the image could not be")
    assert refused["cut2.gif"].startswith("the image could not be")


def test_tables_of_texts_embed_with_the_text_tower(encoder):
    from blitz.bulk.read import read_rows

    data = b"id,text\n1,a red cat\n2,\n3,blue sea\n"
    [rows] = read_rows(io.BytesIO(data), "csv", 0, text_column="text", id_column="id",
                       batch_rows=8, max_row_bytes=1 << 16)
    out = encoder.encode(rows)
    assert out.column("_refused").to_pylist() == ["", "empty text", ""]
    got = np.stack(out.column("embedding").to_numpy(zero_copy_only=False))[[0, 2]]
    want = encoder.encoder.embed(["a red cat", "blue sea"], normalize=True).values
    np.testing.assert_allclose(got, want, atol=1e-5)


# --- a job's units, written and resumed, without Ray ------------------------------------

def run_job(fs, root: Path, out: Path, encoder: BatchEncoder, per_unit: int,
            force: bool = False) -> tuple[list[str], list[str]]:
    """What ``deployments.bulk.embed_dataset`` does, in process: (units written, skipped)."""
    base, files = list_inputs(fs, str(root), image_files=True, lists=True)
    units = build_units(fs, base, files, str(out), per_unit)
    job = {"model": "clip", "images": True, "images_per_unit": per_unit}
    bulk_units.claim_output(fs, str(out))
    plan = bulk_units.plan_units(fs, str(out), units, job, force)
    bulk_units.remove_orphans(fs, plan)
    attempt = bulk_units.new_attempt(fs, str(out))
    for unit in plan.pending:
        writer = UnitWriter(fs, f"{attempt}/{Path(unit.directory).name}", unit, "id",
                            encoder.metadata)
        for rows in read_image_files(unit.members or [], unit.index, batch_rows=3,
                                     max_image_bytes=1 << 20):
            writer.add(encoder.encode(rows))
        writer.publish(job)
    bulk_units.end_attempt(fs, str(out))
    merge_errors(fs, [u.directory for u in units], str(out / "errors.jsonl"))
    return ([u.directory for u in plan.pending],
            [u.directory for u in plan.units if u.done is not None])


def test_units_are_published_whole_skipped_on_a_rerun_and_a_changed_image_is_seen(
        tmp_path, fs, encoder):
    root, out = tmp_path / "photos", tmp_path / "out"
    (root / "sub").mkdir(parents=True)
    for i in range(9):
        (root / ("sub" if i % 3 == 0 else ".") / f"p{i}.png").write_bytes(picture(i))
    (root / "bad.jpg").write_bytes(b"\xff\xd8\xff broken")
    written, skipped = run_job(fs, root, out, encoder, per_unit=3)
    assert skipped == [] and len(written) >= 2
    table = pq.read_table([str(Path(d) / bulk_units.PART) for d in written
                           if (Path(d) / bulk_units.PART).exists()])
    assert sorted(table.column("id").to_pylist()) == sorted(
        ["p1.png", "p2.png", "p4.png", "p5.png", "p7.png", "p8.png", "sub/p0.png",
         "sub/p3.png", "sub/p6.png"])
    assert table.schema.metadata[b"blitz.model"] == b"clip"
    [error] = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    assert (error["id"], error["file"], error["row"]) == (
        "bad.jpg", str(root / "bad.jpg"), None)
    assert error["reason"].startswith("the image could not be")
    assert not (out / "_attempts").exists()

    assert run_job(fs, root, out, encoder, per_unit=3) == ([], written)

    (root / "p4.png").write_bytes(picture(40))  # one image changed: its unit alone differs
    with pytest.raises(InvalidValue, match="input file changed"):
        run_job(fs, root, out, encoder, per_unit=3)
    redone, kept = run_job(fs, root, out, encoder, per_unit=3, force=True)
    assert len(redone) == 1 and len(kept) == len(written) - 1
    redone_ids = pq.read_table(Path(redone[0]) / bulk_units.PART).column("id").to_pylist()
    assert "p4.png" in redone_ids


def test_a_removed_image_a_chunk_started_at_leaves_no_id_twice(tmp_path, fs, encoder):
    """Its other images join the chunk before it: that chunk changed, and the old one is
    an orphan that --force removes (its ids would be in OUTPUT twice)."""
    root, out = tmp_path / "photos", tmp_path / "out"
    root.mkdir()
    for i in range(16):
        (root / f"p{i:02d}.png").write_bytes(picture(i))
    written, _ = run_job(fs, root, out, encoder, per_unit=3)
    base, files = list_inputs(fs, str(root), image_files=True)
    chunks = [members for start, members in chunk_images(base, files, 3) if start]
    assert len(written) >= 3 and chunks  # chunks past the first start at a boundary
    removed = max(chunks, key=len)[0]  # one with other images in it, where there is one
    orphan = next(d for d in written if Path(removed).name in Path(d).name)
    os.remove(removed)
    with pytest.raises(InvalidValue, match=f"{orphan} hold images that no chunk"):
        run_job(fs, root, out, encoder, per_unit=3)
    assert (Path(orphan) / bulk_units.PART).exists()  # refused: nothing touched
    redone, _ = run_job(fs, root, out, encoder, per_unit=3, force=True)
    assert len(redone) == (max(map(len, chunks)) > 1) and not Path(orphan).exists()
    table = pq.read_table([str(p) for p in sorted(out.glob(f"*/{bulk_units.PART}"))])
    got = table.column("id").to_pylist()
    assert sorted(got) == sorted(f"p{i:02d}.png" for i in range(16)
                                 if f"p{i:02d}.png" != Path(removed).name)
    assert run_job(fs, root, out, encoder, per_unit=3)[0] == []  # and then all done
