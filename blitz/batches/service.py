"""The batch API's calls on the ingress (``/v1/files``, ``/v1/batches``; the handle's
methods of the same names): each owner's files and batches in the store, within their
limits. The batches themselves run on the batch runner (``blitz.batches.runner``).

Every call names its owner (``blitz.batches.store.owner_of``: the caller's API key):
another owner's ids are not found (404). An upload counts its bytes as they arrive,
against ``max_file_bytes`` and what is left of ``max_stored_bytes_per_key``; a batch is
refused while its owner has ``max_running_batches_per_key`` batches not ended (429). The
store's I/O runs in a thread: an object store's latency never holds the event loop.
"""

from __future__ import annotations

import asyncio
import posixpath
import re
import time
from collections.abc import AsyncIterator, Collection, Iterator
from typing import Any

from blitz.batches import objects
from blitz.batches.store import PUBLIC, Store, new_id
from blitz.errors import Conflict, InvalidValue, LimitReached, NotFound, PayloadTooLarge
from blitz.settings.batches import BatchSettings

WINDOW = re.compile(r"^(\d{1,4})h$")
MAX_METADATA = 16  # OpenAI's: 16 pairs, keys to 64 characters, values to 512
MIN_EXPIRES_AFTER_S = 3600


class Upload:
    """One file being uploaded: its bytes written to the store as they come, counted;
    ``finish`` makes it a file, ``abort`` leaves nothing behind."""

    def __init__(self, service: BatchService, owner: str, limit: int, what: str):
        self.service, self.owner, self.limit, self.what = service, owner, limit, what
        self.file_id = new_id("file-")
        self.path = service.store.file_path(owner, self.file_id, "data")
        self.writer, self.partial = service.store.open_writer(self.path)
        self.size = 0

    async def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.limit:
            raise PayloadTooLarge(f"the file is over {self.limit} bytes ({self.what})",
                                  param="file")
        if self.service.store.local:
            self.writer.write(chunk)
        else:
            await asyncio.to_thread(self.writer.write, chunk)

    async def finish(self, filename: str, purpose: str | None,
                     expires_after_s: int | None) -> dict[str, Any]:
        settings = self.service.settings
        if purpose != objects.PURPOSE_IN:
            raise InvalidValue(f"purpose must be {objects.PURPOSE_IN!r} (got "
                               f"{str(purpose)[:40]!r}): the batch API keeps batch inputs",
                               param="purpose")
        if expires_after_s is not None and not (
                MIN_EXPIRES_AFTER_S <= expires_after_s <= settings.retention_s):
            raise InvalidValue(f"expires_after[seconds] must be {MIN_EXPIRES_AFTER_S} to "
                               f"{int(settings.retention_s)}", param="expires_after")
        store = self.service.store
        await asyncio.to_thread(self.writer.close)
        await asyncio.to_thread(store.finish_writer, self.partial, self.path)
        now = int(time.time())
        keep = expires_after_s or int(settings.retention_s)
        name = posixpath.basename(filename.replace("\\", "/"))[:255] or "upload.jsonl"
        meta = objects.file_object(self.file_id, name, purpose, self.size, now, now + keep)
        await asyncio.to_thread(store.put_json, store.file_path(self.owner, self.file_id,
                                                                 "json"), meta)
        return meta

    async def abort(self) -> None:
        def drop() -> None:
            try:
                self.writer.close()
            finally:
                self.service.store.drop(self.partial)
        await asyncio.to_thread(drop)


