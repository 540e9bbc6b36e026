"""Bulk embedding on Ray Data: the Ray glue around ``blitz.bulk.job``.

One job is one Ray Data pipeline over every input file not done yet, so the encoder
actors start and load the model once:

    from_items(pending files)                       one block per file
      -> map_batches(read_file)                     each file's rows (blitz.bulk.read),
                                                    opened on the worker from its URI
      -> repartition(batch_size rows per block)     so every actor gets work
      -> map_batches(EmbedBatches, actor pool)      one encoder per actor
      -> iter_batches on this driver, in order      each unit written (UnitWriter) and
                                                    published as soon as the stream
                                                    moves past it

With a dual-encoder model the pipeline is the same for images (``blitz.bulk.images``):
a unit is a chunk of image files or a list or table of image paths, read_file reads the
images' bytes and each actor decodes and embeds them.

Which units run, and what OUTPUT may hold, is ``blitz.bulk.units``' decision, made
before anything is read or deleted. Nothing secret is in a task: workers open storage
from the URI with their own credentials (``blitz.sources.storage.filesystem_for``); the driver
passes only where the store is (``blitz.sources.storage.location_env``).

The actor pool has one actor per GPU when the cluster has GPUs, else one per CPU
(``BulkSettings.actors`` overrides it); CPU actors leave one logical CPU to the reads
(``_actor_cpus``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, TextIO

import ray

from blitz.bulk import images as bulk_images
from blitz.bulk import units as bulk_units
from blitz.bulk import write as bulk_write
from blitz.bulk.job import (
    BatchEncoder,
    backend_label,
    build_units,
    check_options,
    list_inputs,
    output_metadata,
)
from blitz.bulk.read import columns_of, read_rows
from blitz.errors import InvalidValue
from blitz.runtime import model_threads
from blitz.settings.bulk import BulkSettings
from blitz.settings.config import BlitzSettings
from blitz.settings.images import ImageSettings
from blitz.settings.kinds import kind_of
from blitz.settings.registry import ModelSpec
from blitz.sources.storage import filesystem_for, location_env
from deployments.bulk_requirements import require_ray_data


class EmbedBatches:
    """The callable class ``map_batches`` runs on each actor: one encoder per actor."""

    def __init__(self, spec: ModelSpec, options: BulkSettings, device: str,
                 cache_dir: str | None, images: ImageSettings | None = None):
        if device == "cpu":
            model_threads.configure(options.torch_threads)
        self.encoder = BatchEncoder(spec, options, device, cache_dir, images)

    def __call__(self, rows: Any) -> Any:
        return self.encoder.encode(rows)


def read_file(files: Any, *, text_column: str, id_column: str, batch_rows: int,
              max_row_bytes: int, images: dict[str, Any] | None = None) -> Any:
    """``map_batches`` function: the rows of each file named in ``files`` (unit, url,
    kind), opened here with this worker's credentials. An image job (``images``: the
    image column and the bytes limit) reads each chunk's image files, or each list's or
    table's images (``blitz.bulk.images``)."""
    members = (files["members"].to_pylist() if "members" in files.column_names
               else [None] * files.num_rows)
    for unit, url, kind, chunk in zip(files["unit"].to_pylist(), files["url"].to_pylist(),
                                      files["kind"].to_pylist(), members, strict=True):
        if kind == "images":
            yield from bulk_images.read_image_files(
                [tuple(m) for m in chunk], unit, batch_rows=batch_rows,
                max_image_bytes=images["max_image_bytes"] if images else 0)
            continue
        fs, path = filesystem_for(url)
        with fs.open(path, "rb", compression="infer") as f:
            if images is not None:
                yield from bulk_images.read_image_table(
                    f, kind, unit, url, id_column=id_column, batch_rows=batch_rows,
                    max_row_bytes=max_row_bytes, **images)
            else:
                yield from read_rows(f, kind, unit, text_column=text_column,
                                     id_column=id_column, batch_rows=batch_rows,
                                     max_row_bytes=max_row_bytes)


