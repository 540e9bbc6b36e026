"""The bulk job (deployments/bulk.py) on the session's shared Ray instance: Parquet,
JSONL and CSV in, Parquet out, vectors against in-process sentence-transformers; every
ordinary operator mistake refused with a reason (OUTPUT holding INPUT, colliding names, a bad
first line, deep nesting, a rerun with another model or dtype, OUTPUT under INPUT);
s3:// in and out against a moto server with credentials that rotate mid-job; the
``blitz embed`` command, its default config and exit statuses."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from blitz.errors import InvalidValue
from blitz.settings.bulk import BulkSettings
from blitz.settings.config import BlitzSettings
from deployments.bulk import embed_dataset
from deployments.cli import main as blitz_main
from tests.ports import free_port

TEXTS = [f"document number {i} about {'cats' if i % 2 else 'the stock market'}"
         for i in range(40)]


@pytest.fixture(scope="module")
def settings(tiny_models, tmp_path_factory) -> BlitzSettings:
    return BlitzSettings(
        models=[{"id": "tiny-a", "source": str(tiny_models["tiny-a"])},
                {"id": "tiny-b", "source": str(tiny_models["tiny-b"])}],
        cache_dir=str(tmp_path_factory.mktemp("bulk-cache")))


def options(**changes) -> BulkSettings:
    return BulkSettings(**{"batch_size": 16, "actors": 2, "device": "cpu", **changes})


@pytest.fixture
def corpus(tmp_path) -> Path:
    """a.parquet: ids "p0".., 30 good texts; b.jsonl: no id column, 10 texts, 3 bad."""
    root = tmp_path / "corpus"
    root.mkdir()
    pq.write_table(pa.table({"id": [f"p{i}" for i in range(30)], "text": TEXTS[:30],
                             "other": list(range(30))}), root / "a.parquet")
    lines: list[object] = list(TEXTS[30:40])
    lines[2], lines[5], lines[7] = None, "   ", 42
    (root / "b.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in lines))
    return root


def unit_dir(out: Path, name: str) -> Path:
    [found] = out.glob(f"{name}-????????")
    return found


def read_unit(out: Path, name: str) -> pa.Table:
    return pq.read_table(unit_dir(out, name) / "part-00000.parquet")


def vectors(table: pa.Table) -> np.ndarray:
    return np.stack(table.column("embedding").to_numpy(zero_copy_only=False))


def errors(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]


def test_parquet_and_jsonl_in_parquet_out_equal_in_process_and_bad_rows_refused(
        serve_instance, settings, tiny_models, reference, corpus, tmp_path):
    out = tmp_path / "out"
    report = embed_dataset(str(corpus), str(out), settings=settings, options=options())
    assert (report.files, report.rows_written, report.refused) == (2, 37, 3)

    model = reference("tiny-a", tiny_models["tiny-a"])
    a = read_unit(out, "a.parquet")
    assert a.column("id").to_pylist() == [f"p{i}" for i in range(30)]
    assert a.schema.field("embedding").type == pa.list_(pa.float32(), 32)
    assert a.schema.metadata[b"blitz.model"] == b"tiny-a"
    expected = model.encode(TEXTS[:30], normalize_embeddings=True)
    cosines = np.sum(vectors(a) * expected, axis=1) / np.linalg.norm(expected, axis=1)
    assert cosines.min() >= 0.9999

    b = read_unit(out, "b.jsonl")  # no id column: the row's position in its file
    kept = [0, 1, 3, 4, 6, 8, 9]
    assert b.column("id").to_pylist() == kept
    np.testing.assert_allclose(vectors(b), model.encode(
        [TEXTS[30 + i] for i in kept], normalize_embeddings=True), atol=1e-5)
    assert sorted((e["id"], e["reason"], e["line"]) for e in errors(out)) == [
        (2, "null text", 3), (5, "empty text", 6), (7, "not a string (int)", 8)]
    assert all(e["file"].endswith("b.jsonl") for e in errors(out))
    assert not (out / "_attempts").exists()


def test_a_rerun_skips_finished_files_and_redoes_a_cut_off_publish(
        serve_instance, settings, corpus, tmp_path):
    out = tmp_path / "out"
    embed_dataset(str(corpus), str(out), settings=settings, options=options())
    first = read_unit(out, "a.parquet")

    again = embed_dataset(str(corpus), str(out), settings=settings, options=options())
    assert (len(again.skipped), again.rows_written, again.rows_total) == (2, 0, 37)
    assert again.refused == 3  # the errors file still lists the skipped file's refusals

    a = unit_dir(out, "a.parquet")  # a publish cut off before its record was final
    (a / "_SUCCESS").rename(a / "_PUBLISHING")
    resumed = embed_dataset(str(corpus), str(out), settings=settings, options=options())
    assert [Path(f).name for f in resumed.skipped] == ["b.jsonl"]
    assert resumed.rows_written == 30
    assert read_unit(out, "a.parquet").column("id").to_pylist() == first.column(
        "id").to_pylist()
    assert sorted(p.name for p in a.iterdir()) == ["_SUCCESS", "part-00000.parquet"]


@pytest.mark.parametrize("where", ["holds the input file", "is the input", "under the input"])
def test_output_overlapping_input_is_refused_and_nothing_is_touched(
        serve_instance, settings, tmp_path, where):
    data = tmp_path / "data"
    data.mkdir()
    (data / "corpus.csv").write_text("id,text\n1,a cat\n")
    input_, output = {"holds the input file": (data / "corpus.csv", data),
                      "is the input": (data, data),
                      "under the input": (data, data / "out")}[where]
    with pytest.raises(InvalidValue, match="overlaps INPUT"):
        embed_dataset(str(input_), str(output), settings=settings, options=options())
    assert sorted(p.name for p in data.iterdir()) == ["corpus.csv"]
    assert (data / "corpus.csv").read_text() == "id,text\n1,a cat\n"


def test_files_whose_flattened_names_collide_are_both_written(serve_instance, settings,
                                                              tmp_path):
    root = tmp_path / "in"
    (root / "a").mkdir(parents=True)
    (root / "a" / "b.csv").write_text("id,text\n" + "".join(f"{i},one {i}\n" for i in range(10)))
    (root / "a__b.csv").write_text("id,text\n" + "".join(f"{i},two {i}\n"
                                                         for i in range(10, 20)))
    report = embed_dataset(str(root), str(tmp_path / "out"), settings=settings,
                           options=options())
    assert (report.rows_written, report.skipped) == (20, [])
    ids = sorted(i for unit in (tmp_path / "out").glob("a__b.csv-*")
                 for i in pq.read_table(unit / "part-00000.parquet").column("id").to_pylist())
    assert ids == list(range(20))


def test_a_bad_first_line_and_deep_nesting_are_refused_rows_not_a_failed_job(
        serve_instance, settings, tmp_path):
    root = tmp_path / "in"
    root.mkdir()
    good = [json.dumps({"id": i, "text": f"text {i}"}) for i in range(20)]
    (root / "first.jsonl").write_text("\n".join(["{not json", *good[:10]]) + "\n")
    (root / "deep.jsonl").write_bytes(b"[" * 100_000 + b"\n" + b"\xff\xfe\n"
                                      + "\n".join(good[10:]).encode())
    report = embed_dataset(str(root), str(tmp_path / "out"), settings=settings,
                           options=options())
    assert (report.rows_written, report.refused) == (20, 3)
    assert sorted(e["reason"] for e in errors(tmp_path / "out")) == [
        "not a JSON object"] * 3


def test_a_rerun_with_another_model_or_dtype_is_refused_unless_forced(
        serve_instance, settings, corpus, tmp_path):
    out = tmp_path / "out"
    embed_dataset(str(corpus), str(out), settings=settings, options=options())
    for change in ({"model": "tiny-b"}, {"dtype": "int8"}, {"dimensions": 16}):
        with pytest.raises(InvalidValue, match="--force"):
            embed_dataset(str(corpus), str(out), settings=settings, options=options(**change))
    assert read_unit(out, "a.parquet").schema.field("embedding").type == pa.list_(
        pa.float32(), 32)

    forced = embed_dataset(str(corpus), str(out), settings=settings,
                           options=options(model="tiny-b", force=True))
    assert forced.rows_written == 37
    for name in ("a.parquet", "b.jsonl"):
        table = read_unit(out, name)
        assert table.schema.metadata[b"blitz.model"] == b"tiny-b"
        assert table.schema.field("embedding").type == pa.list_(pa.float32(), 48)

    (corpus / "b.jsonl").write_text(json.dumps({"text": "changed"}) + "\n")
    with pytest.raises(InvalidValue, match="input file changed"):
        embed_dataset(str(corpus), str(out), settings=settings, options=options(model="tiny-b"))


def test_output_that_another_program_wrote_is_refused(serve_instance, settings, corpus,
                                                      tmp_path):
    out = tmp_path / "results"
    out.mkdir()
    (out / "report.pdf").write_bytes(b"%PDF")
    with pytest.raises(InvalidValue, match="did not write"):
        embed_dataset(str(corpus), str(out), settings=settings, options=options())
    assert sorted(p.name for p in out.iterdir()) == ["report.pdf"]


CREDENTIAL_PROCESS = """
import json, sys, time
from pathlib import Path
counter = Path(sys.argv[1])
n = int(counter.read_text() or 0) + 1 if counter.exists() else 1
counter.write_text(str(n))
expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 60))
print(json.dumps({"Version": 1, "AccessKeyId": f"ROTATING{n}",
                  "SecretAccessKey": f"rotating-secret-{n}", "SessionToken": f"token-{n}",
                  "Expiration": expires}))
