"""Bulk embedding, the Ray-free half: what ``deployments/bulk.py`` runs on Ray Data.

A job embeds every row of INPUT (Parquet, JSONL or CSV files: one file, a directory or
a glob, local or object storage) into OUTPUT, one *unit* per input file:

    OUTPUT/<unit>/            <unit> is the file's path below INPUT, "/" written "__"
        *.parquet             id, embedding (fixed-size list), tokens; model in the metadata
        _errors/*.jsonl       rows refused in this unit (id, reason, file)
        _SUCCESS              written last: the unit is complete
    OUTPUT/errors.jsonl       every unit's refused rows, rebuilt at the end of each run

Resuming: a unit whose ``_SUCCESS`` exists is skipped; any other unit directory is
emptied and the file is embedded again. A stopped job therefore loses at most the
files it was working on. Names starting with ``_`` or ``.`` are ignored by Parquet
readers (pyarrow, Spark, Ray Data), so ``OUTPUT`` reads as one dataset of the vectors.

``BatchEncoder`` is the per-batch function: refuse bad rows with a reason, apply the
prompt, encode through the same ``load_encoder`` as the pools (token-budget
micro-batches, same backends and accuracy guard), then ``dimensions`` and ``dtype``
exactly as the native API does.
"""

from __future__ import annotations

import hashlib
import json
import math
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from blitz.config import BulkSettings
from blitz.encoders.loading import backend_for, load_encoder
from blitz.errors import InvalidValue
from blitz.postprocess import quantize, truncate_dimensions
from blitz.registry import ModelSpec, read_dimension
from blitz.service import apply_prompt

FORMATS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv"}
DONE = "_SUCCESS"
ERRORS_DIR = "_errors"
ERRORS_FILE = "errors.jsonl"
GLOB_CHARS = "*?["


def embed_dataset(input: str, output: str, **options: Any) -> Any:
    """Embed every row of ``input`` into ``output``: the Python form of ``blitz embed``.

    The job runs on Ray Data (``deployments.bulk.embed_dataset``, which documents the
    keyword arguments: ``settings``, ``options``, ``address``, ``log``); it is imported
    here only when called, so importing ``blitz`` never imports Ray.
    """
    from deployments.bulk import embed_dataset as run_on_ray_data

    return run_on_ray_data(input, output, **options)


# --- inputs and units -----------------------------------------------------------------

def format_of(path: str) -> str | None:
    """``parquet``, ``json`` (JSON lines) or ``csv`` from the file name; None otherwise."""
    name = path.lower()
    for compression in (".gz", ".zst", ".bz2"):
        name = name.removesuffix(compression)
    return FORMATS.get(posixpath.splitext(name)[1])


def list_inputs(fs: Any, path: str) -> tuple[str, list[str]]:
    """(base, input files) for a file, a directory or a glob on the fsspec ``fs``.

    A directory is searched recursively; files of unknown formats and names starting
    with ``_`` or ``.`` are left out. ``base`` is what unit names are relative to.
    """
    path = path.rstrip("/")
    if any(c in path for c in GLOB_CHARS):
        base = path[: min(path.find(c) for c in GLOB_CHARS if c in path)].rpartition("/")[0]
        found = fs.glob(path)
    elif fs.isdir(path):
        base, found = path, fs.find(path)
    elif fs.exists(path):
        base, found = posixpath.dirname(path), [path]
    else:
        raise InvalidValue(f"input {path} does not exist", param="input")
    files = sorted(f for f in found if format_of(f) and not _hidden(f, base))
    if not files:
        raise InvalidValue(f"no Parquet, JSONL or CSV files under {path}", param="input")
    return base, files


def _hidden(file: str, base: str) -> bool:
    relative = file[len(base):].lstrip("/") if base and file.startswith(base) else file
    return any(part.startswith(("_", ".")) for part in relative.split("/"))


def unit_name(base: str, file: str) -> str:
    """The output directory name for ``file``: its path below ``base``, "/" written "__"."""
    relative = file[len(base):].lstrip("/") if base and file.startswith(base) else (
        posixpath.basename(file))
    return relative.replace("/", "__")


def unit_done(fs: Any, unit_dir: str) -> bool:
    return bool(fs.exists(f"{unit_dir}/{DONE}"))


def reset_unit(fs: Any, unit_dir: str) -> None:
    """Remove what an interrupted run left of a unit."""
    if fs.exists(unit_dir):
        fs.rm(unit_dir, recursive=True)


def finish_unit(fs: Any, unit_dir: str) -> None:
    fs.makedirs(unit_dir, exist_ok=True)
    with fs.open(f"{unit_dir}/{DONE}", "wb") as out:
        out.write(b"")


