"""The Ray-free half of the bulk job (blitz/bulk.py): batches, refusals, units, errors."""

from __future__ import annotations

import json

import fsspec
import numpy as np
import pyarrow as pa
import pytest

from blitz.bulk import (
    LINE,
    REFUSED,
    BatchEncoder,
    JsonLines,
    RowNumberer,
    check_options,
    finish_unit,
    list_inputs,
    merge_errors,
    refusal,
    reset_unit,
    unit_done,
    unit_name,
    write_error_part,
)
from blitz.config import BulkSettings
from blitz.errors import InvalidValue
from blitz.postprocess import quantize, truncate_dimensions
from blitz.registry import ModelSpec
from tests.tiny_models import build_tiny_bi_encoder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = build_tiny_bi_encoder(tmp_path_factory.mktemp("bulk") / "tiny", hidden=32, seed=5)
    return ModelSpec(id="tiny", source=str(path), prompts={"query": "query: "}), path


def test_good_rows_match_sentence_transformers_and_bad_rows_are_refused(tiny):
    from sentence_transformers import SentenceTransformer

    spec, path = tiny
    encoder = BatchEncoder(spec, BulkSettings())
    texts = np.array(["first text", None, "  ", 7, "a longer second text here", float("nan")],
                     dtype=object)
    table, refused = encoder.encode({"text": texts, "id": np.arange(10, 16)})
    assert table.column("id").to_pylist() == [10, 14]
    assert [(r.id, r.reason) for r in refused] == [
        (11, "null text"), (12, "empty text"), (13, "not a string (int)"), (15, "null text")]
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), 32)
    expected = SentenceTransformer(str(path), device="cpu").encode(
        ["first text", "a longer second text here"], normalize_embeddings=True)
    got = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert all(t > 2 for t in table.column("tokens").to_pylist())
    assert table.schema.metadata[b"blitz.model"] == b"tiny"
    assert table.schema.metadata[b"blitz.backend"] == b"torch"


def test_output_options_are_the_native_apis(tiny):
    spec, _ = tiny
    texts = np.array(["one", "two three"], dtype=object)
    plain = BatchEncoder(spec, BulkSettings()).encode({"text": texts, "id": np.arange(2)})[0]
    values = np.stack(plain.column("embedding").to_numpy(zero_copy_only=False))
    for dtype, dimensions in (("int8", 16), ("binary", None), ("float16", 8)):
        options = BulkSettings(dtype=dtype, dimensions=dimensions)
        table, _ = BatchEncoder(spec, options).encode({"text": texts, "id": np.arange(2)})
        got = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
        np.testing.assert_array_equal(
            got, quantize(truncate_dimensions(values, dimensions, True), dtype))


def test_prompt_name_prefixes_the_texts(tiny):
    spec, _ = tiny
    prompted = BatchEncoder(spec, BulkSettings(prompt_name="query")).encode(
        {"text": np.array(["cats"], dtype=object), "id": np.arange(1)})[0]
    by_hand = BatchEncoder(spec, BulkSettings()).encode(
        {"text": np.array(["query: cats"], dtype=object), "id": np.arange(1)})[0]
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


def test_row_numberer_counts_across_batches():
    number = RowNumberer("id")
    first = number({"text": np.array(["a", "b"], dtype=object)})
    second = number({"text": np.array(["c"], dtype=object)})
    assert list(first["id"]) == [0, 1] and list(second["id"]) == [2]


def test_inputs_units_and_resume_markers(tmp_path):
    fs = fsspec.filesystem("file")
    (tmp_path / "sub").mkdir()
    for name in ("a.parquet", "b.jsonl", "sub/c.csv", "notes.txt", "_hidden.parquet"):
        (tmp_path / name).write_text("x")
    base, files = list_inputs(fs, str(tmp_path))
    assert [unit_name(base, f) for f in files] == ["a.parquet", "b.jsonl", "sub__c.csv"]
    base, files = list_inputs(fs, f"{tmp_path}/*.jsonl")
    assert [unit_name(base, f) for f in files] == ["b.jsonl"]
    with pytest.raises(InvalidValue, match="does not exist"):
        list_inputs(fs, str(tmp_path / "missing"))

    unit = f"{tmp_path}/out/a.parquet"
    assert not unit_done(fs, unit)
    finish_unit(fs, unit)
    assert unit_done(fs, unit)
    reset_unit(fs, unit)
    assert not unit_done(fs, unit) and not fs.exists(unit)


