"""blitz/http/disconnect.py: a request Serve does not watch (a large or chunked body,
marked by HAProxy) is cancelled when its client leaves after sending the body, and only
then, so a departed client frees its slot."""

from __future__ import annotations

import asyncio

import pytest

from blitz.http import disconnect as http_disconnect

MARKED = {"type": "http", "headers": [(b"x-request-disconnect-disabled", b"?1")]}


def peer(*messages, leave_after: float | None):
    """An HTTP server's ``receive``: the body's messages, then a disconnect once the
    client leaves (after ``leave_after`` s; never when None), as uvicorn's does."""
    queue = list(messages)

    async def receive():
        if queue:
            return queue.pop(0)
        if leave_after is None:
            await asyncio.Event().wait()
        await asyncio.sleep(leave_after)
        return {"type": "http.disconnect"}

    return receive


async def slow_app(scope, receive, send, done: list):
    while (await receive()).get("more_body"):
        pass
    await asyncio.sleep(5)
    done.append(True)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def test_only_a_marked_request_is_watched():
    assert http_disconnect.unwatched(MARKED)
    assert not http_disconnect.unwatched({"type": "http", "headers": []})
    assert not http_disconnect.unwatched(
        {"type": "http", "headers": [(b"x-request-disconnect-disabled", b"?0")]})


async def test_a_client_that_leaves_after_its_body_cancels_the_request():
    done: list = []
    receive = peer({"type": "http.request", "body": b"a", "more_body": True},
                   {"type": "http.request", "body": b"b"}, leave_after=0.05)
    with pytest.raises(asyncio.CancelledError):
        await http_disconnect.run_watching(
            lambda s, r, w: slow_app(s, r, w, done), MARKED, receive, _sink([]))
    assert not done


async def test_a_client_that_stays_gets_its_reply_and_nothing_is_left_running():
    sent: list = []

    async def app(scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    before = len(asyncio.all_tasks())
    await http_disconnect.run_watching(app, MARKED, peer(
        {"type": "http.request", "body": b"x"}, leave_after=None), _sink(sent))
    await asyncio.sleep(0)
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert len(asyncio.all_tasks()) == before  # the watcher is gone


async def test_the_end_of_a_finished_reply_cancels_nothing():
    async def app(scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
        await asyncio.sleep(0.1)  # the server reports the end as a disconnect meanwhile

    await http_disconnect.run_watching(app, MARKED, peer(
        {"type": "http.request", "body": b"x"}, leave_after=0), _sink([]))


def _sink(into: list):
    async def send(message):
        into.append(message)

    return send
