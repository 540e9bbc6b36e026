"""The on-disk model cache: exported/quantized models and object-storage downloads.

Layout under the cache root (``cache_root``; a deployment passes
``BlitzSettings.resolved_cache_dir()``)::

    <root>/<area>/<key>/              a finished entry; never changes once it exists
    <root>/<area>/<key>/blitz-entry.json   what was built, from what, with which libraries
    <root>/<area>/.<key>.<random>/    an entry being built (same filesystem, so rename is atomic)
    <root>/locks/<area>-<key>.lock    locked by whoever builds that entry

An entry is built in a temporary directory beside its final place and renamed into
place in one ``os.rename``, under an exclusive file lock (``filelock``: ``flock`` on
POSIX): two processes (or
threads) preparing the same entry build it once, the second waits and reuses it, and
nobody ever sees a half-written entry. A finished entry is found without taking the lock.

A finished entry is trusted only while it still looks finished and as built: it is a
directory (not a link), its ``blitz-entry.json`` parses and holds every field its reader
needs with the right type (``contents``, and the caller's ``fields``), every file it lists
under ``contents`` (recorded at build time) lies inside the entry (no absolute path, no
``..``, no link out) with the size it was built with, and the caller's ``validate``
(loading the model from it, say) succeeds. Anyone who can write the cache can forge a
record; a forged one is rebuilt, never followed. An entry that fails is logged, moved
aside and deleted under the lock (only ``<area>/<key>`` itself: a link is unlinked, never
followed, and no path a record names is touched), and rebuilt once; a rebuilt entry that
fails again is a real error. Nobody waits for the lock forever: after
``lock_timeout`` seconds (``LOCK_TIMEOUT_S`` unless the caller says) the waiter gives up
with ``CacheLockTimeout`` naming the lock file and the entry.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path, PurePosixPath
from typing import Any

from filelock import FileLock, Timeout

from blitz.errors import LoadProblem

logger = logging.getLogger("blitz.model_cache")

ENTRY_FILE = "blitz-entry.json"
LOCK_DIR = "locks"
VERSIONED_LIBRARIES = ("sentence-transformers", "transformers", "tokenizers", "torch", "onnx",
                       "onnxruntime")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
# How long a process waits for another to finish an entry before giving up. An ONNX export
# plus int8 quantization and its accuracy checks takes minutes on a small CPU; a download
# of a large model from object storage can take as long.
LOCK_TIMEOUT_S = 600.0
_POLL_S = 0.05  # between tries for a held lock
_STILL_WAITING_S = 60.0  # log again at this interval while waiting
CACHE_DIR_ENV = "BLITZ_CACHE_DIR"
Validate = Callable[["CacheEntry"], object]
Fields = dict[str, type | tuple[type, ...]]  # record field -> the type(s) its value must have


@dataclass(frozen=True)
class CacheEntry:
    """A finished cache entry: its directory, its recorded metadata, and who built it."""

    path: Path
    meta: dict[str, Any]
    built: bool  # True when this call built it, False when it was already there


class CacheLockTimeout(LoadProblem):
    """A model cache entry's lock stayed held past the wait allowed for it."""


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """``cache_dir``, else ``$BLITZ_CACHE_DIR``, else ``~/.cache/blitz``."""
    chosen = os.fspath(cache_dir) if cache_dir else os.environ.get(CACHE_DIR_ENV)
    return Path(chosen).expanduser() if chosen else Path.home() / ".cache" / "blitz"


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
    """The finished entry ``area/key`` if there is one; never blocks.

    A directory whose ``blitz-entry.json`` is missing, unreadable or not a JSON object is
    not a finished entry (``get_or_build`` rebuilds it).
    """
    return _read_entry(root / area / key)[0]


def _read_entry(path: Path) -> tuple[CacheEntry | None, str | None]:
    """The entry at ``path``, or None and what is wrong with what is there (None if nothing)."""
    try:
        meta = json.loads((path / ENTRY_FILE).read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError):
        there = path.exists() or path.is_symlink()
        return None, (f"it has no {ENTRY_FILE}" if there else None)
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError included
        return None, f"its {ENTRY_FILE} is unreadable: {type(exc).__name__}: {exc}"
    if not isinstance(meta, dict):
        return None, f"its {ENTRY_FILE} is not a JSON object"
    return CacheEntry(path, meta, built=False), None