class BatchService:
    """Files and batches, per owner, in the store at ``storage``."""

    def __init__(self, settings: BatchSettings, storage: str, endpoints: Collection[str]):
        self.settings = settings
        self.store = Store(storage)
        self.endpoints = tuple(endpoints)
        self._claimed = False

    def _ready(self) -> Store:
        if not self._claimed:
            self.store.ensure()
            self._claimed = True
        return self.store

    # --- files -------------------------------------------------------------------------

    async def begin_upload(self, owner: str) -> Upload:
        """An upload for ``owner``, refused when its stored bytes are at their limit."""
        store = await asyncio.to_thread(self._ready)
        used = await asyncio.to_thread(store.stored_bytes, owner)
        left = self.settings.max_stored_bytes_per_key - used
        if left <= 0:
            raise PayloadTooLarge(f"this API key keeps {used} bytes of files, its limit "
                                  "(batches.max_stored_bytes_per_key): delete files first",
                                  param="file")
        if left < self.settings.max_file_bytes:
            return Upload(self, owner, left, f"what is left of this API key's "
                          f"{self.settings.max_stored_bytes_per_key} bytes "
                          "(batches.max_stored_bytes_per_key)")
        return Upload(self, owner, self.settings.max_file_bytes,
                      "batches.max_file_bytes")

    async def upload(self, content: bytes | AsyncIterator[bytes], filename: str = "input.jsonl",
                     purpose: str = objects.PURPOSE_IN, expires_after_s: int | None = None,
                     *, owner: str = PUBLIC) -> dict[str, Any]:
        """Keep ``content`` (a batch's input lines) as a file: OpenAI's file object."""
        upload = await self.begin_upload(owner)
        try:
            if isinstance(content, bytes):
                await upload.write(content)
            else:
                async for chunk in content:
                    await upload.write(chunk)
            return await upload.finish(filename, purpose, expires_after_s)
        except BaseException:
            await upload.abort()
            raise

    def _file(self, owner: str, file_id: str) -> dict[str, Any]:
        meta = self._ready().file_meta(owner, file_id)
        if meta is None:
            raise NotFound(f"no file {file_id[:64]!r}", param="file_id")
        return meta

    async def get_file(self, file_id: str, *, owner: str = PUBLIC) -> dict[str, Any]:
        return objects.public(await asyncio.to_thread(self._file, owner, file_id))

    async def list_files(self, purpose: str | None = None, limit: int = 10_000,
                         after: str | None = None, order: str = "desc", *,
                         owner: str = PUBLIC) -> dict[str, Any]:
        """OpenAI's list of files: newest first (``order`` asc: oldest), ``after`` an id."""
        if order not in ("asc", "desc"):
            raise InvalidValue("order must be asc or desc", param="order")
        if not 1 <= limit <= 10_000:
            raise InvalidValue("limit must be 1 to 10000", param="limit")
        found = await asyncio.to_thread(lambda: self._ready().files(owner))
        found = [f for f in found if purpose is None or f["purpose"] == purpose]
        found.sort(key=lambda f: (f["created_at"], f["id"]), reverse=order == "desc")
        return objects.page(found, after, limit)

    async def delete_file(self, file_id: str, *, owner: str = PUBLIC) -> dict[str, Any]:
        def delete() -> None:
            self._file(owner, file_id)
            for batch_id in self.store.open_ids(owner):
                batch = self.store.batch(owner, batch_id)
                if batch is not None and batch["input_file_id"] == file_id:
                    raise Conflict(f"file {file_id} is the input of batch {batch_id}, "
                                   "which has not ended: cancel it first", param="file_id")
            self.store.forget_file(owner, file_id)
        await asyncio.to_thread(delete)
        return {"id": file_id, "object": "file", "deleted": True}

    async def file_content(self, file_id: str, *, owner: str = PUBLIC) -> bytes:
        """A file's bytes, whole (the handle's; HTTP streams them: ``content_chunks``)."""
        meta = await asyncio.to_thread(self._file, owner, file_id)
        return await asyncio.to_thread(
            lambda: b"".join(self.store.read_chunks(owner, meta["id"])))

    def content_chunks(self, owner: str, file_id: str) -> tuple[dict[str, Any], Iterator[bytes]]:
        """A file's object and its bytes chunk by chunk (404 before any is read)."""
        meta = self._file(owner, file_id)
        return meta, self.store.read_chunks(owner, file_id)

    # --- batches -----------------------------------------------------------------------

    async def create_batch(self, input_file_id: str, endpoint: str,
                           completion_window: str = "24h",
                           metadata: dict[str, str] | None = None, *,
                           owner: str = PUBLIC) -> dict[str, Any]:
        """A batch of ``input_file_id``'s requests to ``endpoint``: OpenAI's batch object,
        ``validating`` until the runner reads its input."""
        if endpoint not in self.endpoints:
            raise InvalidValue(f"endpoint {str(endpoint)[:100]!r} cannot run in a batch; "
                               f"these can: {', '.join(self.endpoints)}", param="endpoint")
        window = WINDOW.match(completion_window or "")
        if completion_window not in self.settings.completion_windows or window is None:
            raise InvalidValue(f"completion_window must be one of "
                               f"{', '.join(self.settings.completion_windows)}",
                               param="completion_window")
        _check_metadata(metadata)

        def create() -> dict[str, Any]:
            meta = self._file(owner, input_file_id)
            if meta["purpose"] != objects.PURPOSE_IN:
                raise InvalidValue(f"file {input_file_id} has purpose {meta['purpose']!r}; a "
                                   f"batch's input has purpose {objects.PURPOSE_IN!r}",
                                   param="input_file_id")
            running = self.store.open_ids(owner)
            if len(running) >= self.settings.max_running_batches_per_key:
                raise LimitReached(f"this API key has {len(running)} batches not ended, its "
                                   "limit (batches.max_running_batches_per_key): wait for "
                                   "one to end, or cancel one", param="input_file_id")
            now = int(time.time())
            record = objects.batch_object(new_id("batch_"), endpoint, input_file_id,
                                          completion_window, now,
                                          now + int(window.group(1)) * 3600, metadata)
            self.store.save_batch(owner, record)
            self.store.mark_open(owner, record["id"])  # after its record: the runner reads it
            return record
        return objects.public(await asyncio.to_thread(create))

    def _batch(self, owner: str, batch_id: str) -> dict[str, Any]:
        record = self._ready().batch(owner, batch_id)
        if record is None:
            raise NotFound(f"no batch {batch_id[:64]!r}", param="batch_id")
        asked = (self.store.cancel_asked(owner, batch_id)
                 if record["status"] not in objects.ENDED else None)
        if asked is not None:  # the runner has not ended it yet: OpenAI's "cancelling"
            record.update(status=objects.CANCELLING, cancelling_at=int(asked))
        return record

    async def get_batch(self, batch_id: str, *, owner: str = PUBLIC) -> dict[str, Any]:
        return objects.public(await asyncio.to_thread(self._batch, owner, batch_id))

    async def list_batches(self, after: str | None = None, limit: int = 20, *,
                           owner: str = PUBLIC) -> dict[str, Any]:
        """OpenAI's list of batches, newest first."""
        if not 1 <= limit <= 100:
            raise InvalidValue("limit must be 1 to 100", param="limit")

        def listing() -> list[dict[str, Any]]:
            found = [self._batch(owner, b["id"]) for b in self._ready().batches(owner)]
            return sorted(found, key=lambda b: (b["created_at"], b["id"]), reverse=True)
        return objects.page(await asyncio.to_thread(listing), after, limit)

    async def cancel_batch(self, batch_id: str, *, owner: str = PUBLIC) -> dict[str, Any]:
        """Ask the runner to stop a batch: ``cancelling`` until it has, within seconds;
        what was done stays in its output."""
        def cancel() -> dict[str, Any]:
            record = self._batch(owner, batch_id)
            if record["status"] in objects.ENDED:
                raise Conflict(f"batch {batch_id} has ended ({record['status']}): it cannot "
                               "be cancelled", param="batch_id")
            if record["status"] != objects.CANCELLING:
                self.store.ask_cancel(owner, batch_id, time.time())
            return self._batch(owner, batch_id)
        return objects.public(await asyncio.to_thread(cancel))


def _check_metadata(metadata: Any) -> None:
    if metadata is None:
        return
    if not isinstance(metadata, dict) or len(metadata) > MAX_METADATA or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512
            for k, v in metadata.items()):
        raise InvalidValue(f"metadata is at most {MAX_METADATA} string pairs, keys to 64 "
                           "characters, values to 512", param="metadata")