@dataclass
class BulkReport:
    files: int = 0
    skipped: list[str] = field(default_factory=list)  # done by an earlier run
    rows_written: int = 0  # this run
    refused_now: int = 0  # this run
    rows_total: int = 0  # in OUTPUT for this INPUT, skipped files included
    refused: int = 0  # in the errors file, skipped files included
    errors_path: str = ""
    seconds: float = 0.0
    timeline: list[tuple[float, int]] = field(default_factory=list)  # (s, rows) per unit


def embed_dataset(input: str, output: str, *, settings: BlitzSettings | None = None,
                  options: BulkSettings | None = None, address: str | None = None,
                  log: TextIO | None = None, progress: bool | None = None) -> BulkReport:
    """Embed every row of ``input`` into ``output`` (see the module docstring).

    ``settings`` gives the registry (default: the built-in one); ``options`` the job.
    Connects to Ray at ``address`` (or starts a local instance) unless Ray is running.
    ``log`` gets a line per published unit; ``progress`` shows a progress bar (rows/s,
    ETA) on a terminal (None: when stderr is one).
    """
    require_ray_data()
    settings = settings or BlitzSettings()
    options = options or BulkSettings()
    spec = settings.registry().get(options.model or settings.default_model or "")
    check_options(spec, options)
    in_fs, in_path = filesystem_for(input)
    out_fs, out_path = filesystem_for(output)
    out_path = out_path.rstrip("/")
    dual = "embed_images" in kind_of(spec.kind).serves  # image files and lists are inputs
    base, files = list_inputs(in_fs, in_path, image_files=dual and not options.image_column,
                              lists=dual)
    images = bulk_images.image_job(spec.kind, options.image_column, options.prompt_name,
                                   files)
    root = in_path if files == [in_path] else base  # one file, or what a run may search
    bulk_units.check_no_overlap(in_fs, root, files, out_fs, out_path)
    errors_fs, errors_path = (filesystem_for(options.errors) if options.errors
                              else (out_fs, f"{out_path}/{bulk_units.ERRORS_FILE}"))
    if options.errors:
        bulk_units.check_no_overlap(in_fs, root, files, errors_fs, errors_path,
                                    what="errors file")
        bulk_units.check_errors_target(errors_fs, errors_path)
    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False)
    device = _device(options)
    job: dict[str, Any] = {
        "model": spec.id, "source": spec.source, "backend": backend_label(spec, device),
        "dtype": options.dtype, "dimensions": options.dimensions,
        "prompt_name": options.prompt_name, "normalize": options.normalize,
        "text_column": options.text_column, "id_column": options.id_column}
    if images:  # (text jobs' records stay as they were: their units stay done)
        del job["text_column"]
        job.update(images=True, image_column=options.image_column,
                   images_per_unit=options.images_per_unit)
        if options.allow_urls:  # (absent otherwise: earlier runs' units stay done)
            job["allow_urls"] = options.allow_urls
    units = build_units(in_fs, base, files, out_path, options.images_per_unit)
    report = BulkReport(files=len(files), errors_path=errors_path)
    started = time.perf_counter()
    bulk_units.claim_output(out_fs, out_path)  # refused, untouched, when it is not ours
    with bulk_units.output_lock(out_fs, out_path):
        plan = bulk_units.plan_units(out_fs, out_path, units, job, options.force)
        _check_columns(in_fs, plan.pending, options, images)
        bulk_units.remove_orphans(out_fs, plan)  # --force: chunks no image starts now
        for unit in plan.units:
            if unit.done is not None:
                report.skipped.append(unit.file)
                report.rows_total += int(unit.done.get("rows", 0))
        if plan.pending:
            attempt = bulk_units.new_attempt(out_fs, out_path)
            _embed_units(plan.pending, spec, options, device, str(settings.resolved_cache_dir()),
                 out_fs, attempt, job, report, log, progress, started, settings.images)
            bulk_units.end_attempt(out_fs, out_path)
        report.refused = bulk_write.merge_errors(errors_fs, [u.directory for u in units],
                                                 errors_path)
    report.seconds = time.perf_counter() - started
    return report


