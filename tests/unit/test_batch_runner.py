"""The batch runner's Ray-free half (``blitz.batches``): input lines read once and linearly,
pieces run exactly once across a crash, a cancel and an expiry keeping what was done and
naming every other request, retention deleting only what the batch API wrote."""

from __future__ import annotations

import io
import json
import time

import pytest

from blitz.batches import lines as batch_lines
from blitz.batches import objects
from blitz.batches.runner import BatchRunner, local_engine
from blitz.batches.store import Store, new_id
from blitz.errors import InvalidValue
from blitz.settings.batches import BatchSettings

ENDPOINT = "/v1/embeddings"


def request(custom_id: str, text: str = "x", url: str = ENDPOINT) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url,
                       "body": {"input": text}})


# --- lines ------------------------------------------------------------------------------

def test_lines_at_gives_each_line_its_offset_and_skips_long_ones_unjoined():
    body = b"ab\r\ncdefgh\n\nij"
    found = list(batch_lines.lines_at(io.BytesIO(body), max_bytes=4))
    assert found == [(0, b"ab"), (4, None), (11, b""), (12, b"ij")]
    assert list(batch_lines.lines_at(io.BytesIO(body), 4, offset=4))[0] == (4, None)


def test_lines_at_reads_lines_that_cross_its_reads(monkeypatch):
    monkeypatch.setattr(batch_lines, "READ", 3)
    body = b"one\ntwo two\nthree"
    assert list(batch_lines.lines_at(io.BytesIO(body), 100)) == [
        (0, b"one"), (4, b"two two"), (12, b"three")]


def test_check_line_names_what_is_wrong():
    assert batch_lines.check_line(b"{nope", ENDPOINT, 100).code == "invalid_json_line"
    assert batch_lines.check_line(b"[1]", ENDPOINT, 100).code == "invalid_json_line"
    assert batch_lines.check_line(b'{"url": "/v1/embeddings"}', ENDPOINT,
                                  100).code == "invalid_custom_id"
    wrong = batch_lines.check_line(request("a", url="/embed").encode(), ENDPOINT, 1000)
    assert (wrong.custom_id, wrong.code) == ("a", "mismatched_url")
    good = batch_lines.check_line(request("a", "héllo").encode(), ENDPOINT, 1000)
    assert good.custom_id == "a" and json.loads(good.body) == {"input": "héllo"}
    assert batch_lines.check_line(None, ENDPOINT, 10).code == "line_too_long"


def test_plan_cuts_pieces_writes_bad_lines_and_fails_a_repeated_custom_id():
    text = "\n".join([request("a"), "oops", request("b"), "", request("c"),
                      request("d", url="/rerank"), request("e")]) + "\n"
    bad = io.BytesIO()
    found = batch_lines.plan(io.BytesIO(text.encode()), ENDPOINT, 10_000, 2, 100, bad)
    assert (found.total, found.bad, found.problems) == (6, 2, [])
    assert [p["lines"] for p in found.pieces] == [2, 2]
    errors = [json.loads(line) for line in bad.getvalue().splitlines()]
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [
        (None, "invalid_json_line"), ("d", "mismatched_url")]
    f = io.BytesIO(text.encode())
    assert [c for c, _ in batch_lines.piece_lines(f, found.pieces[1], ENDPOINT, 10_000)] == [
        "c", "e"]

    twice = (request("a") + "\n" + request("a") + "\n").encode()
    failed = batch_lines.plan(io.BytesIO(twice), ENDPOINT, 10_000, 2, 100, io.BytesIO())
    assert [p["code"] for p in failed.problems] == ["duplicate_custom_id"]
    many = batch_lines.plan(io.BytesIO(("\n".join(request(str(i)) for i in range(5))).encode()),
                            ENDPOINT, 10_000, 2, 3, io.BytesIO())
    assert [p["code"] for p in many.problems] == ["too_many_requests"]
    empty = batch_lines.plan(io.BytesIO(b"\n\n"), ENDPOINT, 100, 2, 3, io.BytesIO())
    assert [p["code"] for p in empty.problems] == ["empty_file"]


def test_an_output_line_is_json_with_the_reply_as_it_came():
    line = batch_lines.output_line('c"1', 200, "rid", b'{"data": [1, 2]}')
    row = json.loads(line)
    assert row["custom_id"] == 'c"1' and row["error"] is None
    assert row["response"] == {"status_code": 200, "request_id": "rid",
                               "body": {"data": [1, 2]}}
    assert json.loads(batch_lines.output_line("c", 500, "", b"oops"))["response"]["body"] == "oops"


# --- the runner ---------------------------------------------------------------------------

