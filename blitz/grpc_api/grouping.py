"""An ``EmbedStream``'s messages answered in groups: one service call per group.

TEI's proto carries one text per message, so a client batches by streaming. Answering
each message as a call of its own costs the ingress a request's checks, record and pool
job per text. Here the messages that queue while the stream's earlier groups are being
answered (``blitz.pool.batching.Batcher``: two groups in flight, the first message after
a pause at once) become one ``embed`` of their texts, split where their options differ.
Each message still gets its own reply, in order, with its own vector: one model id gives
one vector per text whatever its batch.

A group that a client error fails (one text over a limit) is answered again message by
message, so the messages before the bad one get their vectors and the bad one its own
error; any other error (overloaded, unavailable) is every message's answer at once.
A group is counted as one request of its texts (route ``/tei.v1.Embed/EmbedStream``);
its replies' ``Metadata`` times and ``compute_tokens`` are the group's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from blitz.errors import ClientError, as_blitz_error
from blitz.grpc_api import convert
from blitz.grpc_api import tei_pb2 as pb
from blitz.grpc_api.rpc_table import BY_METHOD, Malformed, end_span
from blitz.hop_messages import NORMAL, EmbedOptions
from blitz.ingress.service import EmbeddingService, RequestRecord, record_failure
from blitz.pool.batching import Batcher

Alone = Callable[[Any], Awaitable[tuple[Any, Exception | None]]]
"""Answers one message as a call of its own: (reply, None) or (None, its error)."""


def _options(request: Any) -> EmbedOptions | None:
    """What must be equal for messages to share one call; None: never shared."""
    if isinstance(request, Malformed):
        return None
    return convert.embed_options(request)


def runs(requests: list[Any]) -> list[list[Any]]:
    """``requests`` cut into runs of neighbours with the same options, in order."""
    out: list[list[Any]] = []
    for request in requests:
        key = _options(request)
        if out and key is not None and _options(out[-1][0]) == key:
            out[-1].append(request)
        else:
            out.append([request])
    return out


class EmbedGroups:
    def __init__(self, service: EmbeddingService, model: str | None, alone: Alone,
                 window: int, api_key: int = -1, priority: int = NORMAL,
                 traced: dict[str, Any] | None = None):
        self.service = service
        self.model = model
        self.api_key = api_key  # the stream's API key (RequestRecord.api_key)
        self.priority = priority  # the stream's priority level (its metadata's)
        self.traced = traced  # the stream's metadata while traces are on: a span per group
        self.alone = alone
        self.path = BY_METHOD["EmbedStream"].path
        self.batcher: Batcher[Any, Any] = Batcher(
            self._answer_group, max_batch=service.settings.limits.max_texts_per_request,
            max_waiting=window, size=lambda _: 1, max_in_flight=2,
            name="a gRPC EmbedStream")

    async def answer(self, request: Any) -> tuple[Any, Exception | None]:
        try:
            return await self.batcher.submit(request), None
        except Exception as exc:
            return None, exc

    async def _answer_group(self, requests: list[Any]) -> list[Any]:
        out: list[Any] = []
        for run in runs(requests):
            out.extend(await self._group(run) if len(run) > 1 else [await self._one(run[0])])
        return out

    async def _one(self, request: Any) -> Any:
        reply, error = await self.alone(request)
        return reply if error is None else error

    async def _group(self, run: list[Any]) -> list[Any]:
        first = run[0]
        record = RequestRecord(self.path, api_key=self.api_key, priority=self.priority)
        if self.traced is not None:
            record.trace = BY_METHOD["EmbedStream"].span(self.traced)
        started = time.perf_counter()
        try:
            result = await self.service.embed([r.inputs for r in run], model=self.model,
                                              **convert.embed_options(first).keywords(),
                                              record=record)
        except Exception as exc:
            error = as_blitz_error(exc)
            if isinstance(error, ClientError):  # whose? each alone says
                end_span(record, error)
                return list(await asyncio.gather(*(self._one(r) for r in run)))
            end_span(record, record_failure(record, error, self.service.observe))
            return [exc] * len(run)
        seconds = time.perf_counter() - started
        self.service.observe(record, 200)
        end_span(record, None)
        replies = []
        for request, row in zip(run, result.embeddings, strict=True):
            reply = pb.EmbedResponse(embeddings=row.tolist())
            convert.fill_metadata(reply, request, record, seconds)
            replies.append(reply)
        return replies
