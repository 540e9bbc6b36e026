"""``blitz batch``: the command's requests and exit statuses against a recording
``httpx.MockTransport`` that plays a tiny Files and Batches server (the client's argument
handling only; the real API is tested where it is served)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from blitz import cli
from blitz.batches.client import (
    BatchClient,
    BatchUsageError,
    add_batch_command,
    corpus_lines,
)

REQUEST = {"custom_id": "a", "method": "POST", "url": "/embed",
           "body": {"model": "minilm", "inputs": "hello"}}


class FakeServer:
    """Files and Batches in memory; every request recorded. A batch reports
    ``in_progress`` for ``polls`` retrievals, then ``final`` with ``failed`` failures."""

    def __init__(self, polls: int = 2, final: str = "completed", failed: int = 0):
        self.requests: list[httpx.Request] = []
        self.files: dict[str, bytes] = {}
        self.batches: dict[str, dict[str, Any]] = {}
        self.polls, self.final, self.failed = polls, final, failed
        self.refuse: tuple[int, dict[str, Any]] | None = None  # a canned error for POST batches

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        path, method = request.url.path, request.method
        if method == "POST" and path == "/v1/files":
            file_id = f"file-{len(self.files)}"
            self.files[file_id] = _multipart_file(request)
            return httpx.Response(200, json={"id": file_id, "object": "file",
                                             "purpose": "batch"})
        if method == "GET" and path.endswith("/content"):
            return httpx.Response(200, content=self.files[path.split("/")[3]])
        if method == "DELETE" and path.startswith("/v1/files/"):
            return httpx.Response(200, json={"id": path.split("/")[3], "deleted": True})
        if method == "POST" and path == "/v1/batches":
            if self.refuse:
                return httpx.Response(self.refuse[0], json=self.refuse[1])
            body = json.loads(request.content)
            batch = {"id": f"batch_{len(self.batches)}", "object": "batch",
                     "status": "validating", "endpoint": body["endpoint"],
                     "input_file_id": body["input_file_id"], "output_file_id": None,
                     "error_file_id": None, "metadata": body.get("metadata"),
                     "request_counts": {"total": 0, "completed": 0, "failed": 0}, "seen": 0}
            self.batches[batch["id"]] = batch
            return httpx.Response(200, json=batch)
        if method == "GET" and path.startswith("/v1/batches/"):
            found = self.batches.get(path.split("/")[3])
            if found is None:
                return httpx.Response(404, json={"error": {
                    "message": "no batch with that id", "type": "not_found_error",
                    "param": None, "code": "not_found"}})
            return httpx.Response(200, json=self._advance(found))
        if method == "GET" and path == "/v1/batches":
            data = list(self.batches.values())[: int(request.url.params["limit"])]
            return httpx.Response(200, json={"object": "list", "data": data, "has_more": True,
                                             "first_id": None, "last_id": "batch_9"})
        if method == "POST" and path.endswith("/cancel"):
            batch = self.batches[path.split("/")[3]]
            batch["status"] = "cancelling"
            return httpx.Response(200, json=batch)
        return httpx.Response(404, json={"error": {"message": f"no route {path}"}})

    def _advance(self, batch: dict[str, Any]) -> dict[str, Any]:
        batch["seen"] += 1
        total = len(self.files[batch["input_file_id"]].splitlines())
        if batch["seen"] <= self.polls:
            batch.update(status="in_progress", request_counts={
                "total": total, "completed": min(batch["seen"], total), "failed": 0})
            return batch
        if batch["status"] != self.final:
            batch["status"] = self.final
            batch["request_counts"] = {"total": total, "completed": total - self.failed,
                                       "failed": self.failed}
            if self.final == "completed":
                self.files["file-out"] = b'{"custom_id": "a", "response": {}}\n' * 3
                batch["output_file_id"] = "file-out"
                if self.failed:
                    self.files["file-err"] = b'{"custom_id": "b", "error": {}}\n'
                    batch["error_file_id"] = "file-err"
            else:
                batch["errors"] = {"data": [{"line": 1, "message": "bad line"}]}
        return batch


def _multipart_file(request: httpx.Request) -> bytes:
    """The ``file`` field's bytes of a multipart body, after checking ``purpose=batch``."""
    content = request.content
    assert b'name="purpose"\r\n\r\nbatch\r\n' in content
    head, _, rest = content.partition(b'name="file"; filename=')
    assert rest, content[:300]
    data = rest.partition(b"\r\n\r\n")[2]
    boundary = request.headers["content-type"].split("boundary=")[1].encode()
    return data.rpartition(b"\r\n--" + boundary)[0]


