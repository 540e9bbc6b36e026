"""What a bulk job's OUTPUT holds, and what a run may skip, redo, delete or must refuse.

    OUTPUT/
      _BLITZ                  marks OUTPUT as written by ``blitz embed`` (written first)
      _attempts/<id>/<unit>/  a running attempt's files, until each unit is published
      <unit>/                 one per input file (``unit_name``), or per chunk of image
                              files (``blitz.bulk.images.chunk_name``)
        part-00000.parquet    id, embedding (fixed-size list), tokens; model in the metadata
        _errors.jsonl         the file's refused rows
        _SUCCESS              the unit's record (JSON), written last
      errors.jsonl            every unit's refused rows, rebuilt at the end of each run

The rules, each checked before anything is read or deleted:

- OUTPUT and INPUT (and an ``errors`` file) may not overlap either way: a job never
  reads its own output and never writes into its input.
- OUTPUT is new, empty, or carries ``_BLITZ``; a unit directory is only ever emptied by
  deleting the files its own record lists (``_SUCCESS``, or ``_PUBLISHING`` when a
  publish was cut off). Anything else found there is refused, never deleted.
- A unit is done when its ``_SUCCESS`` record matches this run: model, backend, dtype,
  dimensions, prompt, normalization, columns, and the input file's size and version
  (modification time or etag). A unit recorded with other options is redone only with
  ``force``; otherwise the run is refused naming each difference. One OUTPUT never mixes
  two models.
- Units are published whole: written under ``_attempts/`` first, then renamed into place
  (one rename where the filesystem has them) with the record last. Names starting with
  ``_`` or ``.`` are ignored by Parquet readers, so OUTPUT reads as one dataset.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import posixpath
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from blitz.errors import InvalidValue

OWNER = "_BLITZ"
ATTEMPTS = "_attempts"
DONE = "_SUCCESS"
PUBLISHING = "_PUBLISHING"
UNIT_ERRORS = "_errors.jsonl"
ERRORS_FILE = "errors.jsonl"
LOCK = "_lock"
PART = "part-00000.parquet"
RECORD_FORMAT = "blitz-embed-unit/1"
ROW_GROUP = 16_384


# --- places -----------------------------------------------------------------------------

def unit_name(base: str, file: str) -> str:
    """A unit's directory name: the file's path below ``base`` with "/" written "__" (so
    it reads as the file), then "-" and 8 hex digits of that path: two inputs never share
    a unit (``a/b.csv`` and ``a__b.csv``), and a rerun finds the same one."""
    relative = file[len(base):].lstrip("/") if base and file.startswith(base + "/") else (
        file.lstrip("/"))
    digest = hashlib.sha256(relative.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    return f"{relative.replace('/', '__')}-{digest}"


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def local_real(fs: Any, path: str) -> str:
    """``path`` with links resolved on a local filesystem (as it is elsewhere)."""
    return os.path.realpath(path) if is_local(fs) else path.rstrip("/")


def is_local(fs: Any) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return "file" in protocol or "local" in protocol


def check_no_overlap(in_fs: Any, in_root: str, files: list[str], out_fs: Any,
                     out_path: str, what: str = "OUTPUT") -> None:
    """Refuse an output place that is INPUT, holds INPUT or lies inside it."""
    if type(in_fs) is not type(out_fs):
        return
    out = local_real(out_fs, out_path)
    roots = [local_real(in_fs, in_root), *(local_real(in_fs, f) for f in files)]
    for root in roots:
        if _inside(out, root) or _inside(root, out):
            raise InvalidValue(
                f"{what} {out_path} overlaps INPUT ({root} is "
                f"{'inside' if _inside(root, out) and root != out else 'where'} {what} "
                f"{'is' if _inside(out, root) else 'goes'}): the job would read its own "
                f"output or write into its input; choose an {what} outside INPUT",
                param="output")


# --- owning OUTPUT ----------------------------------------------------------------------

@contextlib.contextmanager
def output_lock(fs: Any, out_path: str) -> Iterator[None]:
    """Hold OUTPUT for this job: a second job on the same local OUTPUT is refused while
    this one runs (the lock dies with the process). Object stores have no such lock: run
    one job per OUTPUT there."""
    if not is_local(fs):
        yield
        return
    import fcntl

    os.makedirs(out_path, exist_ok=True)
    with open(os.path.join(out_path, LOCK), "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise InvalidValue(f"another blitz embed is writing {out_path}; wait for it or "
                               "choose another OUTPUT", param="output") from exc
        yield


def claim_output(fs: Any, out_path: str) -> None:
    """Mark OUTPUT as ours, or refuse it when it holds what another program wrote."""
    marker = f"{out_path}/{OWNER}"
    if fs.exists(marker):
        return
    if fs.exists(out_path):
        foreign = [p for p in fs.ls(out_path, detail=False)
                   if posixpath.basename(p.rstrip("/")) != LOCK]
        if foreign:
            raise InvalidValue(
                f"OUTPUT {out_path} already holds files blitz embed did not write (no "
                f"{OWNER} marker; e.g. {posixpath.basename(foreign[0])}): choose a new or "
                "empty directory", param="output")
    fs.makedirs(out_path, exist_ok=True)
    with fs.open(marker, "wb") as out:
        out.write(json.dumps({"written_by": "blitz embed"}).encode() + b"\n")


def check_errors_target(fs: Any, path: str) -> None:
    """An errors file outside OUTPUT is only overwritten when it is one we wrote: empty,
    or a first line that is one of our rows."""
    if not fs.exists(path):
        return
    if fs.isdir(path):
        raise InvalidValue(f"errors file {path} is a directory", param="errors")
    with fs.open(path, "rb") as f:
        first = f.readline(65536)
    if not first:  # empty: what a run without refusals writes, and nothing to lose
        return
    try:
        row = json.loads(first)
    except ValueError:  # a blank line too: blitz embed writes none
        row = None
    if not (isinstance(row, dict) and {"id", "reason", "file"} <= set(row)):
        raise InvalidValue(f"errors file {path} exists and is not one blitz embed wrote; "
                           "choose another path", param="errors")


def new_attempt(fs: Any, out_path: str) -> str:
    """A fresh attempt directory; what earlier (stopped) attempts left is removed."""
    root = f"{out_path}/{ATTEMPTS}"
    if fs.exists(root):
        fs.rm(root, recursive=True)
    attempt = f"{root}/{uuid.uuid4().hex[:12]}"
    fs.makedirs(attempt, exist_ok=True)
    return attempt


def end_attempt(fs: Any, out_path: str) -> None:
    root = f"{out_path}/{ATTEMPTS}"
    if fs.exists(root):
        fs.rm(root, recursive=True)


# --- records and plans ------------------------------------------------------------------

def input_fingerprint(fs: Any, path: str) -> dict[str, Any]:
    """Size and version of an input file: what tells a rerun the file changed."""
    info = fs.info(path)
    version = (info.get("ETag") or info.get("etag") or info.get("mtime")
               or info.get("LastModified") or info.get("last_modified") or "")
    return {"size": int(info.get("size") or 0), "version": str(version).strip('"')}


@dataclass
class Unit:
    index: int
    file: str  # the input path on its filesystem
    url: str  # the input as a worker opens it
    kind: str  # json, csv, parquet
    directory: str  # OUTPUT/<unit>
    fingerprint: dict[str, Any]
    done: dict[str, Any] | None = None  # the record of a finished unit this run keeps
    stale: dict[str, Any] | None = None  # a record (or publish marker) to remove first
    members: list[tuple[str, str]] | None = None  # a chunk of image files: (url, id) each


@dataclass
class Plan:
    units: list[Unit] = field(default_factory=list)
    # chunks of images that a rerun over the image folder no longer makes (the image a
    # chunk started at was removed: its other images joined the chunk before it), with
    # their records; --force removes them (``remove_orphans``), else the run is refused
    orphans: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    @property
    def pending(self) -> list[Unit]:
        return [u for u in self.units if u.done is None]


def read_record(fs: Any, path: str) -> dict[str, Any] | None:
    """A unit's record or publish marker; None when ``path`` is absent or not ours."""
    if not fs.exists(path):
        return None
    try:
        record = json.loads(fs.cat_file(path))
    except ValueError:
        return None
    ok = isinstance(record, dict) and record.get("format") == RECORD_FORMAT and isinstance(
        record.get("files"), list)
    return record if ok else None


