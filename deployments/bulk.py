"""Bulk embedding on Ray Data: the Ray glue around ``blitz.bulk``.

For each input file not done yet (see ``blitz.bulk`` for the output layout and how a
rerun resumes), one Ray Data pipeline:

    read_parquet | read_json(lines) | read_csv      the file, on the cluster
      -> map_batches(RowNumberer, 1 actor)         only when it has no id column
      -> repartition(batch_size rows per block)     so every actor gets work
      -> map_batches(EmbedBatches, actor pool)      one encoder per actor
      -> write_parquet(OUTPUT/<unit>)               fixed-size-list embeddings
    then OUTPUT/<unit>/_SUCCESS.

The actor pool has one actor per GPU when the cluster has GPUs, else one per CPU
(``BulkSettings.actors`` overrides it); CPU actors leave one logical CPU to the reads
and writes (``_actor_cpus``). Ray Data's progress bars show rows/s; the job
prints one line per file with the rows so far and an ETA in files.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, TextIO

import ray

from blitz.bulk import (
    ERRORS_FILE,
    LINE,
    BatchEncoder,
    JsonLines,
    RowNumberer,
    check_options,
    finish_unit,
    first_json_row,
    format_of,
    list_inputs,
    merge_errors,
    reset_unit,
    unit_done,
    unit_name,
    unit_rows,
    write_error_part,
)
from blitz.config import BlitzSettings, BulkSettings
from blitz.errors import InvalidValue
from blitz.registry import ModelSpec
from blitz.storage import filesystem_for


class EmbedBatches:
    """The callable class ``map_batches`` runs on each actor: one encoder per actor."""

    def __init__(self, spec: ModelSpec, options: BulkSettings, device: str,
                 cache_dir: str | None, out_fs: Any, unit_dir: str, file: str):
        import torch

        if device == "cpu":
            torch.set_num_threads(options.torch_threads)
        self.encoder = BatchEncoder(spec, options, device, cache_dir)
        self.out_fs, self.unit_dir, self.file = out_fs, unit_dir, file

    def __call__(self, batch: dict) -> Any:
        table, refused = self.encoder.encode(batch)
        write_error_part(self.out_fs, self.unit_dir, refused, self.file)
        return table


@dataclass
class BulkReport:
    files: int = 0
    skipped: list[str] = field(default_factory=list)
    rows_written: int = 0  # this run
    rows_total: int = 0  # in OUTPUT, skipped files included
    refused: int = 0  # in the errors file, skipped files included
    errors_path: str = ""
    seconds: float = 0.0


def embed_dataset(input: str, output: str, *, settings: BlitzSettings | None = None,
                  options: BulkSettings | None = None, address: str | None = None,
                  log: TextIO | None = None) -> BulkReport:
    """Embed every row of ``input`` into ``output`` (see the module docstring).

    ``settings`` gives the registry (default: the built-in one); ``options`` the job.
    Connects to Ray at ``address`` (or starts a local instance) unless Ray is running.
    """
    from deployments.cli import require_ray_data

    require_ray_data()
    settings = settings or BlitzSettings()
    options = options or BulkSettings()
    spec = settings.registry().get(options.model or settings.default_model or "")
    check_options(spec, options)
    in_fs, in_path = filesystem_for(input)
    out_fs, out_path = filesystem_for(output)
    base, files = list_inputs(in_fs, in_path)
    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False)
    device = _device(options)
    actors = options.actors or _actor_count(device, options)
    cache_dir = str(settings.resolved_cache_dir())
    report = BulkReport(files=len(files))
    started = time.perf_counter()
    units = []
    for n, file in enumerate(files, 1):
        unit_dir = f"{out_path.rstrip('/')}/{unit_name(base, file)}"
        units.append(unit_dir)
        if unit_done(out_fs, unit_dir):
            report.skipped.append(file)
            report.rows_total += unit_rows(out_fs, unit_dir)
            continue
        reset_unit(out_fs, unit_dir)
        _embed_file(file, in_fs, unit_dir, out_fs, spec, options, device, actors, cache_dir)
        finish_unit(out_fs, unit_dir)
        rows = unit_rows(out_fs, unit_dir)
        report.rows_written += rows
        report.rows_total += rows
        elapsed = time.perf_counter() - started
        done = n - len(report.skipped)
        left = (len(files) - n) * elapsed / max(done, 1)
        if log is not None:
            log.write(f"[{n}/{len(files)}] {file}: {rows} rows; {report.rows_written} rows "
                      f"this run, {report.rows_written / elapsed:.0f} rows/s, "
                      f"ETA {left:.0f} s\n")
    report.errors_path = options.errors or f"{out_path.rstrip('/')}/{ERRORS_FILE}"
    errors_fs, errors_path = (filesystem_for(options.errors) if options.errors
                              else (out_fs, report.errors_path))
    report.refused = merge_errors(errors_fs, units, errors_path)
    report.seconds = time.perf_counter() - started
    return report


def _embed_file(file: str, in_fs: Any, unit_dir: str, out_fs: Any, spec: ModelSpec,
                options: BulkSettings, device: str, actors: int, cache_dir: str) -> None:
    from pyarrow.fs import FSSpecHandler, PyFileSystem

    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True  # row positions, and output in order
    source, sink = PyFileSystem(FSSpecHandler(in_fs)), PyFileSystem(FSSpecHandler(out_fs))
    kind = format_of(file)
    if kind == "json":  # read as lines and parsed here: pyarrow's reader fails a whole
        # file on one value of another type, Ray's lines=True reader takes no filesystem
        ds = _numbered(ray.data.read_text(file, filesystem=source, file_extensions=None),
                       LINE)
        ds = ds.map_batches(JsonLines(options.text_column, options.id_column,
                                      first_json_row(in_fs, file)), batch_format="numpy")
    else:
        if kind == "parquet":
            ds = ray.data.read_parquet(file, filesystem=source)
        else:
            ds = ray.data.read_csv(file, filesystem=source, file_extensions=None)
        columns = ds.columns()
        if options.text_column not in columns:
            raise InvalidValue(f"{file} has no column {options.text_column!r} (columns: "
                               f"{', '.join(columns)})", param="text_column")
        if options.id_column in columns:
            ds = ds.select_columns([options.id_column, options.text_column])
        else:
            ds = _numbered(ds.select_columns([options.text_column]), options.id_column)
    ds = ds.repartition(target_num_rows_per_block=options.batch_size)
    per_actor = {"num_gpus": 1} if device == "cuda" else {"num_cpus": _actor_cpus(actors)}
    ds = ds.map_batches(
        EmbedBatches, batch_size=options.batch_size, batch_format="numpy",
        fn_constructor_args=(spec, options, device, cache_dir, out_fs, unit_dir, file),
        concurrency=actors, **per_actor)
    ds.write_parquet(unit_dir, filesystem=sink)


def _numbered(ds: Any, column: str) -> Any:
    """``ds`` with ``column`` set to each row's position (one actor, rows in order)."""
    return ds.map_batches(RowNumberer, fn_constructor_args=(column,),
                          batch_format="numpy", batch_size=None, concurrency=1, num_cpus=0)


def _actor_cpus(actors: int) -> float:
    """Logical CPUs each CPU actor claims: one each, but always one CPU left over for
    Ray Data's list, read and write tasks. Actors that claimed every CPU would wait
    forever for the reads that feed them (seen on a 2-CPU machine). Each actor still
    runs ``torch_threads`` threads; the claim only schedules."""
    spare = ray.cluster_resources().get("CPU", 1) - 1
    return max(0.0, min(1.0, spare / actors))


def _device(options: BulkSettings) -> str:
    if options.device != "auto":
        return options.device
    return "cuda" if ray.cluster_resources().get("GPU", 0) >= 1 else "cpu"


def _actor_count(device: str, options: BulkSettings) -> int:
    resources = ray.cluster_resources()
    have = resources.get("GPU" if device == "cuda" else "CPU", 1)
    return max(1, min(int(have), options.max_actors))