def entry_problem(entry: CacheEntry, fields: Fields | None = None) -> str | None:
    """What is wrong with ``entry``, or None. It must be a directory, not a link (builds
    are renamed into place); its record must hold ``contents`` and every one of ``fields``
    with its type; each file recorded under ``contents`` must lie inside the entry and
    still have the size it was built with (a cheap check: sizes, not digests)."""
    if entry.path.is_symlink():
        return "it is a symbolic link, not a directory this cache built"
    problem = record_problem(entry.meta, {"contents": dict, **(fields or {})})
    if problem:
        return problem
    for relative, size in sorted(entry.meta["contents"].items()):
        try:
            file = inside(entry.path, relative)
        except ValueError as exc:
            return str(exc)
        if not isinstance(size, int) or isinstance(size, bool):
            return f"{ENTRY_FILE} records no valid size for {relative}"
        try:
            actual = file.stat().st_size
        except OSError:
            return f"{relative} is missing"
        if actual != size:
            return f"{relative} has {actual} bytes, {size} when it was built"
    return None


def record_problem(meta: dict[str, Any], fields: Fields) -> str | None:
    """Which of ``fields`` the record ``meta`` lacks or holds with the wrong type, or None
    (``True`` is not a number here, though Python's ``bool`` is an ``int``)."""
    for name, kind in fields.items():
        if name not in meta:
            return f"{ENTRY_FILE} has no {name}"
        kinds = kind if isinstance(kind, tuple) else (kind,)
        value = meta[name]
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            return f"{ENTRY_FILE} has a {name} of type {type(value).__name__}"
    return None


def inside(directory: Path, relative: object) -> Path:
    """The file ``directory/relative``; raises ``ValueError`` unless ``relative`` is a
    relative path without ``..`` that, links resolved, names a file inside ``directory``."""
    if not isinstance(relative, str) or not relative:
        raise ValueError(f"{ENTRY_FILE} names {relative!r}, not a file name")
    if PurePosixPath(relative).is_absolute() or ".." in PurePosixPath(relative).parts:
        raise ValueError(f"{ENTRY_FILE} names {relative!r}, outside its entry")
    try:
        base = directory.resolve()
        resolved = (directory / relative).resolve()
    except (OSError, ValueError, RuntimeError) as exc:  # a link loop, a NUL in the name
        raise ValueError(f"{ENTRY_FILE} names {relative!r}, which cannot be resolved: "
                         f"{type(exc).__name__}") from exc
    if resolved == base or not resolved.is_relative_to(base):
        raise ValueError(f"{ENTRY_FILE} names {relative!r}, which resolves outside its entry")
    return directory / relative


def lock_path(root: Path, area: str, key: str) -> Path:
    """The lock file that whoever builds ``area/key`` holds."""
    return root / LOCK_DIR / f"{area}-{key}.lock"


@contextlib.contextmanager
def file_lock(path: Path, waiting_message: str | None = None, *,
              timeout: float | None = None, what: str | None = None,
              model: str | None = None) -> Iterator[None]:
    """An exclusive lock on the file ``path``: across processes, and across threads of one.

    Waits at most ``timeout`` seconds (``LOCK_TIMEOUT_S`` when None; ``math.inf`` for no
    limit), polling (it blocks its thread: never call it on an event loop), logging
    ``waiting_message`` when it has to wait and every ``_STILL_WAITING_S`` after, then
    raises ``CacheLockTimeout`` naming the lock file, ``what`` it guards and ``model``. A
    lock held by a process that died is free again at once (the kernel drops its flock);
    only a live holder, still working or hung, can make us wait.
    """
    limit = LOCK_TIMEOUT_S if timeout is None else float(timeout)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(path)  # one per call: threads of a process contend like processes
    try:
        _acquire(lock, limit, waiting_message)
    except Timeout:
        who = f"model {model!r}: " if model else ""
        guarded = f" (held while {what} is built)" if what else ""
        raise CacheLockTimeout(
            f"{who}gave up after {limit:g} s waiting for the model cache lock "
            f"{path}{guarded}: another process is still building it, or hung while "
            f"holding the lock. Find it with `fuser -v {path}` or `lsof {path}` (a "
            "replica or a `blitz optimize` run), let it finish or stop it, or allow a "
            "longer lock timeout") from None
    try:
        yield
    finally:
        lock.release()


def _acquire(lock: FileLock, limit: float, waiting_message: str | None) -> None:
    """Take ``lock``, logging while it waits; raises ``Timeout`` after ``limit`` seconds."""
    started = time.monotonic()
    try:
        lock.acquire(timeout=0)
        return
    except Timeout:
        if waiting_message:
            logger.info("%s", waiting_message)
    while True:
        waited = time.monotonic() - started
        try:
            lock.acquire(timeout=max(0.0, min(limit - waited, _STILL_WAITING_S)),
                         poll_interval=_POLL_S)
            return
        except Timeout:
            waited = time.monotonic() - started
            if waited >= limit:
                raise
            if waiting_message:
                logger.info("%s (waited %.0f s of at most %g s)", waiting_message, waited, limit)