"""


@pytest.fixture
def s3(monkeypatch, aws_files, tmp_path):
    """A moto S3 server with a bucket ``bulk``. Credentials come from a profile whose
    ``credential_process`` hands out a new key each time (expiring in a minute), in the
    AWS files Ray's workers read (tests/conftest.py): every process resolves its own,
    and boto refreshes them as they near expiry."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    script, counter = tmp_path / "credentials.py", tmp_path / "issued"
    script.write_text(CREDENTIAL_PROCESS)
    aws_files["config"].write_text(f"[default]\nregion = us-east-1\ncredential_process = "
                                   f"{sys.executable} {script} {counter}\n")
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID",
                 "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(aws_files["config"]))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(aws_files["credentials"]))
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    import boto3

    client = boto3.session.Session().client("s3")  # not boto3's default session: an
    client.create_bucket(Bucket="bulk")  # earlier test may have cached static keys in it
    try:
        yield client, counter
    finally:
        aws_files["config"].write_text("")
        server.stop()


def test_s3_in_and_out_with_credentials_that_rotate(serve_instance, settings, tiny_models,
                                                   reference, corpus, s3):
    client, issued = s3
    client.upload_file(str(corpus / "a.parquet"), "bulk", "in/a.parquet")
    client.upload_file(str(corpus / "b.jsonl"), "bulk", "in/sub/b.jsonl")
    before = int(issued.read_text())
    report = embed_dataset("s3://bulk/in/", "s3://bulk/out", settings=settings,
                           options=options())
    assert (report.rows_written, report.refused) == (37, 3)
    assert int(issued.read_text()) - before >= 3  # refreshed in the driver and the workers
    keys = {o["Key"] for o in client.list_objects_v2(Bucket="bulk", Prefix="out/")["Contents"]}
    [a_unit] = {k.split("/")[1] for k in keys if k.startswith("out/a.parquet-")}
    assert {f"out/{a_unit}/_SUCCESS", "out/errors.jsonl", "out/_BLITZ"} <= keys
    assert not any("_attempts" in k or "_PUBLISHING" in k for k in keys)
    table = pq.read_table(io.BytesIO(client.get_object(
        Bucket="bulk", Key=f"out/{a_unit}/part-00000.parquet")["Body"].read()))
    assert table.column("id").to_pylist() == [f"p{i}" for i in range(30)]
    np.testing.assert_allclose(vectors(table), reference("tiny-a", tiny_models["tiny-a"]).encode(
        TEXTS[:30], normalize_embeddings=True), atol=1e-5)
    again = embed_dataset("s3://bulk/in/", "s3://bulk/out", settings=settings,
                          options=options())
    assert (len(again.skipped), again.rows_written, again.rows_total) == (2, 0, 37)