def unit_rows(fs: Any, unit_dir: str) -> int:
    """Rows in a unit's Parquet files (read from their footers)."""
    import pyarrow.parquet as pq

    total = 0
    for file in fs.glob(f"{unit_dir}/*.parquet"):
        with fs.open(file, "rb") as f:
            total += pq.ParquetFile(f).metadata.num_rows
    return total


# --- the per-batch function -----------------------------------------------------------

def refusal(value: Any) -> str | None:
    """Why a text cannot be embedded, or None when it can."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "null text"  # pandas and numpy write a missing value as NaN
    if not isinstance(value, str):
        return f"not a string ({type(value).__name__})"
    if not value.strip():
        return "empty text"
    return None


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python value JSON can hold."""
    return value.item() if isinstance(value, np.generic) else value


@dataclass(frozen=True)
class Refused:
    id: Any
    reason: str


def check_options(spec: ModelSpec, options: BulkSettings) -> None:
    """Refuse a job whose options the model cannot honour, before any data is read."""
    if spec.kind != "embedding":
        raise InvalidValue(f"model {spec.id!r} is a {spec.kind}; only embedding models "
                           "can embed a corpus", param="model")
    apply_prompt(spec, [], options.prompt_name)  # raises for an unknown prompt name
    known = read_dimension(spec)
    if options.dimensions is not None and known is not None and options.dimensions > known:
        raise InvalidValue(f"dimensions={options.dimensions} is larger than model "
                           f"{spec.id!r}'s dimension {known}", param="dimensions")


def backend_label(spec: ModelSpec, device: str) -> str:
    backend = backend_for(spec, device)
    return f"torch-{spec.gpu_dtype}" if device != "cpu" and backend == "torch" else backend


class BatchEncoder:
    """One loaded model and a job's options: Arrow batches in, output tables out."""

    def __init__(self, spec: ModelSpec, options: BulkSettings, device: str = "cpu",
                 cache_dir: str | Path | None = None):
        check_options(spec, options)
        self.spec = spec
        self.options = options
        self.normalize = spec.normalize if options.normalize is None else options.normalize
        self.encoder = load_encoder(spec, device, cache_dir)
        self.metadata = {b"blitz.model": spec.id.encode(),
                         b"blitz.backend": backend_label(spec, self.encoder.device).encode(),
                         b"blitz.dtype": options.dtype.encode(),
                         b"blitz.normalize": str(self.normalize).lower().encode()}

    def encode(self, batch: dict[str, np.ndarray]) -> tuple[pa.Table, list[Refused]]:
        """The embeddings of ``batch``'s good rows, and the refused rows with reasons.

        ``batch`` maps column names to arrays (Ray Data's numpy batches)."""
        texts = list(batch[self.options.text_column])
        ids = np.asarray(batch[self.options.id_column])
        known = batch.get(REFUSED)  # reasons the reader found (JSON lines)
        good, refused = [], []
        for i, text in enumerate(texts):
            reason = (known[i] or None) if known is not None else refusal(text)
            if reason is None:
                good.append(i)
            else:
                refused.append(Refused(_plain(ids[i]), reason))
        prompted = apply_prompt(self.spec, [texts[i] for i in good], self.options.prompt_name)
        if prompted:
            encoded = self.encoder.embed(prompted, normalize=self.normalize, truncate=True)
            values, counts = encoded.values, encoded.token_counts
        else:
            values = np.zeros((0, self.encoder.dimension or 1), np.float32)
            counts = np.zeros(0, np.int64)
        values = quantize(truncate_dimensions(values, self.options.dimensions, self.normalize),
                          self.options.dtype)
        return self.table(pa.array(ids[np.asarray(good, np.int64)]), values, counts), refused

    def table(self, ids: pa.Array, values: np.ndarray, counts: np.ndarray) -> pa.Table:
        """id, embedding (a fixed-size list of the output dtype), tokens; the model in the
        schema metadata, which Parquet keeps in each file's footer."""
        flat = pa.array(np.ascontiguousarray(values).reshape(-1))
        embedding = pa.FixedSizeListArray.from_arrays(flat, values.shape[1])
        table = pa.table({self.options.id_column: ids, "embedding": embedding,
                          "tokens": pa.array(counts, pa.int32())})
        return table.replace_schema_metadata(self.metadata)


REFUSED = "_refused"  # a batch column: why the reader could not give a row a text
LINE = "_line"  # a batch column: the row's position in its file


