"""The batch API's HTTP half in process (the real app, a fake model): OpenAI's SDK
against ``/v1/files`` and ``/v1/batches``, each key's own files and batches, the limits,
the upload read as it arrives, and a batch's lines answered by the routes as its key."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blitz.batches.runner import BatchRunner, local_engine
from blitz.errors import InvalidValue
from blitz.http import internal
from blitz.http.api import HttpApi
from blitz.http.uploads import FormStream
from blitz.ingress.service import EmbeddingService
from blitz.pool.dispatcher import ReplicaDispatcher
from blitz.settings.config import BlitzSettings

KEYS = ["key-one", "key-two"]


def lines(n: int, url: str = "/v1/embeddings", model: str = "fake") -> bytes:
    return "".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": url,
                               "body": {"model": model, "input": f"text {i}"}}) + "\n"
                   for i in range(n)).encode()


@pytest.fixture
def app(tmp_path):
    settings = BlitzSettings.from_args({
        "models": [{"id": "fake", "source": "fake:16"}], "cache_dir": str(tmp_path),
        "auth": {"api_keys": KEYS}, "limits": {"max_texts_per_request": 8},
        "batches": {"max_file_bytes": 4096, "max_stored_bytes_per_key": 10_000,
                    "max_running_batches_per_key": 2, "chunk_lines": 4}})
    return HttpApi(EmbeddingService(settings, ReplicaDispatcher(settings)), app="unit")


def sdk(api: HttpApi, key: str) -> openai.AsyncOpenAI:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=api.app), base_url="http://t")
    return openai.AsyncOpenAI(base_url="http://t/v1", api_key=key, http_client=http,
                              max_retries=0)


def run_batches(api: HttpApi, loop: asyncio.AbstractEventLoop) -> None:
    """One pass of the runner (in a thread), its lines sent to ``api`` on ``loop`` as the
    ingress sends them."""
    settings = api.settings

    def call_for(owner):
        def call(endpoint, bodies):
            return asyncio.run_coroutine_threadsafe(internal.run_lines(
                api.app, endpoint, bodies, api.app.keys.index_of(owner), settings.batches),
                loop).result()
        return call
    store = api.kit.batches.store
    runner = BatchRunner(store, settings.batches, settings.limits.max_body_bytes,
                         local_engine(store, call_for, 2, settings.limits.max_body_bytes))
    runner.tick()


async def test_the_openai_sdk_runs_a_batch_and_reads_its_output(app):
    client = sdk(app, KEYS[0])
    file = await client.files.create(file=("in.jsonl", lines(6)), purpose="batch")
    assert (file.purpose, file.bytes, file.filename) == ("batch", len(lines(6)), "in.jsonl")
    batch = await client.batches.create(input_file_id=file.id, endpoint="/v1/embeddings",
                                        completion_window="24h", metadata={"job": "nightly"})
    assert (batch.status, batch.metadata) == ("validating", {"job": "nightly"})
    await asyncio.to_thread(run_batches, app, asyncio.get_running_loop())
    done = await client.batches.retrieve(batch.id)
    assert done.status == "completed"
    assert (done.request_counts.total, done.request_counts.completed) == (6, 6)
    output = (await client.files.content(done.output_file_id)).content
    rows = [json.loads(line) for line in output.splitlines()]
    assert sorted(r["custom_id"] for r in rows) == [f"r{i}" for i in range(6)]
    direct = await client.embeddings.create(model="fake", input="text 3")
    [row] = [r for r in rows if r["custom_id"] == "r3"]
    assert np.array_equal(np.float32(row["response"]["body"]["data"][0]["embedding"]),
                          np.float32(direct.data[0].embedding))  # the same vector, batched
    assert row["response"]["request_id"]
    listed = await client.batches.list(limit=1)
    assert [b.id for b in listed.data] == [batch.id]
    files = await client.files.list(purpose="batch_output")
    assert [f.id for f in files.data] == [done.output_file_id]


async def test_another_key_finds_nothing_of_a_keys_files_and_batches(app):
    mine, theirs = sdk(app, KEYS[0]), sdk(app, KEYS[1])
    file = await mine.files.create(file=("in.jsonl", lines(2)), purpose="batch")
    batch = await mine.batches.create(input_file_id=file.id, endpoint="/v1/embeddings",
                                      completion_window="24h")
    for call in (lambda: theirs.files.retrieve(file.id),
                 lambda: theirs.files.content(file.id), lambda: theirs.files.delete(file.id),
                 lambda: theirs.batches.retrieve(batch.id),
                 lambda: theirs.batches.cancel(batch.id),
                 lambda: theirs.batches.create(input_file_id=file.id,
                                               endpoint="/v1/embeddings",
                                               completion_window="24h")):
        with pytest.raises(openai.NotFoundError):
            await call()
    assert (await theirs.files.list()).data == []
    assert (await theirs.batches.list()).data == []
    with pytest.raises(openai.AuthenticationError):
        await sdk(app, "not-a-key").files.list()


async def test_the_limits_of_a_key_are_kept(app):
    client = sdk(app, KEYS[0])
    with pytest.raises(openai.APIStatusError) as big:
        await client.files.create(file=("in.jsonl", b"x" * 5000), purpose="batch")
    assert big.value.status_code == 413 and "max_file_bytes" in big.value.message
    with pytest.raises(openai.UnprocessableEntityError, match="purpose"):
        await client.files.create(file=("in.jsonl", lines(1)), purpose="fine-tune")
    kept = [await client.files.create(file=("in.jsonl", b"y" * 3000), purpose="batch")
            for _ in range(3)]
    with pytest.raises(openai.APIStatusError) as full:
        await client.files.create(file=("in.jsonl", b"z" * 2000), purpose="batch")
    assert full.value.status_code == 413
    assert "max_stored_bytes_per_key" in full.value.message
    await client.files.delete(kept[0].id)
    again = await client.files.create(file=("in.jsonl", lines(2)), purpose="batch")
    for _ in range(2):
        await client.batches.create(input_file_id=again.id, endpoint="/v1/embeddings",
                                    completion_window="24h")
    with pytest.raises(openai.RateLimitError, match="max_running_batches_per_key"):
        await client.batches.create(input_file_id=again.id, endpoint="/v1/embeddings",
                                    completion_window="24h")
    with pytest.raises(openai.ConflictError, match="cancel it first"):
        await client.files.delete(again.id)
    left = [f.id for f in (await client.files.list()).data]
    assert kept[0].id not in left and len(left) == 3


async def test_a_batch_is_refused_what_it_cannot_run(app):
    client = sdk(app, KEYS[0])
    file = await client.files.create(file=("in.jsonl", lines(1)), purpose="batch")
    with pytest.raises(openai.UnprocessableEntityError, match="endpoint"):
        await client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions",
                                    completion_window="24h")
    with pytest.raises(openai.UnprocessableEntityError, match="completion_window"):
        await client.batches.create(input_file_id=file.id, endpoint="/v1/embeddings",
                                    completion_window="48h")
    with pytest.raises(openai.UnprocessableEntityError, match="metadata"):
        await client.batches.create(input_file_id=file.id, endpoint="/v1/embeddings",
                                    completion_window="24h", metadata={"k": "v" * 600})
    with pytest.raises(openai.NotFoundError):
        await client.batches.create(input_file_id="file-" + "0" * 24,
                                    endpoint="/v1/embeddings", completion_window="24h")


async def test_a_cancel_shows_cancelling_until_the_runner_ends_it(app):
    client = sdk(app, KEYS[0])
    file = await client.files.create(file=("in.jsonl", lines(3)), purpose="batch")
    batch = await client.batches.create(input_file_id=file.id, endpoint="/v1/embeddings",
                                        completion_window="24h")
    cancelling = await client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at is not None
    await asyncio.to_thread(run_batches, app, asyncio.get_running_loop())
    ended = await client.batches.retrieve(batch.id)
    assert ended.status == "cancelled"
    with pytest.raises(openai.ConflictError):
        await client.batches.cancel(batch.id)


async def test_a_line_runs_as_its_batchs_key_and_a_removed_key_is_refused(app):
    settings = app.settings.batches
    [(status, _, body)] = await internal.run_lines(app.app, "/v1/embeddings",
                                                   [b'{"model": "fake", "input": "a"}'], 0,
                                                   settings)
    assert status == 200 and json.loads(body)["data"][0]["index"] == 0
    [(status, _, body)] = await internal.run_lines(app.app, "/v1/embeddings",
                                                   [b'{"model": "fake", "input": "a"}'],
                                                   app.app.keys.index_of("key-" + "0" * 16),
                                                   settings)
    assert status == 401 and "no longer configured" in json.loads(body)["error"]["message"]
    [(status, _, body)] = await internal.run_lines(app.app, "/v1/embeddings",
                                                   [b'{"model": "nope", "input": "a"}'], 0,
                                                   settings)
    assert status == 404


async def test_each_line_is_held_to_the_request_limits(app):
    settings = app.settings.batches
    too_many = json.dumps({"model": "fake", "input": ["t"] * 9}).encode()
    [(status, _, body)] = await internal.run_lines(app.app, "/v1/embeddings", [too_many], 0,
                                                   settings)
    assert status == 413 and "max_texts_per_request" in json.loads(body)["error"]["message"]


async def test_a_line_answered_503_is_sent_again(app, monkeypatch):
    answers = iter([(503, "", b"{}"), (503, "", b"{}"), (200, "r", b'{"ok": true}')])

    async def flaky(*args, **kwargs):
        return next(answers)

    monkeypatch.setattr(internal, "call", flaky)
    monkeypatch.setattr(internal, "RETRY_FIRST_S", 0.001)
    assert await internal.run_lines(app.app, "/embed", [b"{}"], -1, app.settings.batches) == [
        (200, "r", b'{"ok": true}')]


def form(parts: list[tuple[str, str | None, bytes]], boundary: str = "b0undary") -> bytes:
    out = b""
    for name, filename, value in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"'
                                                      if filename else "")
        out += (f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n").encode()
        out += value + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


def test_a_form_is_read_byte_by_byte_with_the_file_handed_on_as_it_comes():
    body = form([("purpose", None, b"batch"), ("file", "in.jsonl", b"line one\nline two\n")])
    stream = FormStream("multipart/form-data; boundary=b0undary")
    got = b"".join(b"".join(stream.feed(body[i:i + 1])) for i in range(len(body)))
    stream.close()
    assert got == b"line one\nline two\n"
    assert (stream.fields, stream.filename) == ({"purpose": "batch"}, "in.jsonl")


@pytest.mark.parametrize("body, match", [
    (form([("purpose", None, b"batch")]), "no `file` part"),
    (form([("file", "a", b"1"), ("file", "b", b"2")]), "more than one"),
    (form([("purpose", None, b"x" * 5000), ("file", "a", b"1")]), "over 4096 bytes"),
])
def test_a_bad_form_is_refused_naming_what_is_wrong(body, match):
    stream = FormStream("multipart/form-data; boundary=b0undary")
    with pytest.raises(InvalidValue, match=match):
        stream.feed(body)
        stream.close()


async def test_an_upload_is_bounded_whatever_its_parts_hold(app):
    """Bytes outside any part (a preamble the parser skips) count against the limit too."""
    body = b"x" * 80_000 + form([("purpose", None, b"batch"), ("file", "a.jsonl", lines(1))])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app.app),
                                 base_url="http://t") as http:
        async def chunks():
            yield body  # no content-length: only the count while reading can stop it

        r = await http.post("/v1/files", content=chunks(),
                            headers={"authorization": f"Bearer {KEYS[0]}",
                                     "content-type": "multipart/form-data; boundary=b0undary"})
    assert r.status_code == 413, r.text
    assert (await sdk(app, KEYS[0]).files.list()).data == []
    assert not list(Path(app.kit.batches.store.root).rglob("*.partial"))  # nothing left


def test_an_upload_that_is_not_a_form_is_refused():
    with pytest.raises(InvalidValue, match="multipart/form-data"):
        FormStream("application/json")


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400), st.integers(1, 64))
def test_any_bytes_as_a_form_are_read_or_refused_with_a_400(body, cut):
    stream = FormStream("multipart/form-data; boundary=b0undary")
    try:
        for i in range(0, len(body), cut):
            stream.feed(body[i:i + cut])
        stream.close()
    except InvalidValue:
        pass


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=30).filter(lambda b: b"\n" not in b), max_size=20),
       st.integers(1, 40))
def test_lines_are_found_at_their_offsets_whatever_the_bytes(rows, max_bytes):
    import io

    from blitz.batches.lines import lines_at

    body = b"\n".join(rows)
    for offset, line in lines_at(io.BytesIO(body), max_bytes):
        end = body.find(b"\n", offset)
        raw = body[offset:end if end >= 0 else len(body)]
        assert line == (None if len(raw) > max_bytes else raw.removesuffix(b"\r"))