def write_config(path: Path, settings: BlitzSettings) -> None:
    models = [m.model_dump(exclude_defaults=True) for m in settings.models]
    path.write_text(json.dumps({"applications": [{"name": "blitz", "args": {
        "models": models, "cache_dir": settings.cache_dir}}]}))


def test_blitz_embed_command(serve_instance, settings, tmp_path, capsys, monkeypatch):
    write_config(tmp_path / "serve_config.yaml", settings)
    monkeypatch.chdir(tmp_path)  # ./serve_config.yaml names the models, as for serve run
    corpus = tmp_path / "in.csv"
    corpus.write_text("id,text\n1,first line\n2,\n3,third line\n")
    argv = ["embed", str(corpus), str(tmp_path / "out"), "--model", "tiny-b", "--dtype",
            "int8", "--dimensions", "16", "--actors", "1", "--device", "cpu"]
    assert blitz_main(argv) == 3  # done, with a refused row
    printed = capsys.readouterr().out
    assert "models from serve_config.yaml" in printed
    assert "wrote 2 rows, refused 1 rows, skipped 0 files" in printed
    table = read_unit(tmp_path / "out", "in.csv")
    assert table.schema.field("embedding").type == pa.list_(pa.int8(), 16)

    good = tmp_path / "good.csv"
    good.write_text("id,text\n1,fine\n")
    assert blitz_main(["embed", str(good), str(tmp_path / "out3"), "--actors", "1",
                       "--device", "cpu", "--model", "tiny-a"]) == 0
    bad = tmp_path / "bad.csv"
    bad.write_text("id,text\n1,\n2,\n")
    assert blitz_main(["embed", str(bad), str(tmp_path / "out2"), "--actors", "1",
                       "--device", "cpu", "--model", "tiny-a"]) == 1  # nothing written
    with pytest.raises(SystemExit) as usage:  # a rerun that would mix models
        blitz_main(argv[:4] + ["tiny-a", "--actors", "1", "--device", "cpu"])
    assert usage.value.code == 2
    assert "--force" in capsys.readouterr().err


