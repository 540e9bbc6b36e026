"""Where the batch API keeps its files and batches: a local folder or an object-store prefix
(``batches.storage``), opened with fsspec (``blitz.sources.storage.filesystem_for``).

    STORAGE/
      _BLITZ_BATCHES                 marks STORAGE as the batch API's (written first)
      <owner>/files/<id>.json        a file's object (OpenAI's fields, then Blitz's own)
      <owner>/files/<id>.data        its bytes
      <owner>/batches/<id>/batch.json   a batch's object and its progress
      <owner>/batches/<id>/cancel       a cancel asked for (the ingress writes it; the
                                        runner alone writes batch.json)
      <owner>/batches/<id>/plan.json    the input's pieces, found when the batch starts
      <owner>/batches/<id>/parts/       each piece's output and error lines, then its
                                        record (``<n>.done``), written last
      <owner>/open/<id>                 a batch not ended: what the runner looks at each
                                        pass (never every batch kept)

An owner is an API key, named by its digest (``key-`` and 16 hex digits), or ``public``
while keys are off: another key's files and batches are not found, by construction. Ids
are checked against their pattern before they name a path. Each write lands whole: a
local file under a temporary name, then renamed; an object store's put is whole already.
Nothing is deleted but the files this module names (``forget_file``, ``forget_batch``).
"""

from __future__ import annotations

import json
import posixpath
import re
import secrets
from collections.abc import Iterator
from typing import Any

from blitz.errors import InvalidValue
from blitz.sources.storage import filesystem_for

MARKER = "_BLITZ_BATCHES"
PUBLIC = "public"
OWNER = re.compile(r"^(public|key-[0-9a-f]{16})$")
FILE_ID = re.compile(r"^file-[0-9a-f]{24}$")
BATCH_ID = re.compile(r"^batch_[0-9a-f]{24}$")
PART = re.compile(r"^(\d{1,9}|invalid)\.(out|err|done)$")
BATCH_FILES = ("batch.json", "cancel", "plan.json")


def new_id(prefix: str) -> str:
    """``file-`` or ``batch_`` and 24 random hex digits (``FILE_ID``, ``BATCH_ID``)."""
    return prefix + secrets.token_hex(12)


def owner_of(key_digest_hex: str | None) -> str:
    """The owner directory of an API key (by its SHA-256, hex), or ``public`` (keys off)."""
    return PUBLIC if not key_digest_hex else f"key-{key_digest_hex[:16]}"


