"""The on-disk model cache: exported/quantized models and object-storage downloads.

Layout under the cache root (``BlitzSettings.resolved_cache_dir()``)::

    <root>/<area>/<key>/              a finished entry; never changes once it exists
    <root>/<area>/<key>/blitz-entry.json   what was built, from what, with which libraries
    <root>/<area>/.<key>.<random>/    an entry being built (same filesystem, so rename is atomic)
    <root>/locks/<area>-<key>.lock    flock'd by whoever builds that entry

An entry is built in a temporary directory beside its final place and renamed into
place in one ``os.rename``, under an exclusive ``fcntl.flock``: two processes (or
threads) preparing the same entry build it once, the second waits and reuses it, and
nobody ever sees a half-written entry. A finished entry is found without taking the lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

logger = logging.getLogger("blitz.model_cache")

ENTRY_FILE = "blitz-entry.json"
LOCK_DIR = "locks"
VERSIONED_LIBRARIES = ("sentence-transformers", "transformers", "torch", "optimum",
                       "optimum-onnx", "onnx", "onnxruntime")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class CacheEntry:
    """A finished cache entry: its directory, its recorded metadata, and who built it."""

    path: Path
    meta: dict[str, Any]
    built: bool  # True when this call built it, False when it was already there


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """``cache_dir``, else ``$BLITZ_CACHE_DIR``, else ``~/.cache/blitz`` (as the settings say)."""
    from blitz.config import BlitzSettings  # late: blitz.config imports blitz.registry

    chosen = os.fspath(cache_dir) if cache_dir is not None else None
    return BlitzSettings(cache_dir=chosen).resolved_cache_dir()


def library_versions() -> dict[str, str]:
    """Installed versions of the libraries whose output an entry depends on."""
    versions = {}
    for name in VERSIONED_LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


def entry_key(label: str, parts: dict[str, Any]) -> str:
    """A readable, filesystem-safe key: ``label`` plus a digest of every part."""
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()
    slug = _UNSAFE.sub("_", label).strip("._-")[:60] or "entry"
    return f"{slug}-{digest[:16]}"


def directory_fingerprint(path: Path) -> str:
    """A cheap digest of a directory's file names, sizes and modification times."""
    rows = []
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        stat = file.stat()
        rows.append(f"{file.relative_to(path).as_posix()}:{stat.st_size}:{stat.st_mtime_ns}")
    return hashlib.sha256("\n".join(rows).encode()).hexdigest()


def find_entry(root: Path, area: str, key: str) -> CacheEntry | None:
    """The finished entry ``area/key`` if there is one; never blocks."""
    path = root / area / key
    try:
        meta = json.loads((path / ENTRY_FILE).read_text())
    except (FileNotFoundError, NotADirectoryError):
        return None
    return CacheEntry(path, meta, built=False)


def lock_path(root: Path, area: str, key: str) -> Path:
    """The lock file that whoever builds ``area/key`` holds."""
    return root / LOCK_DIR / f"{area}-{key}.lock"


@contextlib.contextmanager
def file_lock(path: Path, waiting_message: str | None = None) -> Iterator[None]:
    """An exclusive ``flock`` on ``path``: across processes, and across threads of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting_message:
                logger.info(waiting_message)
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def get_or_build(root: Path, area: str, key: str,
                 build: Callable[[Path], dict[str, Any]]) -> CacheEntry:
    """The entry ``area/key``, building it with ``build(tmp_dir) -> metadata`` if missing.

    ``build`` fills ``tmp_dir`` and returns what to record in the entry's metadata; if it
    raises, nothing is cached and the error propagates.
    """
    found = find_entry(root, area, key)
    if found:
        return found
    area_dir = root / area
    area_dir.mkdir(parents=True, exist_ok=True)
    with file_lock(lock_path(root, area, key), f"waiting for another process to finish {area}/{key}"):
        found = find_entry(root, area, key)  # built while we waited for the lock
        if found:
            return found
        _remove_abandoned(area_dir, key)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=area_dir))
        try:
            started = time.monotonic()
            meta = dict(build(tmp))
            meta.setdefault("key", key)
            meta.setdefault("created", time.time())
            meta.setdefault("build_seconds", round(time.monotonic() - started, 3))
            _write_json(tmp / ENTRY_FILE, meta)
            _fsync_files(tmp)
            final = area_dir / key
            if final.exists():  # a directory without a readable entry file: not ours to trust
                shutil.rmtree(final)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        _fsync_dir(area_dir)
        return CacheEntry(final, meta, built=True)


def _remove_abandoned(area_dir: Path, key: str) -> None:
    """Temporary dirs of ``key`` left by builders that died (we hold its lock, so none live)."""
    for stale in area_dir.glob(f".{key}.*"):
        shutil.rmtree(stale, ignore_errors=True)


def _write_json(path: Path, value: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(value, handle, indent=2, sort_keys=True, default=str)
        handle.flush()
        os.fsync(handle.fileno())


def _fsync_files(directory: Path) -> None:
    """Flush every file of a finished build to disk before it is renamed into place."""
    for file in directory.rglob("*"):
        if file.is_file():
            with open(file, "rb") as handle:
                os.fsync(handle.fileno())


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