def test_a_long_csv_cell_costs_no_other_row_and_linked_folders_are_read(
        serve_instance, settings, tmp_path):
    """A CSV cell longer than pyarrow's 1 MiB block (yet under --max-row-bytes) must not
    lose the rows after it; a row over the limit costs only itself; a link to a folder
    inside INPUT is read, not skipped without a word."""
    root, elsewhere = tmp_path / "in", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    rows = [f"{i},text {i}\n" for i in range(1, 11)]
    rows[4] = "5," + "long text " * 210_000 + "\n"  # 2.1 MB
    rows[7] = '8,"' + "x" * (5 << 20) + '"\n'  # over the 4 MiB default
    (root / "long.csv").write_text("id,text\n" + "".join(rows))
    (elsewhere / "linked.csv").write_text("id,text\n1,one\n2,two\n")
    (root / "link").symlink_to(elsewhere, target_is_directory=True)
    out = tmp_path / "out"
    report = embed_dataset(str(root), str(out), settings=settings, options=options())
    assert (report.files, report.rows_written, report.refused) == (2, 11, 1)
    assert read_unit(out, "long.csv").column("id").to_pylist() == [1, 2, 3, 4, 5, 6, 7, 9, 10]
    assert read_unit(out, "link__linked.csv").column("id").to_pylist() == [1, 2]
    [refused] = errors(out)
    assert (refused["reason"], refused["line"]) == (f"row longer than {4 << 20} bytes", 9)


