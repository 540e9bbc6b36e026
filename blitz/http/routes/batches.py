"""OpenAI's Files and Batches API (``/v1/files``, ``/v1/batches``): a batch's input
uploaded, the batch made, watched, listed and cancelled, its output downloaded; each
owner's own (``blitz.batches.service``; the runner runs them, ``blitz.batches.runner``).

The upload is read as it arrives (``blitz.http.uploads.FormStream``) into the store, within
``batches.max_file_bytes`` and ``batches.upload_timeout_s``; a file's content is sent
chunk by chunk. Neither is ever held whole.
"""

from __future__ import annotations

import asyncio

from pydantic import Field
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from blitz.batches.service import BatchService
from blitz.errors import InvalidValue, NotFound, PayloadTooLarge, RequestTimeout
from blitz.http.bodies import _Request
from blitz.http.middleware import API_KEYS
from blitz.http.responses import JSONBytesResponse
from blitz.http.routes.kit import Kit, Payload, record
from blitz.http.uploads import FormStream, field_int

FORM_SLACK = 64 * 1024  # a form's boundaries and fields around its file


class CreateBatchRequest(_Request):
    """``POST /v1/batches``: OpenAI's body."""

    input_file_id: str = Field(..., max_length=64, description="an uploaded file's id "
                               "(purpose batch): one request per line")
    endpoint: str = Field(..., max_length=64, description="the route every line calls: "
                          "/v1/embeddings, or Blitz's /embed, /rerank and its peers' "
                          "(GET /openapi.json lists them under the batch API)")
    completion_window: str = Field("24h", max_length=8, description="the batch's time to "
                                   "run (batches.completion_windows); past it, it expires")
    metadata: dict[str, str] | None = Field(None, description="up to 16 string pairs, "
                                            "kept with the batch")


def owner(request: Request) -> str:
    """The store's owner of the request's API key (``public`` while keys are off)."""
    return request.scope[API_KEYS].owner(record(request).api_key)


def _batches(kit: Kit) -> BatchService:
    if kit.batches is None:
        raise NotFound("the batch API is off on this server (batches.enabled)")
    return kit.batches


def _query_int(request: Request, name: str, default: int) -> int:
    value = request.query_params.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError as exc:
        raise InvalidValue(f"{name} must be an integer", param=name) from exc


async def upload_file(kit: Kit, request: Request) -> Response:
    """OpenAI's ``POST /v1/files``: a multipart form with the file and ``purpose``."""
    batches = _batches(kit)
    settings = batches.settings
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > settings.max_file_bytes + FORM_SLACK:
        raise PayloadTooLarge(f"the upload is {declared} bytes; a file is at most "
                              f"{settings.max_file_bytes} (batches.max_file_bytes)",
                              param="file")
    form = FormStream(request.headers.get("content-type"))
    upload = await batches.begin_upload(owner(request))
    limit = settings.max_file_bytes + FORM_SLACK  # the whole body, whatever its parts
    received = 0
    try:
        try:
            async with asyncio.timeout(settings.upload_timeout_s):  # the client cannot lift it
                async for chunk in request.stream():
                    received += len(chunk)
                    if received > limit:
                        raise PayloadTooLarge(f"the upload is over {limit} bytes; a file is "
                                              f"at most {settings.max_file_bytes} "
                                              "(batches.max_file_bytes)", param="file")
                    for data in form.feed(chunk):
                        await upload.write(data)
        except TimeoutError as exc:
            raise RequestTimeout(f"the upload did not arrive within "
                                 f"{settings.upload_timeout_s:g} s (batches.upload_timeout_s)",
                                 param="file") from exc
        form.close()
        meta = await upload.finish(form.filename or "upload.jsonl", form.fields.get("purpose"),
                                   field_int(form.fields, "expires_after[seconds]"))
    except BaseException:
        await upload.abort()
        raise
    return JSONBytesResponse(meta)


async def list_files(kit: Kit, request: Request) -> Response:
    """OpenAI's ``GET /v1/files``: ``purpose``, ``limit``, ``after``, ``order``."""
    q = request.query_params
    return JSONBytesResponse(await _batches(kit).list_files(
        q.get("purpose"), _query_int(request, "limit", 10_000), q.get("after"),
        q.get("order", "desc"), owner=owner(request)))


async def retrieve_file(kit: Kit, request: Request) -> Response:
    return JSONBytesResponse(await _batches(kit).get_file(request.path_params["file_id"],
                                                          owner=owner(request)))


async def delete_file(kit: Kit, request: Request) -> Response:
    return JSONBytesResponse(await _batches(kit).delete_file(request.path_params["file_id"],
                                                             owner=owner(request)))


async def file_content(kit: Kit, request: Request) -> Response:
    """A file's bytes (JSON lines), sent as they are read."""
    meta, chunks = await asyncio.to_thread(_batches(kit).content_chunks, owner(request),
                                           request.path_params["file_id"])
    return StreamingResponse(chunks, media_type="application/octet-stream",
                             headers={"content-length": str(meta["bytes"]),
                                      "content-disposition":
                                          f'attachment; filename="{meta["id"]}.jsonl"'})


async def create_batch(kit: Kit, request: Request, payload: Payload) -> Response:
    """OpenAI's ``POST /v1/batches``."""
    req = CreateBatchRequest.parse(payload)
    return JSONBytesResponse(await _batches(kit).create_batch(
        req.input_file_id, req.endpoint, req.completion_window, req.metadata,
        owner=owner(request)))


async def list_batches(kit: Kit, request: Request) -> Response:
    """OpenAI's ``GET /v1/batches``: ``limit`` (20), ``after``."""
    return JSONBytesResponse(await _batches(kit).list_batches(
        request.query_params.get("after"), _query_int(request, "limit", 20),
        owner=owner(request)))


async def retrieve_batch(kit: Kit, request: Request) -> Response:
    return JSONBytesResponse(await _batches(kit).get_batch(request.path_params["batch_id"],
                                                           owner=owner(request)))


async def cancel_batch(kit: Kit, request: Request) -> Response:
    return JSONBytesResponse(await _batches(kit).cancel_batch(
        request.path_params["batch_id"], owner=owner(request)))