def _check_columns(in_fs: Any, pending: list[bulk_units.Unit], options: BulkSettings,
                   images: bool = False) -> None:
    """Refuse, before the job starts, a CSV or Parquet file without the text column (the
    image column in an image job)."""
    problems = []
    column, flag = ((options.image_column or "", "--image-column") if images
                    else (options.text_column, "--text-column"))
    for unit in pending:
        if unit.kind in ("json", "list", "images"):
            continue
        try:
            with in_fs.open(unit.file, "rb", compression="infer") as f:
                columns = columns_of(f, unit.kind)
        except ValueError as exc:
            problems.append(f"{unit.file} cannot be read as {unit.kind} ({exc})")
            continue
        if columns is not None and column not in columns:
            problems.append(f"{unit.file} has no column {column!r} (columns: "
                            f"{', '.join(columns)})")
    if problems:
        raise InvalidValue("; ".join(problems) + f" ({flag} names the column)",
                           param=flag[2:].replace("-", "_"))


def _embed_units(pending: list[bulk_units.Unit], spec: ModelSpec, options: BulkSettings,
                 device: str, cache_dir: str, out_fs: Any, attempt: str, job: dict[str, Any],
                 report: BulkReport, log: TextIO | None, progress: bool | None,
                 started: float, limits: ImageSettings | None = None) -> None:
    """The pipeline over ``pending``; each unit published as soon as it is complete."""
    from tqdm import tqdm

    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True  # units complete in order
    context.enable_progress_bars = False  # ours below counts rows across the whole job
    payloads = job_payloads(pending, spec, options, device, cache_dir,
                            images=bool(job.get("images")), limits=limits)
    ds: Any = ray.data.from_items(payloads["files"], override_num_blocks=len(pending))
    ds = ds.map_batches(read_file, batch_size=1, batch_format="pyarrow",
                        fn_kwargs=payloads["read_kwargs"], **payloads["read_remote_args"])
    ds = ds.repartition(target_num_rows_per_block=options.batch_size)
    actors = options.actors or _actor_count(device, options)
    per_actor = {"num_gpus": 1} if device == "cuda" else {"num_cpus": _actor_cpus(actors)}
    ds = ds.map_batches(EmbedBatches, batch_size=options.batch_size, batch_format="pyarrow",
                        fn_constructor_args=payloads["encoder_args"], concurrency=actors,
                        **per_actor)
    by_index = {u.index: u for u in pending}
    order = [u.index for u in pending]
    total = sum(int(u.fingerprint["size"]) for u in pending)
    bar = tqdm(total=total, unit="B", unit_scale=True, desc="blitz embed", disable=(
        None if progress is None else not progress), leave=False)
    writers: dict[int, bulk_write.UnitWriter] = {}
    credited: dict[int, int] = {}

    def publish(index: int) -> None:
        unit = by_index[index]
        writer = writers.pop(index, None) or _writer(out_fs, attempt, unit, options, spec,
                                                     device)
        record = writer.publish(job)
        report.rows_written += record["rows"]
        report.refused_now += record["refused"]
        report.rows_total += record["rows"]
        bar.update(int(unit.fingerprint["size"]) - credited.pop(index, 0))
        report.timeline.append((time.perf_counter() - started, report.rows_written))
        if log is not None:
            elapsed = time.perf_counter() - started
            log.write(f"{unit.file}: {record['rows']} rows, {record['refused']} refused; "
                      f"{report.rows_written} rows this run, "
                      f"{report.rows_written / max(elapsed, 1e-9):.0f} rows/s\n")

    try:
        for table in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
            for index, part in _by_unit(table):
                if index not in order:
                    raise RuntimeError(f"rows of unit {index} arrived after it was published")
                while order[0] != index:  # the stream has moved past it
                    publish(order.pop(0))
                writer = writers.get(index)
                if writer is None:
                    writer = writers[index] = _writer(out_fs, attempt, by_index[index],
                                                      options, spec, device)
                writer.add(part)
                seen = min(writer.offset, int(by_index[index].fingerprint["size"]))
                bar.update(seen - credited.get(index, 0))
                credited[index] = seen
                rows = report.rows_written + sum(w.rows for w in writers.values())
                bar.set_postfix_str(f"{rows} rows, "
                                    f"{rows / max(time.perf_counter() - started, 1e-9):.0f} "
                                    "rows/s", refresh=False)
        while order:
            publish(order.pop(0))
    finally:
        bar.close()
        for writer in writers.values():
            writer.close()


