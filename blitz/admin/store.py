"""Where the model table lives: a small key-value store every replica reads.

``Store`` is the interface (bytes by string key); the cluster's is Ray's GCS key-value
store (``deployments.model_store``), the tests' and a lone process's ``MemoryStore``.
``FileMirror`` keeps a copy of the table in a JSON file of Blitz's own, so a restart of
Ray (which empties the GCS) finds the added models again.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Protocol

logger = logging.getLogger("blitz.admin")

MODELS = "models/"  # models/<id>: one table entry (blitz.admin.table.Entry) as JSON
CHANGED = "changed"  # a token rewritten on every change: replicas poll this key alone
REPLICAS = "replicas/"  # replicas/<pool>/<replica>: what one pool replica holds and loads
MIRROR_MARK = "blitz-model-table"  # the file says it is Blitz's: anything else is not
# overwritten


class Store(Protocol):
    def get(self, key: str) -> bytes | None: ...
    def put(self, key: str, value: bytes) -> None: ...
    def delete(self, key: str) -> None: ...
    def keys(self, prefix: str) -> list[str]: ...


class MemoryStore:
    """A ``Store`` in one process's memory."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def get(self, key: str) -> bytes | None:
        return self.data.get(key)

    def put(self, key: str, value: bytes) -> None:
        self.data[key] = bytes(value)

    def delete(self, key: str) -> None:
        self.data.pop(key, None)

    def keys(self, prefix: str) -> list[str]:
        return sorted(k for k in self.data if k.startswith(prefix))


class FileMirror:
    """The table's entries in ``path`` as well, written whole (to a temporary file, then
    renamed) after each change; ``restore`` puts them back into an empty store. A file
    at ``path`` that Blitz did not write is never overwritten: the mirror refuses."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path).expanduser()

    def check(self) -> None:
        """Raise ``ValueError`` if ``path`` holds something that is not Blitz's table."""
        self.read()

    def read(self) -> dict[str, dict]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if not isinstance(data, dict) or data.get("kind") != MIRROR_MARK:
            raise ValueError(f"admin.models_file {str(self.path)!r} exists and is not a model "
                             "table Blitz wrote; name another file")
        entries = data.get("models")
        return entries if isinstance(entries, dict) else {}

    def write(self, entries: dict[str, dict]) -> None:
        self.check()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        body = json.dumps({"kind": MIRROR_MARK, "models": entries}, indent=2, sort_keys=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(body + "\n")
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def restore(self, store: Store) -> int:
        """The file's entries into ``store`` when it holds none; how many."""
        if store.keys(MODELS):
            return 0
        entries = self.read()
        for model_id, entry in entries.items():
            store.put(MODELS + model_id, json.dumps(entry).encode())
        if entries:
            logger.info("model table: %d entries restored from %s", len(entries), self.path)
        return len(entries)
