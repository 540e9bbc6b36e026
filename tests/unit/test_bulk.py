"""The Ray-free half of the bulk job: the batch step (blitz/bulk/job.py) and the readers
(blitz/bulk/read.py), each line or row embedded or refused with its reason."""

from __future__ import annotations

import gzip
import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from blitz.bulk.job import BatchEncoder, check_options, list_inputs
from blitz.bulk.read import ID_INT, ID_POSITION, ID_STR, ROWS, iter_lines, read_rows, refusal
from blitz.encoders.postprocess import quantize, truncate_dimensions
from blitz.errors import InvalidValue
from blitz.settings.bulk import BulkSettings
from blitz.settings.registry import ModelSpec
from tests.tiny_models import build_tiny_bi_encoder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = build_tiny_bi_encoder(tmp_path_factory.mktemp("bulk") / "tiny", hidden=32, seed=5)
    return ModelSpec(id="tiny", source=str(path), prompts={"query": "query: "}), path


def rows_of(data: bytes, kind: str, batch_rows: int = 64, max_row_bytes: int = 1 << 20,
            id_column: str = "id") -> pa.Table:
    tables = list(read_rows(io.BytesIO(data), kind, 3, text_column="text",
                            id_column=id_column, batch_rows=batch_rows,
                            max_row_bytes=max_row_bytes))
    assert all(t.schema.equals(ROWS) and t.num_rows <= batch_rows for t in tables)
    return pa.concat_tables(tables) if tables else ROWS.empty_table()


def ids(table: pa.Table) -> list[object]:
    return [s if k == ID_STR else i for i, s, k in zip(
        table.column("_id_int").to_pylist(), table.column("_id_str").to_pylist(),
        table.column("_id_kind").to_pylist(), strict=True)]


def parquet(**columns) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.table(columns), sink)
    return sink.getvalue()


def test_good_rows_match_sentence_transformers_and_refused_rows_pass_through(tiny):
    from sentence_transformers import SentenceTransformer

    spec, path = tiny
    encoder = BatchEncoder(spec, BulkSettings())
    rows = rows_of(parquet(id=list(range(10, 16)), text=["first text", None, "  ", "x" * 0,
                                                           "a longer second text here", "ok"]),
                   "parquet")
    out = encoder.encode(rows)
    assert out.column("_refused").to_pylist() == ["", "null text", "empty text", "empty text",
                                                  "", ""]
    assert out.schema.field("embedding").type == pa.list_(pa.float32(), 32)
    got = np.stack(out.column("embedding").to_numpy(zero_copy_only=False))
    expected = SentenceTransformer(str(path), device="cpu").encode(
        ["first text", "a longer second text here", "ok"], normalize_embeddings=True)
    np.testing.assert_allclose(got[[0, 4, 5]], expected, atol=1e-5)
    assert not got[[1, 2, 3]].any()
    assert all(t > 2 for t in np.asarray(out.column("tokens"))[[0, 4, 5]])
    assert encoder.metadata[b"blitz.backend"] == b"torch"


def test_a_batch_of_refused_rows_has_the_job_s_embedding_type(tiny):
    encoder = BatchEncoder(tiny[0], BulkSettings(dtype="binary", dimensions=16))
    refused = encoder.encode(rows_of(b'{"text": ""}\n', "json"))
    good = encoder.encode(rows_of(b'{"text": "a"}\n', "json"))
    assert refused.schema == good.schema  # one schema for every block of the job
    assert good.schema.field("embedding").type == pa.list_(pa.int8(), 2)


def test_output_options_are_the_native_apis(tiny):
    spec, _ = tiny
    rows = rows_of(b'{"text": "one"}\n{"text": "two three"}\n', "json")
    plain = BatchEncoder(spec, BulkSettings()).encode(rows)
    values = np.stack(plain.column("embedding").to_numpy(zero_copy_only=False))
    for dtype, dimensions in (("int8", 16), ("binary", None), ("float16", 8)):
        table = BatchEncoder(spec, BulkSettings(dtype=dtype, dimensions=dimensions)).encode(rows)
        got = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
        np.testing.assert_array_equal(
            got, quantize(truncate_dimensions(values, dimensions, True), dtype))