def get_or_build(root: Path, area: str, key: str, build: Callable[[Path], dict[str, Any]], *,
                 validate: Validate | None = None, fields: Fields | None = None,
                 lock_timeout: float | None = None, model: str | None = None) -> CacheEntry:
    """The entry ``area/key``, building it with ``build(tmp_dir) -> metadata`` if missing.

    ``build`` fills ``tmp_dir`` and returns what to record in the entry's metadata; if it
    raises, nothing is cached and the error propagates.

    A found entry must pass ``entry_problem`` (its record holding ``fields``, the ones
    the caller reads) and then ``validate(entry)`` (which raises on an entry it cannot
    use); one that does not is moved aside, deleted and rebuilt, with a warning naming it. A rebuilt entry that fails ``validate`` raises its error.
    ``lock_timeout`` and ``model`` go to ``file_lock``.
    """
    found = find_entry(root, area, key)
    if found is not None and _usable(found, validate, fields):
        return found
    area_dir = root / area
    area_dir.mkdir(parents=True, exist_ok=True)
    with file_lock(lock_path(root, area, key),
                   f"waiting for another process to finish {area}/{key}",
                   timeout=lock_timeout, what=f"{area}/{key}", model=model):
        final = area_dir / key
        current, problem = _read_entry(final)  # built while we waited for the lock?
        if problem:
            logger.warning("model cache entry %s is corrupt (%s); rebuilding it", final, problem)
        if current is not None and (found is None or current.meta != found.meta):
            if _usable(current, validate, fields):
                return current
        if final.exists() or final.is_symlink():  # corrupt: out of everyone's way, disk freed
            _discard(area_dir, final, key)
        _remove_abandoned(area_dir, key)
        entry = _build(area_dir, key, build)
    if validate is not None:
        validate(entry)  # a fresh build that cannot be used is a real error
    return entry


def _usable(entry: CacheEntry, validate: Validate | None, fields: Fields | None) -> bool:
    """Whether ``entry`` passes its checks; logs why not when it does not."""
    problem = entry_problem(entry, fields)
    if problem is None and validate is not None:
        try:
            validate(entry)
        except MemoryError:  # says nothing about the entry; a rebuild would not help
            raise
        except Exception as exc:  # whatever loading from a corrupt entry raises
            problem = f"it cannot be used: {type(exc).__name__}: {exc}"
    if problem is None:
        return True
    logger.warning("model cache entry %s is corrupt (%s); rebuilding it", entry.path, problem)
    return False


def _build(area_dir: Path, key: str, build: Callable[[Path], dict[str, Any]]) -> CacheEntry:
    """Build ``key`` in a temporary dir and rename it into place (the caller holds the lock)."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=area_dir))
    final = area_dir / key
    try:
        started = time.monotonic()
        meta = dict(build(tmp))
        meta.setdefault("key", key)
        meta.setdefault("created", time.time())
        meta.setdefault("build_seconds", round(time.monotonic() - started, 3))
        meta["build_id"] = uuid.uuid4().hex  # tells this build from a later one of the key
        meta["contents"] = _contents(tmp)
        _write_json(tmp / ENTRY_FILE, meta)
        _fsync_files(tmp)
        os.rename(tmp, final)  # nothing is there: the caller cleared the way under the lock
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(area_dir)
    return CacheEntry(final, meta, built=True)


def _discard(area_dir: Path, final: Path, key: str) -> None:
    """Move a corrupt ``final`` aside in one rename (readers never see it half deleted),
    then delete it: a link is unlinked, not followed; a directory is deleted with the
    links in it, never what they point to (``shutil.rmtree`` does not follow them)."""
    aside = area_dir / f".{key}.discarded-{uuid.uuid4().hex[:8]}"
    os.rename(final, aside)
    if aside.is_dir() and not aside.is_symlink():
        shutil.rmtree(aside, ignore_errors=True)
    else:
        aside.unlink(missing_ok=True)


def _contents(directory: Path) -> dict[str, int]:
    """Relative path -> size of every file of a build but its entry file."""
    return {file.relative_to(directory).as_posix(): file.stat().st_size
            for file in sorted(directory.rglob("*"))
            if file.is_file() and file.name != ENTRY_FILE}


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