class Store:
    """The files and batches under one storage URI."""

    def __init__(self, uri: str):
        self.uri = uri
        self.fs, root = filesystem_for(uri)
        self.root = root.rstrip("/")
        self.local = "file" in (self.fs.protocol if isinstance(self.fs.protocol, tuple)
                                else (self.fs.protocol,))

    def ensure(self) -> None:
        """Claim STORAGE: a new or empty place, or one that carries ``MARKER`` already.
        A place holding anything else is refused, never written into."""
        marker = f"{self.root}/{MARKER}"
        if self.fs.exists(marker):
            return
        if self.fs.exists(self.root) and self.fs.ls(self.root, detail=False):
            raise InvalidValue(f"batches.storage {self.uri} holds files the batch API did not "
                               f"write (no {MARKER}): choose a new or empty place",
                               param="batches.storage")
        self.fs.makedirs(self.root, exist_ok=True)
        self.put(marker, json.dumps({"written_by": "blitz batches"}).encode() + b"\n")

    # --- paths -----------------------------------------------------------------------

    def owner_dir(self, owner: str) -> str:
        if not OWNER.match(owner):
            raise ValueError(f"not an owner: {owner!r}")
        return f"{self.root}/{owner}"

    def file_path(self, owner: str, file_id: str, suffix: str) -> str:
        return f"{self.owner_dir(owner)}/files/{file_id}.{suffix}"

    def batch_dir(self, owner: str, batch_id: str) -> str:
        return f"{self.owner_dir(owner)}/batches/{batch_id}"

    def part_path(self, owner: str, batch_id: str, name: str) -> str:
        if not PART.match(name):
            raise ValueError(f"not a part: {name!r}")
        return f"{self.batch_dir(owner, batch_id)}/parts/{name}"

    # --- whole writes and reads -------------------------------------------------------

    def put(self, path: str, body: bytes) -> None:
        """``body`` at ``path``, whole: a reader sees the old file or the new one."""
        self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
        if not self.local:
            self.fs.pipe_file(path, body)
            return
        partial = f"{path}.{secrets.token_hex(4)}.partial"
        with self.fs.open(partial, "wb") as out:
            out.write(body)
        self.fs.mv(partial, path)

    def put_json(self, path: str, value: Any) -> None:
        self.put(path, json.dumps(value, separators=(",", ":")).encode())

    def get_json(self, path: str) -> Any:
        """The JSON at ``path``; None when it is absent or not JSON."""
        try:
            return json.loads(self.fs.cat_file(path))
        except (FileNotFoundError, ValueError):
            return None

    def exists(self, path: str) -> bool:
        return bool(self.fs.exists(path))

    def open_writer(self, path: str) -> tuple[Any, str]:
        """A binary writer for a file landing at ``path`` once ``finish_writer`` moves
        it there (a temporary name until then)."""
        self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
        partial = f"{path}.{secrets.token_hex(4)}.partial"
        return self.fs.open(partial, "wb"), partial

    def finish_writer(self, partial: str, path: str) -> None:
        self.fs.mv(partial, path)

    def drop(self, path: str) -> None:
        """Delete ``path`` when it is there (a path this module named)."""
        try:
            self.fs.rm_file(path)
        except FileNotFoundError:
            pass

    # --- listings ----------------------------------------------------------------------

    def owners(self) -> list[str]:
        if not self.fs.exists(self.root):
            return []
        names = [posixpath.basename(p.rstrip("/")) for p in self.fs.ls(self.root, detail=False)]
        return sorted(n for n in names if OWNER.match(n))

    def _names(self, directory: str) -> list[str]:
        try:
            return [posixpath.basename(p.rstrip("/"))
                    for p in self.fs.ls(directory, detail=False)]
        except FileNotFoundError:
            return []

    def file_ids(self, owner: str) -> list[str]:
        names = self._names(f"{self.owner_dir(owner)}/files")
        return [n[:-5] for n in names if n.endswith(".json") and FILE_ID.match(n[:-5])]

    def batch_ids(self, owner: str) -> list[str]:
        return [n for n in self._names(f"{self.owner_dir(owner)}/batches") if BATCH_ID.match(n)]

    def part_names(self, owner: str, batch_id: str) -> list[str]:
        return [n for n in self._names(f"{self.batch_dir(owner, batch_id)}/parts")
                if PART.match(n)]

    # --- files -------------------------------------------------------------------------

    def file_meta(self, owner: str, file_id: str) -> dict[str, Any] | None:
        if not FILE_ID.match(file_id):
            return None
        meta = self.get_json(self.file_path(owner, file_id, "json"))
        return meta if isinstance(meta, dict) and meta.get("id") == file_id else None

    def files(self, owner: str) -> list[dict[str, Any]]:
        found = (self.file_meta(owner, i) for i in self.file_ids(owner))
        return [m for m in found if m is not None]

    def read_chunks(self, owner: str, file_id: str, size: int = 1 << 20) -> Iterator[bytes]:
        with self.fs.open(self.file_path(owner, file_id, "data"), "rb") as f:
            while chunk := f.read(size):
                yield chunk

    def open_data(self, owner: str, file_id: str) -> Any:
        return self.fs.open(self.file_path(owner, file_id, "data"), "rb")

    def forget_file(self, owner: str, file_id: str) -> None:
        """Delete a file: its bytes, then its object (a file without one is never listed)."""
        self.drop(self.file_path(owner, file_id, "data"))
        self.drop(self.file_path(owner, file_id, "json"))

    def stored_bytes(self, owner: str) -> int:
        return sum(int(m.get("bytes", 0)) for m in self.files(owner))

    # --- batches -----------------------------------------------------------------------

    def batch(self, owner: str, batch_id: str) -> dict[str, Any] | None:
        if not BATCH_ID.match(batch_id):
            return None
        record = self.get_json(f"{self.batch_dir(owner, batch_id)}/batch.json")
        return record if isinstance(record, dict) and record.get("id") == batch_id else None

    def batches(self, owner: str) -> list[dict[str, Any]]:
        found = (self.batch(owner, i) for i in self.batch_ids(owner))
        return [b for b in found if b is not None]

    def save_batch(self, owner: str, record: dict[str, Any]) -> None:
        self.put_json(f"{self.batch_dir(owner, record['id'])}/batch.json", record)

    def open_ids(self, owner: str) -> list[str]:
        """The batches of ``owner`` not ended (``mark_open``)."""
        return [n for n in self._names(f"{self.owner_dir(owner)}/open") if BATCH_ID.match(n)]

    def mark_open(self, owner: str, batch_id: str) -> None:
        self.put(f"{self.owner_dir(owner)}/open/{batch_id}", b"")

    def mark_ended(self, owner: str, batch_id: str) -> None:
        self.drop(f"{self.owner_dir(owner)}/open/{batch_id}")

    def cancel_asked(self, owner: str, batch_id: str) -> float | None:
        """When a cancel was asked for, or None."""
        asked = self.get_json(f"{self.batch_dir(owner, batch_id)}/cancel")
        return float(asked["at"]) if isinstance(asked, dict) and "at" in asked else None

    def ask_cancel(self, owner: str, batch_id: str, at: float) -> None:
        self.put_json(f"{self.batch_dir(owner, batch_id)}/cancel", {"at": at})

    def forget_parts(self, owner: str, batch_id: str) -> None:
        for name in self.part_names(owner, batch_id):
            self.drop(self.part_path(owner, batch_id, name))
        self._rmdir(f"{self.batch_dir(owner, batch_id)}/parts")

    def forget_batch(self, owner: str, batch_id: str) -> None:
        """Delete a batch's own files (its outputs are files of their own)."""
        self.forget_parts(owner, batch_id)
        self.mark_ended(owner, batch_id)
        directory = self.batch_dir(owner, batch_id)
        for name in BATCH_FILES[1:] + BATCH_FILES[:1]:  # its object last
            self.drop(f"{directory}/{name}")
        self._rmdir(directory)

    def _rmdir(self, directory: str) -> None:
        """Remove a local folder once it is empty (an object store has none)."""
        if self.local and self.fs.exists(directory) and not self.fs.ls(directory, detail=False):
            self.fs.rmdir(directory)
