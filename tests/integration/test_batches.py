"""The batch API on the main app (tests/integration/conftest.py): OpenAI's SDK uploads,
creates, watches, lists and cancels batches, whose lines run through the ingress's routes at
priority low on the bulk path (Ray Data); the ``blitz batch`` command and the handle drive
the same API. Restarts and killed runners are tests/faults/test_batch_restart.py's."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import numpy as np
import openai
import pytest

from tests.integration.conftest import APP, BATCH_PIECE

ENDED = ("completed", "failed", "expired", "cancelled")


@pytest.fixture
def client(blitz_app):
    with openai.OpenAI(base_url=blitz_app + "/v1", api_key="unused", max_retries=0,
                       timeout=60) as sdk:
        yield sdk


def request_lines(texts: list[str], url: str = "/v1/embeddings", model: str = "minilm",
                  field: str = "input") -> bytes:
    return "".join(json.dumps({"custom_id": f"doc-{i}", "method": "POST", "url": url,
                               "body": {"model": model, field: text}}) + "\n"
                   for i, text in enumerate(texts)).encode()


def wait_ended(client: openai.OpenAI, batch_id: str, timeout_s: float = 120) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ENDED:
            return batch
        time.sleep(0.3)
    raise AssertionError(f"batch {batch_id} did not end within {timeout_s} s: {batch}")


def rows_of(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).content.splitlines()]


TEXTS = [f"batch document {i} about {'rivers' if i % 3 else 'markets'}" for i in range(23)]


def test_the_openai_sdk_runs_an_embeddings_batch_with_the_served_vectors(client):
    body = request_lines(TEXTS).splitlines()
    body.insert(4, b'{"custom_id": "broken", "method": "POST"')  # not JSON: an error line
    body.append(json.dumps({"custom_id": "no-model", "method": "POST",
                            "url": "/v1/embeddings",
                            "body": {"model": "absent", "input": "x"}}).encode())
    file = client.files.create(file=("corpus.jsonl", b"\n".join(body) + b"\n"),
                               purpose="batch")
    batch = client.batches.create(input_file_id=file.id, endpoint="/v1/embeddings",
                                  completion_window="24h", metadata={"run": "it"})
    done = wait_ended(client, batch.id)
    assert done.status == "completed", done
    counts = done.request_counts
    assert (counts.total, counts.completed, counts.failed) == (25, 23, 2)
    out, err = rows_of(client, done.output_file_id), rows_of(client, done.error_file_id)
    ids = [r["custom_id"] for r in out + err if r["custom_id"]]
    assert sorted(ids) == sorted([f"doc-{i}" for i in range(23)] + ["no-model"])
    assert {r["response"]["status_code"] for r in out} == {200}
    [missing] = [r for r in err if r["custom_id"] == "no-model"]
    assert missing["response"]["status_code"] == 404
    assert [r["error"]["code"] for r in err if r["error"]] == ["invalid_json_line"]
    direct = client.embeddings.create(model="minilm", input=TEXTS, encoding_format="float")
    by_id = {r["custom_id"]: r["response"]["body"]["data"][0]["embedding"] for r in out}
    got = np.array([by_id[f"doc-{i}"] for i in range(23)], np.float32)
    want = np.array([d.embedding for d in direct.data], np.float32)
    assert float((got * want).sum(axis=1).min()) > 0.9999  # one vector per text, batched
    assert done.id in [b.id for b in client.batches.list(limit=100).data]
    assert client.files.retrieve(done.output_file_id).purpose == "batch_output"


def test_rerank_and_embed_run_as_batch_endpoints(client):
    rerank = "".join(json.dumps({
        "custom_id": f"q{i}", "method": "POST", "url": "/rerank",
        "body": {"model": "tiny-ce", "query": f"question {i}",
                 "documents": ["first answer", "second answer", "third"]}}) + "\n"
        for i in range(5)).encode()
    file = client.files.create(file=("rerank.jsonl", rerank), purpose="batch")
    done = wait_ended(client, client.batches.create(
        input_file_id=file.id, endpoint="/rerank", completion_window="24h").id)
    assert done.status == "completed" and done.request_counts.completed == 5
    [first, *_] = rows_of(client, done.output_file_id)
    assert len(first["response"]["body"]["results"]) == 3
    file = client.files.create(file=("embed.jsonl", request_lines(TEXTS[:6], "/embed",
                                                                  field="texts")),
                               purpose="batch")
    done = wait_ended(client, client.batches.create(
        input_file_id=file.id, endpoint="/embed", completion_window="24h").id)
    assert done.status == "completed" and done.request_counts.completed == 6
    assert all(len(r["response"]["body"]["embeddings"][0]) == 384
               for r in rows_of(client, done.output_file_id))


def test_a_cancel_on_the_running_app_stops_within_seconds_keeping_done_lines(client):
    """The busy model takes 3 s a batch: pieces of four lines, one at a time."""
    texts = [f"slow line {i}" for i in range(10 * BATCH_PIECE)]
    file = client.files.create(file=("slow.jsonl", request_lines(texts, "/embed", "busy",
                                                                 "texts")), purpose="batch")
    batch = client.batches.create(input_file_id=file.id, endpoint="/embed",
                                  completion_window="24h")
    deadline = time.monotonic() + 90
    while client.batches.retrieve(batch.id).request_counts.completed == 0:
        assert time.monotonic() < deadline, "no piece was done"
        time.sleep(0.2)
    asked = time.monotonic()
    assert client.batches.cancel(batch.id).status == "cancelling"
    ended = wait_ended(client, batch.id, timeout_s=30)
    took = time.monotonic() - asked
    assert ended.status == "cancelled", ended
    assert took < 20, f"the cancel took {took:.1f} s"
    counts = ended.request_counts
    assert 0 < counts.completed < len(texts)
    assert counts.completed + counts.failed == len(texts)
    out, err = rows_of(client, ended.output_file_id), rows_of(client, ended.error_file_id)
    assert sorted(r["custom_id"] for r in out + err) == sorted(
        f"doc-{i}" for i in range(len(texts)))
    assert {r["error"]["code"] for r in err} == {"batch_cancelled"}


def test_the_blitz_batch_command_submits_a_corpus_and_downloads_its_output(blitz_app,
                                                                           tmp_path: Path,
                                                                           capsys):
    from deployments.cli import main as blitz_main

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"c{i}", "text": t}) + "\n"
                              for i, t in enumerate(TEXTS[:9])))
    out = tmp_path / "out.jsonl"
    status = blitz_main(["batch", "submit", str(corpus), "--from-corpus", "--model", "minilm",
                         "--url", blitz_app, "--wait", "--poll-s", "0.3",
                         "--output", str(out)])
    assert status == 0, capsys.readouterr()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["custom_id"] for r in rows) == [f"c{i}" for i in range(9)]
    assert len(rows[0]["response"]["body"]["data"][0]["embedding"]) == 384


async def test_the_handle_offers_the_batch_api(blitz_app):
    from ray import serve

    handle = serve.get_deployment_handle("Ingress", APP)
    file = await handle.upload.remote(request_lines(TEXTS[:3]), "h.jsonl")
    assert file["bytes"] == len(request_lines(TEXTS[:3]))
    batch = await handle.create_batch.remote(file["id"], "/v1/embeddings")
    deadline = time.monotonic() + 60
    while (batch := await handle.get_batch.remote(batch["id"]))["status"] not in ENDED:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.3)
    assert batch["request_counts"]["completed"] == 3
    output = await handle.file_content.remote(batch["output_file_id"])
    assert len(output.splitlines()) == 3
    listed = await handle.list_batches.remote()
    assert batch["id"] in [b["id"] for b in listed["data"]]