def test_error_parts_merge_into_one_file_and_a_retried_batch_counts_once(tmp_path, tiny):
    spec, _ = tiny
    fs = fsspec.filesystem("file")
    _, refused = BatchEncoder(spec, BulkSettings()).encode(
        {"text": np.array([None, "ok", ""], dtype=object), "id": np.array(["x", "y", "z"])})
    units = [f"{tmp_path}/u1", f"{tmp_path}/u2"]
    write_error_part(fs, units[0], refused, "in/a.jsonl")
    write_error_part(fs, units[0], refused, "in/a.jsonl")  # the same batch, retried
    write_error_part(fs, units[1], [], "in/b.jsonl")
    target = f"{tmp_path}/errors.jsonl"
    assert merge_errors(fs, units, target) == 2
    rows = [json.loads(line) for line in (tmp_path / "errors.jsonl").read_text().splitlines()]
    assert rows == [{"id": "x", "reason": "null text", "file": "in/a.jsonl"},
                    {"id": "z", "reason": "empty text", "file": "in/a.jsonl"}]


def json_batch(*lines: str) -> dict[str, np.ndarray]:
    return {"text": np.array(lines, dtype=object), LINE: np.arange(len(lines))}


def test_json_lines_become_rows_with_reasons_for_the_bad_ones():
    lines = ['{"id": 7, "text": "a cat"}', '{"id": 8, "text": null}', "not json",
             '{"id": "x", "text": "dog"}', '[1, 2]', '{"id": 9, "text": 42}']
    out = JsonLines("text", "id", {"id": 7, "text": "a cat"})(json_batch(*lines))
    assert out["id"].tolist() == [7, 8, 2, 3, 4, 9]
    assert out["text"][0] == "a cat"
    assert out[REFUSED].tolist() == ["", "null text", "not a JSON object",
                                     "id is not an integer", "not a JSON object",
                                     "not a string (int)"]

    no_ids = JsonLines("body", "id", {"body": "x"})(json_batch('{"body": "x"}', '{"body": ""}'))
    assert no_ids["id"].tolist() == [0, 1] and no_ids[REFUSED].tolist() == ["", "empty text"]
    named = JsonLines("text", "id", {"id": "a"})(json_batch('{"id": "a", "text": "t"}',
                                                              '{"text": "u"}'))
    assert named["id"].tolist() == ["a", "1"] and named[REFUSED].tolist() == ["", ""]


def test_reasons_found_by_the_reader_are_kept(tiny):
    encoder = BatchEncoder(tiny[0], BulkSettings())
    table, refused = encoder.encode({"id": np.array([0, 1]), "text": np.array(["ok", ""],
                                     dtype=object), REFUSED: np.array(["", "not a JSON object"],
                                                                      dtype=object)})
    assert table.column("id").to_pylist() == [0]
    assert [(r.id, r.reason) for r in refused] == [(1, "not a JSON object")]


@pytest.mark.parametrize(("cpus", "actors", "claim"), [
    (2, 2, 0.5), (1, 1, 0.0), (16, 4, 1.0), (16, 16, 15 / 16)])
def test_cpu_actors_leave_one_cpu_for_reads_and_writes(monkeypatch, cpus, actors, claim):
    import ray

    from deployments import bulk

    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": float(cpus)})
    assert bulk._actor_cpus(actors) == pytest.approx(claim)
    assert actors * bulk._actor_cpus(actors) <= max(cpus - 1, 0)
