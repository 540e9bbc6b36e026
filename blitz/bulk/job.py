"""Bulk embedding, the Ray-free half: what ``deployments/bulk.py`` runs on Ray Data.

A job embeds every row of INPUT (Parquet, JSONL or CSV files: one file, a directory or
a glob, local or object storage) into OUTPUT, one *unit* per input file. The pieces:

- ``list_inputs``: the input files (``blitz.bulk.units`` names their units and decides,
  from each unit's record, what a rerun skips, redoes or must refuse);
- ``blitz.bulk.read``: each file read into rows, every bad line or row refused with a
  reason (only I/O fails a job);
- ``BatchEncoder``: one loaded model and the job's options, rows in, embeddings out:
  the prompt, the same ``load_encoder`` as the pools (token-budget micro-batches, same
  backends and accuracy guard), then ``dimensions`` and ``dtype`` exactly as the native
  API applies them;
- ``blitz.bulk.write.UnitWriter``: each unit's rows into Parquet and its refusals into
  ``_errors.jsonl``, published whole with its record.

With a dual-encoder model a job may embed images instead (``blitz.bulk.images``): image
files in chunks (``build_units``), or the images a list or a table names.

The job that runs them is ``deployments.bulk.embed_dataset`` (Ray Data): ``blitz/`` never
imports the Ray glue.
"""

from __future__ import annotations

import os
import posixpath
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from blitz.bulk.images import (
    chunk_fingerprint,
    chunk_images,
    chunk_name,
    embed_image_rows,
    is_image,
    is_list,
    relative,
)
from blitz.bulk.units import Unit, input_fingerprint, is_local, unit_name
from blitz.encoders.postprocess import quantize, truncate_dimensions
from blitz.errors import InvalidValue
from blitz.loading.facts import read_dimension
from blitz.loading.load import backend_for, load_encoder
from blitz.settings.bulk import BulkSettings
from blitz.settings.images import ImageSettings
from blitz.settings.kinds import kind_of, serving
from blitz.settings.registry import ModelSpec, apply_prompt

FORMATS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv"}
GLOB_CHARS = "*?["
PASSED = ("_unit", "_row", "_line", "_id_int", "_id_str", "_id_kind", "_refused", "_offset")


# --- inputs -----------------------------------------------------------------

def format_of(path: str) -> str | None:
    """``parquet``, ``json`` (JSON lines) or ``csv`` from the file name; None otherwise."""
    name = path.lower()
    for compression in (".gz", ".zst", ".bz2"):
        name = name.removesuffix(compression)
    return FORMATS.get(posixpath.splitext(name)[1])


def list_inputs(fs: Any, path: str, *, image_files: bool = False,
                lists: bool = False) -> tuple[str, list[str]]:
    """(base, input files) for a file, a directory or a glob on the fsspec ``fs``.

    A directory is searched recursively, through links to folders too; files of unknown
    formats and names starting with ``_`` or ``.`` are left out. ``image_files`` adds
    image files, ``lists`` lists of image paths (``.txt``: named as the file or by the
    glob, never found by a folder search; see ``blitz.bulk.images``). ``base`` is what unit
    names are relative to.
    """
    path = path.rstrip("/")
    searched = False
    if any(c in path for c in GLOB_CHARS):
        base = path[: min(path.find(c) for c in GLOB_CHARS if c in path)].rpartition("/")[0]
        found = fs.glob(path)
    elif fs.isdir(path):
        base, found = path, (local_tree(path) if is_local(fs) else fs.find(path))
        searched = True
    elif fs.exists(path):
        base, found = posixpath.dirname(path), [path]
    else:
        raise InvalidValue(f"input {path} does not exist", param="input")

    def wanted(file: str) -> bool:
        return bool(format_of(file) or image_files and is_image(file)
                    or lists and not searched and is_list(file))

    files = sorted(f for f in found if wanted(f) and not _hidden(f, base))
    if not files:
        kinds = "Parquet, JSONL or CSV files" + (
            ", image files" if image_files else "") + (" or image lists" if lists else "")
        hint = "" if image_files or not any(map(is_image, found)) else (
            " (it holds image files: they need a dual-encoder model)")
        raise InvalidValue(f"no {kinds} under {path}{hint}", param="input")
    return base, files


def build_units(fs: Any, base: str, files: list[str], out_path: str, images_per_unit: int,
                ) -> list[Unit]:
    """One unit per table or list; image files in chunks (``blitz.bulk.images``)."""
    protocol = fs.protocol[0] if isinstance(fs.protocol, tuple) else fs.protocol

    def url(file: str) -> str:
        return file if protocol in ("file", "local") else f"{protocol}://{file}"

    units: list[Unit] = []
    for file in files:
        if not is_image(file):
            units.append(Unit(index=len(units), file=file, url=url(file),
                              kind=format_of(file) or "list",
                              directory=f"{out_path}/{unit_name(base, file)}",
                              fingerprint=input_fingerprint(fs, file)))
    for start, members in chunk_images(base, [f for f in files if is_image(f)],
                                       images_per_unit):
        found = [(relative(base, f), input_fingerprint(fs, f)) for f in members]
        described = f"{members[0]}" + (f" .. {members[-1]} ({len(members)} images)"
                                       if len(members) > 1 else "")
        units.append(Unit(index=len(units), file=described, url=described, kind="images",
                          directory=f"{out_path}/{chunk_name(start)}",
                          fingerprint=chunk_fingerprint(found),
                          members=[(url(f), path) for f, (path, _) in zip(
                              members, found, strict=True)]))
    return units