class JsonLines:
    """JSON lines as rows. Ray Data's ``read_text`` gives one line per row (column
    ``text``), numbered in column ``_line``; out come the text column, the id column and
    ``_refused``: why a line has no text to embed, empty otherwise. Whatever a line holds,
    it is refused, never raised: not JSON (or nested too deep to parse), not an object,
    a missing, null, non-string or empty text, a text with a lone surrogate (a ``\\ud800``
    escape, which no tokenizer takes). Ids keep the first object's type (int or str); a
    line without an id gets its line position, and so does a line whose id does not fit
    that type (refused, with the reason)."""

    def __init__(self, text_column: str, id_column: str, first: dict[str, Any]):
        self.text_column, self.id_column = text_column, id_column
        first_id = first.get(id_column)
        self.id_type = None if first_id is None else (int if type(first_id) is int else str)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        texts, ids, reasons = [], [], []
        for line, position in zip(batch["text"], batch[LINE], strict=True):
            text, ident, reason = self.row(json_object(line), int(position))
            texts.append(text)
            ids.append(ident)
            reasons.append(reason or "")
        return {self.id_column: np.array(ids, dtype=object if self.id_type is str else np.int64),
                self.text_column: np.array(texts, dtype=object),
                REFUSED: np.array(reasons, dtype=object)}

    def row(self, row: dict[str, Any] | None, position: int) -> tuple[str, Any, str | None]:
        """(text, id, why the line is refused or None) for the object on one line."""
        reason: str | None = "not a JSON object"
        if row is None:
            row = {}
        else:
            text: Any = row.get(self.text_column)
            reason = refusal(text) or (None if _encodable(text) else
                                       "text is not valid Unicode (a lone surrogate)")
        ident = row.get(self.id_column)
        if self.id_type is None:
            ident = position
        elif self.id_type is int:
            if type(ident) is not int:
                ident, reason = position, reason or "id is not an integer"
            elif not INT64_MIN <= ident <= INT64_MAX:
                ident, reason = position, reason or "id is outside the 64-bit integer range"
        elif ident is None:
            ident = str(position)
        elif type(ident) not in (str, int, float, bool):
            ident, reason = str(position), reason or "id is not a string or number"
        elif not _encodable(str(ident)):
            ident, reason = str(position), reason or "id is not valid Unicode (a lone surrogate)"
        else:
            ident = str(ident)
        return (row[self.text_column] if reason is None else ""), ident, reason


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def json_object(line: str | bytes) -> dict[str, Any] | None:
    """The JSON object on ``line``; None when the line is not JSON (undecodable, invalid,
    nested deeper than the parser goes) or holds another value. A byte-order mark before
    it is skipped, as ``json.loads`` skips it in bytes."""
    if isinstance(line, str):
        line = line.removeprefix("\ufeff")
    try:
        row = json.loads(line)
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError are
        return None  # ValueErrors; json's C parser raises RecursionError at its depth limit
    return row if isinstance(row, dict) else None


def _encodable(text: str) -> bool:
    """Whether ``text`` has a UTF-8 form (JSON's ``\\ud800`` escapes give lone surrogates)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def first_json_row(fs: Any, path: str) -> dict[str, Any]:
    """The first JSON object in a JSON-lines file (its keys tell whether it has ids), or
    ``{}`` when it has none. Lines holding no object are passed over (the job refuses
    them one by one): only reading the file raises."""
    with fs.open(path, "rb", compression="infer") as f:
        for line in f:
            row = json_object(line)
            if row is not None:
                return row
    return {}


class RowNumberer:
    """Numbers rows in the order batches arrive: the id of an input without an id column
    (the job feeds it one file's batches in order)."""

    def __init__(self, column: str):
        self.column = column
        self.next = 0

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = len(next(iter(batch.values()))) if batch else 0
        batch[self.column] = np.arange(self.next, self.next + rows, dtype=np.int64)
        self.next += rows
        return batch


# --- the errors file ------------------------------------------------------------------

def error_lines(refused: list[Refused], file: str) -> bytes:
    return b"".join(json.dumps({"id": r.id, "reason": r.reason, "file": file},
                               default=str).encode() + b"\n" for r in refused)


def write_error_part(fs: Any, unit_dir: str, refused: list[Refused], file: str) -> None:
    """One batch's refused rows, under a name made from its content: a retried batch
    overwrites its own part instead of adding a second copy."""
    if not refused:
        return
    body = error_lines(refused, file)
    name = hashlib.sha256(body).hexdigest()[:24]
    fs.makedirs(f"{unit_dir}/{ERRORS_DIR}", exist_ok=True)
    with fs.open(f"{unit_dir}/{ERRORS_DIR}/{name}.jsonl", "wb") as out:
        out.write(body)


def merge_errors(fs: Any, unit_dirs: list[str], target: str) -> int:
    """Write every unit's refused rows to ``target``; returns how many there are."""
    count = 0
    parent = posixpath.dirname(target)
    if parent:
        fs.makedirs(parent, exist_ok=True)
    with fs.open(target, "wb") as out:
        for unit_dir in unit_dirs:
            for part in sorted(fs.glob(f"{unit_dir}/{ERRORS_DIR}/*.jsonl")):
                body = fs.cat_file(part)
                count += body.count(b"\n")
                out.write(body)
    return count