def run(argv: list[str], server: FakeServer) -> int:
    """``blitz batch ...`` on ``server``: the command as blitz.cli registers it, with the
    mock transport and a 1 ms poll."""
    parser = argparse.ArgumentParser(prog="blitz")
    add_batch_command(parser.add_subparsers(dest="command", required=True),
                      transport=server.transport())
    args = parser.parse_args(["batch", *argv])
    args.poll_sleep = lambda s: None
    return int(args.run(args, sys.stdout))


@pytest.fixture
def requests_file(tmp_path: Path) -> Path:
    path = tmp_path / "requests.jsonl"
    path.write_text("\n".join(json.dumps({**REQUEST, "custom_id": c}) for c in "abc") + "\n")
    return path


def test_submit_uploads_for_batch_and_creates_the_batch(requests_file, capsys):
    server = FakeServer()
    code = run(["submit", str(requests_file), "--metadata", "job=nightly", "owner=me",
                "--api-key", "sk-1"], server)
    assert code == 0
    assert capsys.readouterr().out == "batch_0\n"
    upload, create = server.requests
    assert (upload.method, upload.url.path) == ("POST", "/v1/files")
    assert upload.headers["authorization"] == "Bearer sk-1"
    assert server.files["file-0"] == requests_file.read_bytes()
    body = json.loads(create.content)
    assert body == {"input_file_id": "file-0", "endpoint": "/embed",  # the lines' url
                    "completion_window": "24h", "metadata": {"job": "nightly", "owner": "me"}}


def test_submit_endpoint_option_and_json(requests_file, capsys):
    server = FakeServer()
    assert run(["submit", str(requests_file), "--endpoint", "/v1/embeddings", "--json"],
               server) == 0
    assert json.loads(capsys.readouterr().out)["endpoint"] == "/v1/embeddings"
    assert "metadata" not in json.loads(server.requests[1].content)


def test_wait_polls_to_completion_and_downloads(requests_file, tmp_path, capsys):
    server = FakeServer(polls=3)
    out = tmp_path / "out.jsonl"
    code = run(["submit", str(requests_file), "--wait", "--output", str(out),
                "--errors", str(tmp_path / "err.jsonl"), "--poll-s", "0.001"], server)
    assert code == 0
    assert out.read_bytes() == server.files["file-out"]
    assert not (tmp_path / "err.jsonl").exists()  # no error file: nothing failed
    assert not list(tmp_path.glob("*.part"))
    captured = capsys.readouterr()
    assert captured.out == "batch_0\n"
    assert "1/3 done" in captured.err and "3/3 done, 0 failed" in captured.err
    polls = [r for r in server.requests if r.url.path == "/v1/batches/batch_0"]
    assert len(polls) == 4


def test_some_failed_requests_exit_3_with_the_errors_file(requests_file, tmp_path):
    server = FakeServer(polls=0, failed=1)
    err = tmp_path / "err.jsonl"
    assert run(["submit", str(requests_file), "--output", str(tmp_path / "o.jsonl"),
                "--errors", str(err)], server) == 3
    assert err.read_bytes() == server.files["file-err"]


@pytest.mark.parametrize("final", ["failed", "expired", "cancelled"])
def test_a_batch_that_did_not_complete_exits_1(requests_file, final, capsys):
    server = FakeServer(polls=1, final=final)
    assert run(["submit", str(requests_file), "--wait"], server) == 1
    assert "line 1: bad line" in capsys.readouterr().err


def test_an_http_error_prints_the_server_message(requests_file, capsys):
    server = FakeServer()
    server.refuse = (400, {"error": {"message": "endpoint /nope is not supported",
                                     "type": "invalid_request_error", "param": "endpoint",
                                     "code": "invalid_value"}})
    assert run(["submit", str(requests_file), "--endpoint", "/nope"], server) == 1
    err = capsys.readouterr().err
    assert "400 endpoint /nope is not supported" in err and "param endpoint" in err
    assert server.requests[-1].method == "DELETE"  # the orphan upload removed
    assert run(["status", "batch_404"], server) == 1
    assert "404 no batch with that id" in capsys.readouterr().err


def test_status_list_cancel_results(requests_file, tmp_path, capsys):
    server = FakeServer(polls=0)
    run(["submit", str(requests_file)], server)
    capsys.readouterr()
    assert run(["status", "batch_0"], server) == 0
    assert capsys.readouterr().out.startswith("batch_0: completed /embed, 3/3 done")
    assert run(["list", "--limit", "5"], server) == 0
    captured = capsys.readouterr()
    assert captured.out.count("batch_0") == 1 and "--after batch_9" in captured.err
    assert server.requests[-1].url.params["limit"] == "5"
    out = tmp_path / "r.jsonl"
    assert run(["results", "batch_0", "--output", str(out)], server) == 0
    assert out.read_bytes() == server.files["file-out"]
    assert run(["cancel", "batch_0", "--json"], server) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "cancelling"
    assert server.requests[-1].url.path == "/v1/batches/batch_0/cancel"