def job_payloads(pending: list[bulk_units.Unit], spec: ModelSpec, options: BulkSettings,
                 device: str, cache_dir: str, images: bool = False,
                 limits: ImageSettings | None = None) -> dict[str, Any]:
    """Everything the job hands to Ray, which pickles it into task specs and the object
    store: file URIs, options, the model's spec, where the store is; never a credential.
    An image job's files carry their chunks' image URIs and ids (``members``)."""
    limits = limits or ImageSettings()
    where = location_env()
    files = [{"unit": u.index, "url": u.url, "kind": u.kind} for u in pending]
    if images:
        for entry, unit in zip(files, pending, strict=True):
            entry["members"] = [list(m) for m in unit.members or []]
    return {
        "files": files,
        "read_kwargs": {"text_column": options.text_column, "id_column": options.id_column,
                        "batch_rows": options.batch_size,
                        "max_row_bytes": options.max_row_bytes,
                        **({"images": {"image_column": options.image_column,
                                       "max_image_bytes": limits.max_bytes,
                                       "url_limits": url_limits(limits, options)}}
                           if images else {})},
        "read_remote_args": {"runtime_env": {"env_vars": where}} if where else {},
        "encoder_args": (spec, options, device, cache_dir, limits)}


def url_limits(limits: ImageSettings, options: BulkSettings) -> ImageSettings | None:
    """The URL checks an image job's tables get: ``--allow-urls`` for the allow-list, the
    config's ``images:`` for the rest; None (no URL fetched) without ``--allow-urls``."""
    if not options.allow_urls:
        return None
    return ImageSettings.model_validate({**limits.model_dump(),
                                         "url_allow": options.allow_urls})


def _writer(out_fs: Any, attempt: str, unit: bulk_units.Unit, options: BulkSettings,
            spec: ModelSpec, device: str) -> bulk_write.UnitWriter:
    staging = f"{attempt}/{unit.directory.rsplit('/', 1)[-1]}"
    return bulk_write.UnitWriter(out_fs, staging, unit, options.id_column,
                                 output_metadata(spec, options, device))


def _by_unit(table: Any) -> list[tuple[int, Any]]:
    """``table``'s rows as (unit, rows) runs, in order."""
    import numpy as np

    units = table.column("_unit").to_numpy()
    if len(units) == 0:
        return []
    cuts = [0, *(np.flatnonzero(np.diff(units)) + 1).tolist(), len(units)]
    return [(int(units[a]), table.slice(a, b - a)) for a, b in zip(cuts, cuts[1:],
                                                                    strict=False)]


def _actor_cpus(actors: int) -> float:
    """Logical CPUs each CPU actor claims: one each, but always one CPU left over for
    Ray Data's read tasks. Actors that claimed every CPU would wait forever for the
    reads that feed them (seen on a 2-CPU machine). Each actor still runs
    ``torch_threads`` threads; the claim only schedules."""
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