def local_tree(root: str) -> list[str]:
    """Every file under the local folder ``root``, links to folders followed (their files
    named by the link's path); a link to a folder above it is refused (it would loop)."""
    found: list[str] = []
    above = {root: {os.path.realpath(root)}}  # each folder: the real folders it lies in
    for directory, subdirs, names in os.walk(root, followlinks=True):
        chain = above.pop(directory)
        subdirs[:] = [d for d in subdirs if not d.startswith(("_", "."))]
        for name in subdirs:
            path = os.path.join(directory, name)
            real = os.path.realpath(path)
            if real in chain:
                raise InvalidValue(
                    f"{path} links to {real}, a folder that holds it: reading INPUT would "
                    "never end; remove the link, or name a folder without it as INPUT",
                    param="input")
            above[path] = chain | {real}
        found.extend(os.path.join(directory, name) for name in names)
    return found


def _hidden(file: str, base: str) -> bool:
    relative = file[len(base):].lstrip("/") if base and file.startswith(base) else file
    return any(part.startswith(("_", ".")) for part in relative.split("/"))


# --- the per-batch function -----------------------------------------------------------

def check_options(spec: ModelSpec, options: BulkSettings) -> None:
    """Refuse a job whose options the model cannot honour, before any data is read."""
    serves = kind_of(spec.kind).serves
    if "bulk" not in serves:
        raise InvalidValue(f"model {spec.id!r} is a {spec.kind}; only "
                           f"{' and '.join(serving('bulk'))} models can embed a corpus",
                           param="model")
    if options.image_column and "embed_images" not in serves:
        raise InvalidValue(f"--image-column needs a dual-encoder model (CLIP, SigLIP); "
                           f"{spec.id!r} is a {spec.kind}", param="image_column")
    apply_prompt(spec, [], options.prompt_name)  # raises for an unknown prompt name
    known = read_dimension(spec)
    if options.dimensions is not None and known is not None and options.dimensions > known:
        raise InvalidValue(f"dimensions={options.dimensions} is larger than model "
                           f"{spec.id!r}'s dimension {known}", param="dimensions")


def output_metadata(spec: ModelSpec, options: BulkSettings, device: str) -> dict[bytes, bytes]:
    """What each output Parquet file's schema metadata says produced it."""
    normalize = spec.normalize if options.normalize is None else options.normalize
    return {b"blitz.model": spec.id.encode(),
            b"blitz.backend": backend_label(spec, device).encode(),
            b"blitz.dtype": options.dtype.encode(),
            b"blitz.normalize": str(normalize).lower().encode()}


def backend_label(spec: ModelSpec, device: str) -> str:
    backend = backend_for(spec, device)
    return f"torch-{spec.gpu_dtype}" if device != "cpu" and backend == "torch" else backend


class BatchEncoder:
    """One loaded model and a job's options: tables of ``blitz.bulk.read.ROWS`` in, the same
    rows out with ``embedding`` (a fixed-size list of the output dtype; zeros for a
    refused row) and ``tokens`` in place of the text."""

    def __init__(self, spec: ModelSpec, options: BulkSettings, device: str = "cpu",
                 cache_dir: str | Path | None = None, images: ImageSettings | None = None):
        check_options(spec, options)
        self.spec = spec
        self.options = options
        self.normalize = spec.normalize if options.normalize is None else options.normalize
        self.encoder = load_encoder(spec, device, cache_dir)
        if images is not None and hasattr(self.encoder, "limits"):  # the config's images.*
            self.encoder.limits = images
        self.metadata = output_metadata(spec, options, self.encoder.device)
        dimension = self.encoder.dimension or self.encoder.embed(
            ["dimension"], normalize=False).values.shape[1]
        self.empty = self._finish(np.zeros((0, dimension), np.float32))

    def _finish(self, values: np.ndarray) -> np.ndarray:
        return quantize(truncate_dimensions(values, self.options.dimensions, self.normalize),
                        self.options.dtype)

    def encode(self, rows: pa.Table) -> pa.Table:
        if "_image" in rows.column_names:
            return self.encode_images(rows)
        good = np.flatnonzero(np.asarray(pc.equal(rows.column("_refused"), "")))
        texts = rows.column("_text").take(pa.array(good, pa.int64())).to_pylist()
        values = np.zeros((rows.num_rows, self.empty.shape[1]), self.empty.dtype)
        counts = np.zeros(rows.num_rows, np.int32)
        prompted = apply_prompt(self.spec, texts, self.options.prompt_name)
        if prompted:
            encoded = self.encoder.embed(prompted, normalize=self.normalize, truncate=True)
            values[good] = self._finish(encoded.values)
            counts[good] = encoded.token_counts
        flat = pa.array(np.ascontiguousarray(values).reshape(-1))
        embedding = pa.FixedSizeListArray.from_arrays(flat, values.shape[1])
        return rows.select(list(PASSED)).append_column("embedding", embedding).append_column(
            "tokens", pa.array(counts, pa.int32()))

    def encode_images(self, rows: pa.Table) -> pa.Table:
        """Rows of ``blitz.bulk.images.IMAGE_ROWS`` in: each image's vector, or its row
        refused with the reason its decoding gave; ``tokens`` are 0."""
        good, embedded, refused = embed_image_rows(self.encoder, rows, self.normalize,
                                                   self._finish)
        values = np.zeros((rows.num_rows, self.empty.shape[1]), self.empty.dtype)
        if good:
            values[good] = embedded
        flat = pa.array(np.ascontiguousarray(values).reshape(-1))
        embedding = pa.FixedSizeListArray.from_arrays(flat, values.shape[1])
        out = rows.select([*PASSED, "_source"])
        out = out.set_column(out.schema.get_field_index("_refused"), "_refused",
                             pa.array(refused, pa.string()))
        return out.append_column("embedding", embedding).append_column(
            "tokens", pa.array(np.zeros(rows.num_rows, np.int32), pa.int32()))

    def close(self) -> None:
        self.encoder.close()
