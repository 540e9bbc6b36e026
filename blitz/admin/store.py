"""Where the model table lives: a small key-value store every replica reads.

``Store`` is the interface (bytes by string key, and ``add``: a put that only a key's
first writer wins); the cluster's is Ray's GCS key-value store
(``deployments.model_admin.GcsStore``), the tests' and a lone process's ``MemoryStore``.

The table is versioned: ``table/<version>`` holds the whole table as it was after that
change, and a change is written as the next version with ``add`` (``commit``), so of two
changes made at once from two ingress replicas on the same version only one is written;
the other reads the new table and is checked again against it (``blitz.admin.table``).
Readers take the highest version (``read_table``) and never go back to a lower one.
``CHANGED`` is rewritten after each commit: replicas poll that key alone.

``FileMirror`` keeps a copy of the table, with its version, in a JSON file of Blitz's own,
so a restart of Ray (which empties the GCS) finds the added models again; it is put back
only into a store whose table is older than it, and a file is never overwritten with an
older table than the one it holds.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import tempfile
from pathlib import Path
from typing import Protocol

logger = logging.getLogger("blitz.admin")

TABLE = "table/"  # table/<version, 12 digits>: {"version", "models": {id: entry}} as JSON
MODELS = "models/"  # models/<id>: one entry, as versions before 1 kept it (read as version 0)
CHANGED = "changed"  # a token rewritten on every change: replicas poll this key alone
KEPT_VERSIONS = 32  # older versions are deleted by the writer of a new one
REPLICAS = "replicas/"  # replicas/<pool>/<replica>: what one pool replica holds and loads
MIRROR_MARK = "blitz-model-table"  # the file says it is Blitz's: anything else is not
# overwritten


class Store(Protocol):
    def get(self, key: str) -> bytes | None: ...
    def put(self, key: str, value: bytes) -> None: ...
    def delete(self, key: str) -> None: ...
    def keys(self, prefix: str) -> list[str]: ...
    def add(self, key: str, value: bytes) -> bool:
        """Put ``value`` only if ``key`` holds nothing; whether it was written (atomic)."""
        ...


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

    def add(self, key: str, value: bytes) -> bool:
        if key in self.data:
            return False
        self.data[key] = bytes(value)
        return True


def version_key(version: int) -> str:
    return f"{TABLE}{version:012d}"


def latest_version(store: Store) -> int:
    """The highest version written (0: none)."""
    numbers = (k[len(TABLE):] for k in store.keys(TABLE))
    return max((int(n) for n in numbers if n.isdigit()), default=0)


def read_table(store: Store) -> tuple[int, dict[str, dict]]:
    """The newest version and its entries as JSON objects, by id. Version 0: nothing
    committed yet (entries that versions before 1 kept under ``models/`` are read)."""
    for _ in range(KEPT_VERSIONS):  # a version deleted while read: the newer one
        version = latest_version(store)
        if version == 0:
            legacy = {}
            for key in store.keys(MODELS):
                try:
                    legacy[key[len(MODELS):]] = json.loads(store.get(key) or b"null")
                except ValueError:
                    continue
            return 0, {i: e for i, e in legacy.items() if isinstance(e, dict)}
        data = store.get(version_key(version))
        if data is not None:
            table = json.loads(data)
            return version, dict(table.get("models") or {})
    raise RuntimeError("the model table kept changing while it was read")


def commit(store: Store, version: int, entries: dict[str, dict]) -> bool:
    """``entries`` written as ``version`` unless another writer wrote that version first
    (then False: read the table again and redo the change on it); older versions past
    ``KEPT_VERSIONS`` deleted; the change token rewritten."""
    body = json.dumps({"version": version, "models": entries}, sort_keys=True).encode()
    if not store.add(version_key(version), body):
        return False
    for key in store.keys(TABLE):
        number = key[len(TABLE):]
        if number.isdigit() and int(number) <= version - KEPT_VERSIONS:
            store.delete(key)
    store.put(CHANGED, f"{version}-{secrets.token_hex(4)}".encode())
    return True


class FileMirror:
    """The table's entries and version in ``path`` as well, written whole (to a temporary
    file, then renamed) after each change a replica sees; ``restore`` puts them back into
    a store whose table is older. A file at ``path`` that Blitz did not write is never
    overwritten (the mirror refuses), nor one that holds a newer version."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path).expanduser()

    def check(self) -> None:
        """Raise ``ValueError`` if ``path`` holds something that is not Blitz's table."""
        self.read()

    def read(self) -> tuple[int, dict[str, dict]]:
        """The file's version (0: no file, or one written before versions) and entries."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return 0, {}
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if not isinstance(data, dict) or data.get("kind") != MIRROR_MARK:
            raise ValueError(f"admin.models_file {str(self.path)!r} exists and is not a model "
                             "table Blitz wrote; name another file")
        entries, version = data.get("models"), data.get("version", 0)
        return (version if isinstance(version, int) and version > 0 else 0,
                entries if isinstance(entries, dict) else {})

    def write(self, version: int, entries: dict[str, dict]) -> bool:
        """Write ``version`` unless the file holds it or a newer one; whether it wrote."""
        held, _ = self.read()
        if version <= held:
            return False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        body = json.dumps({"kind": MIRROR_MARK, "version": version, "models": entries},
                          indent=2, sort_keys=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(body + "\n")
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return True

    def restore(self, store: Store) -> int:
        """The file's table into ``store`` when the store's is older (a restart of Ray
        emptied it; a file of versions before 1 only into an empty store): as the file's
        version, so no replica takes it for older than what it saw. How many entries."""
        version, entries = self.read()
        current, held = read_table(store)
        if not entries or not (version > current or (current == 0 and not held)):
            return 0
        if not commit(store, max(version, 1), entries):
            return 0  # another ingress put its copy back first
        logger.info("model table: %d entries of version %d restored from %s", len(entries),
                    max(version, 1), self.path)
        return len(entries)