def differences(record: dict[str, Any], job: dict[str, Any],
                fingerprint: dict[str, Any]) -> list[str]:
    """What differs between a finished unit's record and this run, in words."""
    said = []
    for key, value in job.items():
        old = record.get("job", {}).get(key)
        if old != value:
            said.append(f"{key} {old!r} (this run: {value!r})")
    if record.get("input", {}) != fingerprint:
        said.append(f"the input file changed (size, version {record.get('input')} -> "
                    f"{fingerprint})")
    return said


def plan_units(fs: Any, out_path: str, units: list[Unit], job: dict[str, Any],
               force: bool) -> Plan:
    """Which units are done, which are redone (removing only their recorded files), and
    refuse the run when a unit holds what it must not remove or differs without force."""
    refusals = []
    for unit in units:
        if not fs.exists(unit.directory):
            continue
        done = read_record(fs, f"{unit.directory}/{DONE}")
        publishing = read_record(fs, f"{unit.directory}/{PUBLISHING}")
        if done is not None and publishing is None:
            said = differences(done, job, unit.fingerprint)
            if not said:
                unit.done = done
            elif force:
                unit.stale = done
            else:
                refusals.append(f"{unit.directory} was written with " + "; ".join(said))
        elif publishing is not None:
            unit.stale = publishing  # a publish cut off: its files are ours to remove
        elif fs.exists(f"{unit.directory}/{DONE}") or fs.ls(unit.directory, detail=False):
            refusals.append(f"{unit.directory} holds files blitz embed did not record; "
                            "remove them or choose another OUTPUT")
    orphans = orphan_chunks(fs, out_path, units)
    if orphans and not force:
        refusals.append(", ".join(d for d, _ in orphans) + " hold images that no chunk of "
                        "this run holds (the image each started at was removed, or all of "
                        "its images), so their ids would be in OUTPUT twice or stale; "
                        "--force removes them")
    if refusals:
        hint = ("" if force else "; rerun with --force to redo these units with this "
                "run's options, or choose another OUTPUT")
        raise InvalidValue("refusing to mix outputs: " + " | ".join(refusals) + hint,
                           param="output")
    return Plan(units, orphans)