def test_results_of_an_unfinished_batch_exit_1(requests_file, tmp_path, capsys):
    server = FakeServer(polls=5)
    run(["submit", str(requests_file)], server)
    assert run(["results", "batch_0", "--output", str(tmp_path / "o")], server) == 1
    assert "in_progress: no results yet" in capsys.readouterr().err


def test_from_corpus_builds_request_lines(tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": 7, "text": "one"}\n\n{"text": "two"}\n')
    server = FakeServer()
    assert run(["submit", str(corpus), "--from-corpus", "--model", "minilm"], server) == 0
    lines = [json.loads(line) for line in server.files["file-0"].splitlines()]
    assert [(line["custom_id"], line["body"]) for line in lines] == [
        ("7", {"model": "minilm", "input": "one"}), ("1", {"model": "minilm", "input": "two"})]
    assert json.loads(server.requests[1].content)["endpoint"] == "/v1/embeddings"
    assert "rows as" in capsys.readouterr().err


def test_corpus_lines_ids_and_texts_per_line(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps(row) + "\n" for row in (
        {"id": "a", "text": "t0"}, {"id": 5, "text": "t1"}, {"text": "t2"},
        {"id": "d", "text": "t3"}, {"id": "e", "text": "t4"})))
    dst = tmp_path / "r.jsonl"
    assert corpus_lines(corpus, dst, model="minilm") == (5, 5)
    lines = [json.loads(line) for line in dst.read_text().splitlines()]
    assert [line["custom_id"] for line in lines] == ["a", "5", "2", "d", "e"]
    assert lines[0] == {"custom_id": "a", "method": "POST", "url": "/v1/embeddings",
                        "body": {"model": "minilm", "input": "t0"}}
    assert corpus_lines(corpus, dst, texts_per_line=2, endpoint="/embed") == (5, 3)
    lines = [json.loads(line) for line in dst.read_text().splitlines()]
    assert [line["custom_id"] for line in lines] == ["a..5", "2..d", "e..e"]
    assert [line["body"] for line in lines] == [
        {"inputs": ["t0", "t1"]}, {"inputs": ["t2", "t3"]}, {"inputs": ["t4"]}]
    assert all(line["url"] == "/embed" for line in lines)


def test_corpus_columns(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"doc": "x", "body": "hi"}\n')
    dst = tmp_path / "r.jsonl"
    corpus_lines(corpus, dst, text_column="body", id_column="doc")
    assert json.loads(dst.read_text())["custom_id"] == "x"


@pytest.mark.parametrize("row, message", [
    ('{"id": 1}', "line 2: no text in column 'text'"),
    ('{"id": 1, "text": "  "}', "line 2: no text"),
    ('{"id": 1, "text": 3}', "line 2: no text"),
    ('[1, 2]', "line 2: not a JSON object"),
    ('{"id": [1], "text": "x"}', "line 2: the id"),
    ('{oops', "line 2: not JSON"),
])
def test_corpus_rows_without_text_are_refused(tmp_path, row, message):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": 0, "text": "ok"}\n' + row + "\n")
    with pytest.raises(BatchUsageError, match=message.replace("(", r"\(")):
        corpus_lines(corpus, tmp_path / "r.jsonl")


def test_usage_errors_exit_2_before_any_request(tmp_path, requests_file, capsys):
    server = FakeServer()
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": 0}\n')
    assert run(["submit", str(corpus), "--from-corpus"], server) == 2
    assert "line 1: no text" in capsys.readouterr().err
    assert run(["submit", str(tmp_path / "missing.jsonl")], server) == 2
    assert run(["submit", str(requests_file), "--metadata", "novalue"], server) == 2
    assert run(["submit", str(requests_file), "--model", "m"], server) == 2
    assert run(["submit", str(corpus), "--from-corpus", "--endpoint", "/rerank"], server) == 2
    assert run(["submit", str(requests_file), "--output", str(tmp_path / "no/dir/o")],
               server) == 2
    assert server.requests == []
    with pytest.raises(SystemExit) as exit_:
        run(["submit"], server)
    assert exit_.value.code == 2


def test_unreachable_server_names_the_url(requests_file, capsys):
    """Through blitz.cli.main, on a port nobody listens on (refused at once)."""
    assert cli.main(["batch", "status", "batch_1", "--url", "http://127.0.0.1:9/"]) == 1
    err = capsys.readouterr().err
    assert "cannot reach the server at http://127.0.0.1:9" in err


def test_client_download_streams_in_chunks(tmp_path):
    payload = b"x" * (3 << 20)
    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=payload))
    with BatchClient("http://blitz", transport=transport) as client:
        assert client.download("file-1", tmp_path / "o") == len(payload)
    assert (tmp_path / "o").read_bytes() == payload