def test_prompt_name_prefixes_the_texts(tiny):
    spec, _ = tiny
    prompted = BatchEncoder(spec, BulkSettings(prompt_name="query")).encode(
        rows_of(b'{"text": "cats"}\n', "json"))
    by_hand = BatchEncoder(spec, BulkSettings()).encode(
        rows_of(b'{"text": "query: cats"}\n', "json"))
    assert prompted.column("embedding").to_pylist() == by_hand.column("embedding").to_pylist()


def test_options_the_model_cannot_honour_are_refused_up_front(tiny):
    spec, _ = tiny
    with pytest.raises(InvalidValue, match="prompt_name"):
        check_options(spec, BulkSettings(prompt_name="passage"))
    with pytest.raises(InvalidValue, match="larger than"):
        check_options(spec, BulkSettings(dimensions=33))
    cross = ModelSpec(id="ce", source=str(tiny[1]), kind="cross-encoder")
    with pytest.raises(InvalidValue, match="cross-encoder"):
        check_options(cross, BulkSettings())


def test_refusal_reasons():
    assert refusal("text") is None
    assert refusal(None) == "null text"
    assert refusal("\n\t ") == "empty text"
    assert refusal(b"bytes") == "not a string (bytes)"


# --- JSON lines -------------------------------------------------------------------------

def test_json_lines_become_rows_with_reasons_for_the_bad_ones():
    lines = [b'{"id": 7, "text": "a cat"}', b'{"id": 8, "text": null}', b"not json", b"",
             b'{"id": "x", "text": "dog"}', b"[1, 2]", b'{"id": 9, "text": 42}']
    rows = rows_of(b"\n".join(lines), "json", batch_rows=2)
    assert ids(rows) == [7, 8, 2, 3, 4, 9]  # the blank line is no row
    assert rows.column("_line").to_pylist() == [1, 2, 3, 5, 6, 7]
    assert rows.column("_text").to_pylist()[0] == "a cat"
    assert rows.column("_refused").to_pylist() == [
        "", "null text", "not a JSON object", "id is not an integer", "not a JSON object",
        "not a string (int)"]
    assert set(rows.column("_unit").to_pylist()) == {3}

    no_ids = rows_of(b'{"body": "x"}\n{"body": ""}', "json", id_column="id")
    assert ids(no_ids) == [0, 1] and set(no_ids.column("_id_kind").to_pylist()) == {ID_POSITION}
    named = rows_of(b'{"id": "a", "text": "t"}\n{"text": "u"}\n', "json")
    assert ids(named) == ["a", "1"] and named.column("_refused").to_pylist() == ["", ""]


def test_a_bad_first_line_deep_nesting_and_long_lines_are_refused_rows():
    data = b"\n".join([b"{not json", b"[" * 100_000, b'{"id": 1, "text": "' + b"a" * 300 + b'"}',
                       b"\xff\xfe bytes", b'{"id": 2, "text": "fine"}', b'{"text": "\\ud800"}'])
    rows = rows_of(data, "json", max_row_bytes=200)
    assert rows.column("_refused").to_pylist() == [
        "not a JSON object", "line longer than 200 bytes", "line longer than 200 bytes",
        "not a JSON object", "", "text is not valid Unicode (a lone surrogate)"]
    assert rows.column("_text").to_pylist()[4] == "fine"
    assert ids(rows)[4] == 2


def test_lines_are_split_on_newlines_only_and_long_ones_are_never_joined():
    data = b"a\r\nb\x0bc\x1cd\n" + b"x" * 5000 + b"\n\ntail"
    assert list(iter_lines(io.BytesIO(data), 100)) == [
        (1, b"a"), (2, b"b\x0bc\x1cd"), (3, None), (4, b""), (5, b"tail")]
    assert list(iter_lines(io.BytesIO(b"y" * 3_000_000), 100)) == [(1, None)]


def test_compressed_json_lines(tmp_path):
    import fsspec

    path = tmp_path / "in.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"text": "a"}\n{"text": "b"}\n'))
    with fsspec.open(str(path), "rb", compression="infer") as f:
        tables = list(read_rows(f, "json", 0, text_column="text", id_column="id",
                                batch_rows=10, max_row_bytes=100))
    assert tables[0].column("_text").to_pylist() == ["a", "b"]


# --- CSV and Parquet --------------------------------------------------------------------