class Clock:
    def __init__(self, now: float = 1_800_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def answer(endpoint: str, bodies: list[bytes]) -> list[tuple[int, str, bytes]]:
    """Echo each request's input; "fail" is answered 422."""
    replies = []
    for body in bodies:
        text = json.loads(body)["input"]
        status = 422 if text == "fail" else 200
        replies.append((status, "rid-" + text, json.dumps({"echo": text}).encode()))
    return replies


def make_batch(store: Store, owner: str, rows: list[str], clock: Clock,
               window_s: int = 3600) -> dict:
    store.ensure()
    file_id = new_id("file-")
    store.put(store.file_path(owner, file_id, "data"), ("\n".join(rows) + "\n").encode())
    store.put_json(store.file_path(owner, file_id, "json"), objects.file_object(
        file_id, "in.jsonl", "batch", 1, int(clock()), None))
    record = objects.batch_object(new_id("batch_"), ENDPOINT, file_id, "1h", int(clock()),
                                  int(clock()) + window_s, None)
    store.save_batch(owner, record)
    store.mark_open(owner, record["id"])
    return record


def runner_for(store: Store, clock: Clock, call=answer, **settings) -> BatchRunner:
    options = BatchSettings(chunk_lines=3, concurrency=2, poll_s=0.01, **settings)
    return BatchRunner(store, options, 10_000,
                       local_engine(store, lambda owner: call, options.concurrency, 10_000),
                       clock=clock)


def results(store: Store, owner: str, record: dict) -> tuple[list[dict], list[dict]]:
    def read(file_id):
        if file_id is None:
            return []
        return [json.loads(line) for line in b"".join(store.read_chunks(owner, file_id))
                .splitlines()]
    return read(record["output_file_id"]), read(record["error_file_id"])


def exactly_once(out: list[dict], err: list[dict], ids: list[str]) -> None:
    seen = [row["custom_id"] for row in out + err if row["custom_id"] is not None]
    assert sorted(seen) == sorted(ids)


def test_a_batch_runs_to_completed_with_each_custom_id_once(tmp_path):
    store, clock = Store(str(tmp_path / "s")), Clock()
    ids = [f"r{i}" for i in range(10)]
    rows = [request(i, "fail" if i == "r4" else i) for i in ids] + ["not json"]
    batch = make_batch(store, "public", rows, clock)
    runner_for(store, clock).tick()
    record = store.batch("public", batch["id"])
    assert record["status"] == "completed" and record["completed_at"] == int(clock())
    assert record["request_counts"] == {"total": 11, "completed": 9, "failed": 2}
    out, err = results(store, "public", record)
    exactly_once(out, err, ids)
    assert {row["custom_id"]: row["response"]["body"]["echo"] for row in out}["r3"] == "r3"
    assert [row["response"]["status_code"] for row in err if row["response"]] == [422]
    assert store.part_names("public", batch["id"]) == []  # the parts joined, then removed
    assert store.file_meta("public", record["output_file_id"])["purpose"] == "batch_output"


def test_a_runner_stopped_mid_batch_is_resumed_by_the_next_without_redoing_pieces(tmp_path):
    store, clock = Store(str(tmp_path / "s")), Clock()
    ids = [f"r{i}" for i in range(12)]
    batch = make_batch(store, "public", [request(i, i) for i in ids], clock)
    calls: list[int] = []

    def dies_on_third(endpoint, bodies):
        calls.append(len(bodies))
        if len(calls) == 3:
            raise RuntimeError("the worker was killed")
        return answer(endpoint, bodies)

    with pytest.raises(RuntimeError):
        runner_for(store, clock, dies_on_third).tick()
    partial = store.batch("public", batch["id"])
    assert partial["status"] == "in_progress"
    assert 0 < partial["request_counts"]["completed"] < 12
    sent_again: list[int] = []

    def counting(endpoint, bodies):
        sent_again.append(len(bodies))
        return answer(endpoint, bodies)

    runner_for(store, clock, counting).tick()
    record = store.batch("public", batch["id"])
    assert record["status"] == "completed"
    assert record["request_counts"] == {"total": 12, "completed": 12, "failed": 0}
    assert sum(calls) - calls[2] + sum(sent_again) == 12  # each line answered once
    out, err = results(store, "public", record)
    exactly_once(out, err, ids)
    assert err == []


def test_a_cancel_stops_between_pieces_and_keeps_what_was_done(tmp_path):
    store, clock = Store(str(tmp_path / "s")), Clock()
    ids = [f"r{i}" for i in range(30)]
    batch = make_batch(store, "public", [request(i, i) for i in ids], clock)

    def cancels_after_first(endpoint, bodies):
        store.ask_cancel("public", batch["id"], clock())
        time.sleep(0.05)  # a piece outlasts poll_s: the runner looks between pieces
        return answer(endpoint, bodies)

    runner = runner_for(store, clock, cancels_after_first)
    runner.tick()
    record = store.batch("public", batch["id"])
    assert record["status"] == "cancelled" and record["cancelled_at"] is not None
    counts = record["request_counts"]
    assert 0 < counts["completed"] < 30 and counts["completed"] + counts["failed"] == 30
    out, err = results(store, "public", record)
    exactly_once(out, err, ids)
    assert {row["error"]["code"] for row in err} == {"batch_cancelled"}


def test_a_batch_past_its_window_expires_with_its_done_lines(tmp_path):
    store, clock = Store(str(tmp_path / "s")), Clock()
    ids = [f"r{i}" for i in range(9)]
    batch = make_batch(store, "public", [request(i, i) for i in ids], clock, window_s=10)
    runner = runner_for(store, clock)
    runner.start_new()
    clock.now += 11
    runner.tick()
    record = store.batch("public", batch["id"])
    assert record["status"] == "expired" and record["expired_at"] == int(clock())
    out, err = results(store, "public", record)
    exactly_once(out, err, ids)
    assert {row["error"]["code"] for row in err} == {"batch_expired"}


def test_a_cancel_before_the_batch_starts_ends_it_without_running_a_line(tmp_path):
    store, clock = Store(str(tmp_path / "s")), Clock()
    batch = make_batch(store, "public", [request("a")], clock)
    store.ask_cancel("public", batch["id"], clock())

    def never(endpoint, bodies):
        raise AssertionError("no line runs")

    runner_for(store, clock, never).tick()
    record = store.batch("public", batch["id"])
    assert (record["status"], record["output_file_id"]) == ("cancelled", None)


def test_a_finalize_cut_off_is_done_again_into_the_same_files(tmp_path, monkeypatch):
    store, clock = Store(str(tmp_path / "s")), Clock()
    ids = [f"r{i}" for i in range(5)]
    batch = make_batch(store, "public", [request(i, i) for i in ids], clock)

    def cut_off(*args, **kwargs):
        raise RuntimeError("the runner stopped while finalizing")

    stopped = runner_for(store, clock)
    monkeypatch.setattr(stopped, "_join", cut_off)
    with pytest.raises(RuntimeError):
        stopped.tick()
    left = store.batch("public", batch["id"])
    assert left["status"] == "finalizing"
    runner_for(store, clock).tick()
    done = store.batch("public", batch["id"])
    assert done["status"] == "completed" and done["output_file_id"] == left["_output_id"]
    out, err = results(store, "public", done)
    exactly_once(out, err, ids)


def test_a_failed_batch_says_why(tmp_path):
    store, clock = Store(str(tmp_path / "s")), Clock()
    batch = make_batch(store, "public", [request("a"), request("a")], clock)
    runner_for(store, clock).tick()
    record = store.batch("public", batch["id"])
    assert record["status"] == "failed"
    assert record["errors"]["data"][0]["code"] == "duplicate_custom_id"
    assert record["errors"]["data"][0]["line"] == 2


def test_retention_deletes_old_files_and_batches_and_nothing_else(tmp_path):
    store, clock = Store(str(tmp_path / "s")), Clock()
    batch = make_batch(store, "public", [request("a")], clock)
    runner = runner_for(store, clock, retention_s=100)
    runner.tick()
    record = store.batch("public", batch["id"])
    meta = store.file_meta("public", record["output_file_id"])
    assert meta["expires_at"] == int(clock()) + 100
    foreign = tmp_path / "s" / "public" / "files" / "notes.txt"
    foreign.write_text("mine")
    clock.now += 101
    runner.sweep()
    assert store.file_meta("public", record["output_file_id"]) is None
    assert store.batch("public", batch["id"]) is None
    assert foreign.read_text() == "mine"


def test_storage_holding_foreign_files_is_refused_untouched(tmp_path):
    place = tmp_path / "taken"
    place.mkdir()
    (place / "data.csv").write_text("x")
    with pytest.raises(InvalidValue, match="did not write"):
        Store(str(place)).ensure()
    assert (place / "data.csv").read_text() == "x"


def test_ids_from_a_url_never_name_a_path(tmp_path):
    store = Store(str(tmp_path / "s"))
    store.ensure()
    assert store.file_meta("public", "../../etc/passwd") is None
    assert store.batch("public", "batch_../x") is None
    with pytest.raises(ValueError):
        store.owner_dir("../x")


@pytest.fixture
def s3_bucket(monkeypatch):
    """A moto S3 server on loopback with a bucket ``batches``; stopped afterwards."""
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    from tests.moto_s3 import moto_s3

    with moto_s3(monkeypatch, "batches"):
        yield "s3://batches/blitz"


def test_a_batch_runs_on_an_object_store_prefix_as_on_a_folder(s3_bucket):
    store, clock = Store(s3_bucket), Clock()
    assert not store.local
    ids = [f"r{i}" for i in range(7)]
    batch = make_batch(store, "key-0123456789abcdef", [request(i, i) for i in ids], clock)
    runner = runner_for(store, clock)
    runner.tick()
    record = store.batch("key-0123456789abcdef", batch["id"])
    assert record["status"] == "completed"
    out, err = results(store, "key-0123456789abcdef", record)
    exactly_once(out, err, ids)
    assert store.part_names("key-0123456789abcdef", batch["id"]) == []
    assert store.owners() == ["key-0123456789abcdef"]