def test_blitz_embed_images_a_folder_and_a_table_refusing_bad_images_and_resuming(
        serve_instance, tmp_path, capsys, monkeypatch):
    """A tiny CLIP through the real command: a folder of images (nested, some broken) in
    units of about two images, vectors equal to ``DualEncoder.embed_image_bytes``, each bad
    image one refused row; a rerun skips every unit; a CSV of image paths
    (``--image-column``) names its images relative to itself."""
    from PIL import Image

    from blitz.images.dual_encoder import DualEncoder
    from tests.tiny_vision import build_tiny_dual_encoder

    clip = build_tiny_dual_encoder(tmp_path / "clip", "clip", seed=3)
    write_config(tmp_path / "serve_config.yaml", BlitzSettings(
        models=[{"id": "tiny-clip", "source": str(clip), "kind": "dual-encoder"}],
        cache_dir=str(tmp_path / "cache")))
    monkeypatch.chdir(tmp_path)
    photos = tmp_path / "photos"
    (photos / "cats").mkdir(parents=True)
    rng = np.random.default_rng(0)
    good: dict[str, bytes] = {}
    for i, name in enumerate(["a.png", "b.jpg", "cats/c.png", "cats/d.webp", "e.bmp"]):
        out = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (32 + i, 32, 3), dtype=np.uint8)).save(
            out, format={"png": "PNG", "jpg": "JPEG", "webp": "WEBP", "bmp": "BMP"}[
                name.rsplit(".", 1)[1]])
        good[name] = out.getvalue()
        (photos / name).write_bytes(good[name])
    (photos / "cats" / "truncated.png").write_bytes(good["a.png"][:70])
    (photos / "text.jpg").write_bytes(b"not an image at all")
    (photos / "cats" / "caption.txt").write_text("a caption beside the images\n")
    argv = ["embed", str(photos), str(tmp_path / "out"), "--model", "tiny-clip",
            "--images-per-unit", "2", "--actors", "1", "--device", "cpu", "--no-progress"]
    assert blitz_main(argv) == 3  # done, with refused rows
    assert "wrote 5 rows, refused 2 rows" in capsys.readouterr().out
    out = tmp_path / "out"
    units = sorted(p for p in out.glob("images-*") if (p / "part-00000.parquet").exists())
    table = pa.concat_tables([pq.read_table(u / "part-00000.parquet") for u in units])
    assert sorted(table.column("id").to_pylist()) == sorted(good)
    assert table.schema.metadata[b"blitz.model"] == b"tiny-clip"
    names = table.column("id").to_pylist()
    want = DualEncoder("tiny-clip", clip).embed_image_bytes([good[n] for n in names],
                                                           normalize=True).values
    np.testing.assert_allclose(vectors(table), want, atol=1e-5)
    assert sorted((e["id"], e["file"]) for e in errors(out)) == [
        ("cats/truncated.png", str(photos / "cats" / "truncated.png")),
        ("text.jpg", str(photos / "text.jpg"))]

    assert blitz_main(argv) == 3  # a rerun: every unit done, nothing embedded again
    printed = capsys.readouterr().out
    assert "wrote 0 rows, refused 0 rows" in printed and "5 rows in" in printed

    (tmp_path / "meta.csv").write_text("id,file\n1,photos/a.png\n2,photos/missing.png\n"
                                       "3,photos/cats/c.png\n")
    assert blitz_main(["embed", str(tmp_path / "meta.csv"), str(tmp_path / "out2"),
                       "--model", "tiny-clip", "--image-column", "file", "--actors", "1",
                       "--device", "cpu", "--no-progress"]) == 3
    table = read_unit(tmp_path / "out2", "meta.csv")
    assert table.column("id").to_pylist() == [1, 3]
    np.testing.assert_allclose(vectors(table), want[[names.index("a.png"),
                                                      names.index("cats/c.png")]], atol=1e-5)
    [missing] = errors(tmp_path / "out2")
    assert (missing["id"], missing["reason"]) == (2, "no such image file")
    assert missing["image"] == str(photos / "missing.png")