def orphan_chunks(fs: Any, out_path: str, units: list[Unit]) -> list[tuple[str, dict[str, Any]]]:
    """When this run embeds a folder of images: the chunks of images in OUTPUT (ours, by
    their record) that it does not make. An OUTPUT holds one folder's images: chunks are
    named by the path below the folder (``blitz.bulk.images.chunk_name``)."""
    if not any(u.kind == "images" for u in units):
        return []
    planned = {posixpath.basename(u.directory) for u in units}
    found = []
    for directory in sorted(fs.ls(out_path, detail=False)):
        name = posixpath.basename(directory.rstrip("/"))
        if not name.startswith("images-") or name in planned:
            continue
        record = (read_record(fs, f"{out_path}/{name}/{PUBLISHING}")
                  or read_record(fs, f"{out_path}/{name}/{DONE}"))
        if record is not None and "images" in record.get("input", {}):
            found.append((f"{out_path}/{name}", record))
    return found


def remove_orphans(fs: Any, plan: Plan) -> None:
    """Empty each orphaned chunk by its record (``remove_recorded``), then its folder."""
    for directory, record in plan.orphans:
        remove_recorded(fs, directory, record)
        if is_local(fs) and not fs.ls(directory, detail=False):
            fs.rmdir(directory)  # an object store's prefix is gone with its last file


def remove_recorded(fs: Any, directory: str, record: dict[str, Any]) -> None:
    """Delete what a record lists, then the record; nothing else."""
    for name in record["files"]:
        if isinstance(name, str) and "/" not in name and name not in ("", ".", ".."):
            path = f"{directory}/{name}"
            if fs.exists(path):
                fs.rm_file(path)
    for marker in (DONE, PUBLISHING):
        if fs.exists(f"{directory}/{marker}"):
            fs.rm_file(f"{directory}/{marker}")