def test_csv_rows_of_another_length_and_bad_bytes_are_refused_not_the_file():
    data = (b'id,text\n1,first\n3,a,extra\n2,"two\nlines"\n4,\xff\xfe\n5,\n6,last\n')
    rows = rows_of(data, "csv")
    good = rows.filter(pa.compute.equal(rows.column("_refused"), ""))
    assert ids(good) == [1, 2, 6] and good.column("_text").to_pylist() == [
        "first", "two\nlines", "last"]
    reasons = dict(zip(ids(rows), rows.column("_refused").to_pylist(), strict=True))
    assert reasons[4] == "text is not valid UTF-8" and reasons[5] == "empty text"
    malformed = rows.filter(pa.compute.equal(rows.column("_row"), -1))
    assert malformed.column("_refused").to_pylist() == ["row has 3 cells, the header 2"]
    assert malformed.column("_line").to_pylist() == [3]


def test_csv_ids_are_integers_when_they_all_are_else_strings():
    assert set(rows_of(b"id,text\n1,a\n2,b\n", "csv").column("_id_kind").to_pylist()) == {
        ID_INT}
    named = rows_of(b"id,text\nx1,a\n2,b\n,c\n", "csv")
    assert ids(named) == ["x1", "2", "2"]  # an empty id is the row's position
    late = rows_of(b"id,text\n1,a\n2,b\nz,c\n", "csv", batch_rows=2)
    assert late.column("_refused").to_pylist() == ["", "", "id is not an integer"]
    assert rows_of(b"", "csv").num_rows == 0
    assert ids(rows_of(b"text\nonly\n", "csv")) == [0]


def test_parquet_columns_of_any_type():
    rows = rows_of(parquet(id=["a", None, "c"], text=["x", "y", None]), "parquet")
    assert ids(rows) == ["a", "1", "c"]
    assert rows.column("_refused").to_pylist() == ["", "", "null text"]
    numbers = rows_of(parquet(id=[1, 2], text=pa.array([1, 2])), "parquet")
    assert numbers.column("_refused").to_pylist() == ["not a string (int)"] * 2
    unsigned = rows_of(parquet(id=pa.array([1, 2**64 - 1], pa.uint64()), text=["a", "b"]),
                       "parquet")
    assert unsigned.column("_refused").to_pylist() == [
        "", "id is outside the 64-bit integer range"]
    binary = rows_of(parquet(text=pa.array([b"ok", b"\xff"]), id=[1.5, 2.5]), "parquet")
    assert ids(binary) == ["1.5", "2.5"]
    assert binary.column("_refused").to_pylist() == ["", "text is not valid UTF-8"]
    long = rows_of(parquet(text=["a" * 50]), "parquet", max_row_bytes=10)
    assert long.column("_refused").to_pylist() == ["text longer than 10 bytes"]


def test_inputs_are_listed_with_hidden_and_unknown_files_left_out(tmp_path):
    import fsspec

    fs = fsspec.filesystem("file")
    (tmp_path / "sub").mkdir()
    for name in ("a.parquet", "b.jsonl", "sub/c.csv", "notes.txt", "_hidden.parquet"):
        (tmp_path / name).write_text("x")
    base, files = list_inputs(fs, str(tmp_path))
    assert [f[len(base) + 1:] for f in files] == ["a.parquet", "b.jsonl", "sub/c.csv"]
    with pytest.raises(InvalidValue, match="does not exist"):
        list_inputs(fs, str(tmp_path / "missing"))


def test_links_to_folders_inside_input_are_followed_and_loops_refused(tmp_path):
    import fsspec

    fs = fsspec.filesystem("file")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "b.csv").write_text("x")
    root = tmp_path / "in"
    (root / "sub").mkdir(parents=True)
    (root / "a.csv").write_text("x")
    (root / "linked").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (root / "c.csv").symlink_to(tmp_path / "elsewhere" / "b.csv")
    base, files = list_inputs(fs, str(root))
    assert [f[len(base) + 1:] for f in files] == ["a.csv", "c.csv", "linked/b.csv"]
    (root / "sub" / "back").symlink_to(root, target_is_directory=True)
    with pytest.raises(InvalidValue, match="a folder that holds it"):
        list_inputs(fs, str(root))
