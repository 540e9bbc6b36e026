"""The bulk job on Ray Data (deployments/bulk.py), on the session's shared Ray instance:
Parquet and JSONL in, Parquet out, vectors against in-process sentence-transformers; bad
rows; resuming; s3:// in and out against a moto server; the ``blitz embed`` command."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from blitz.bulk import embed_dataset
from blitz.config import BlitzSettings, BulkSettings
from deployments.cli import main as blitz_main
from tests.ports import free_port

TEXTS = [f"document number {i} about {'cats' if i % 2 else 'the stock market'}"
         for i in range(40)]


@pytest.fixture(scope="module")
def settings(tiny_models, tmp_path_factory) -> BlitzSettings:
    return BlitzSettings(
        models=[{"id": "tiny-a", "source": str(tiny_models["tiny-a"])}],
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


def read_unit(path: Path) -> pa.Table:
    tables = [pq.read_table(f) for f in sorted(path.glob("*.parquet"))]
    return pa.concat_tables(tables)


def vectors(table: pa.Table) -> np.ndarray:
    return np.stack(table.column("embedding").to_numpy(zero_copy_only=False))


@pytest.mark.integration
def test_parquet_and_jsonl_in_parquet_out_equal_in_process_and_bad_rows_refused(
        serve_instance, settings, tiny_models, reference, corpus, tmp_path):
    out = tmp_path / "out"
    report = embed_dataset(str(corpus), str(out), settings=settings, options=options())
    assert (report.files, report.rows_written, report.refused) == (2, 37, 3)

    model = reference("tiny-a", tiny_models["tiny-a"])
    a = read_unit(out / "a.parquet")
    assert a.column("id").to_pylist() == [f"p{i}" for i in range(30)]
    assert a.schema.field("embedding").type == pa.list_(pa.float32(), 32)
    assert pq.read_metadata(sorted((out / "a.parquet").glob("*.parquet"))[0]).metadata[
        b"blitz.model"] == b"tiny-a"
    expected = model.encode(TEXTS[:30], normalize_embeddings=True)
    cosines = np.sum(vectors(a) * expected, axis=1) / np.linalg.norm(expected, axis=1)
    assert cosines.min() >= 0.9999

    b = read_unit(out / "b.jsonl")  # no id column: the row's position in its file
    kept = [0, 1, 3, 4, 6, 8, 9]
    assert b.column("id").to_pylist() == kept
    np.testing.assert_allclose(vectors(b), model.encode(
        [TEXTS[30 + i] for i in kept], normalize_embeddings=True), atol=1e-5)
    errors = [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]
    assert sorted((e["id"], e["reason"]) for e in errors) == [
        (2, "null text"), (5, "empty text"), (7, "not a string (int)")]
    assert all(e["file"].endswith("b.jsonl") for e in errors)


@pytest.mark.integration
def test_a_rerun_skips_finished_files_and_redoes_interrupted_ones(
        serve_instance, settings, corpus, tmp_path):
    out = tmp_path / "out"
    embed_dataset(str(corpus), str(out), settings=settings, options=options())
    first = read_unit(out / "a.parquet")

    again = embed_dataset(str(corpus), str(out), settings=settings, options=options())
    assert (len(again.skipped), again.rows_written, again.rows_total) == (2, 0, 37)
    assert again.refused == 3  # the errors file still lists the skipped file's refusals

    # an interrupted unit: no _SUCCESS and a stray partial file
    (out / "a.parquet" / "_SUCCESS").unlink()
    pq.write_table(pa.table({"id": ["partial"]}), out / "a.parquet" / "stray.parquet")
    resumed = embed_dataset(str(corpus), str(out), settings=settings, options=options())
    assert [Path(f).name for f in resumed.skipped] == ["b.jsonl"]
    assert resumed.rows_written == 30
    assert read_unit(out / "a.parquet").column("id").to_pylist() == first.column(
        "id").to_pylist()


@pytest.fixture
def s3(monkeypatch):
    """A moto S3 server with a bucket ``bulk``; the environment points boto at it."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    import boto3

    client = boto3.client("s3")
    client.create_bucket(Bucket="bulk")
    try:
        yield client
    finally:
        server.stop()


@pytest.mark.integration
def test_s3_in_and_out(serve_instance, settings, tiny_models, reference, corpus, s3):
    s3.upload_file(str(corpus / "a.parquet"), "bulk", "in/a.parquet")
    report = embed_dataset("s3://bulk/in/", "s3://bulk/out", settings=settings,
                           options=options())
    assert (report.rows_written, report.refused) == (30, 0)
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket="bulk", Prefix="out/")["Contents"]}
    assert {"out/a.parquet/_SUCCESS", "out/errors.jsonl"} <= keys
    parts = sorted(k for k in keys if k.endswith(".parquet"))
    table = pa.concat_tables(
        pq.read_table(io.BytesIO(s3.get_object(Bucket="bulk", Key=k)["Body"].read()))
        for k in parts)
    assert table.column("id").to_pylist() == [f"p{i}" for i in range(30)]
    np.testing.assert_allclose(vectors(table), reference("tiny-a", tiny_models["tiny-a"]).encode(
        TEXTS[:30], normalize_embeddings=True), atol=1e-5)


@pytest.mark.integration
def test_blitz_embed_command(serve_instance, settings, tmp_path, capsys):
    config = tmp_path / "serve_config.yaml"
    models = [m.model_dump(exclude_defaults=True) for m in settings.models]
    config.write_text(json.dumps({"applications": [{"name": "blitz", "args": {
        "models": models, "cache_dir": settings.cache_dir}}]}))
    corpus = tmp_path / "in.csv"
    corpus.write_text("id,text\n1,first line\n2,\n3,third line\n")
    argv = ["embed", str(corpus), str(tmp_path / "out"), "--config", str(config),
            "--dtype", "int8", "--dimensions", "16", "--actors", "1", "--device", "cpu"]
    assert blitz_main(argv) == 0
    printed = capsys.readouterr().out
    assert "wrote 2 rows" in printed and "refused 1 rows" in printed
    table = read_unit(tmp_path / "out" / "in.csv")
    assert table.schema.field("embedding").type == pa.list_(pa.int8(), 16)

    bad = tmp_path / "bad.csv"
    bad.write_text("id,text\n1,\n2,\n")
    assert blitz_main(["embed", str(bad), str(tmp_path / "out2"), "--config", str(config),
                       "--actors", "1", "--device", "cpu"]) == 1  # nothing could be written
