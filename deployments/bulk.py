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
before anything is read or deleted (``blitz.bulk.plan.BulkPlan``); ``blitz.bulk.publish``
writes and publishes the stream's units in order. Nothing secret is in a task: workers open storage
from the URI with their own credentials (``blitz.sources.storage.filesystem_for``); the driver
passes only where the store is (``blitz.sources.storage.location_env``).

The actor pool has one actor per GPU when the cluster has GPUs, else one per CPU
(``BulkSettings.actors`` overrides it); CPU actors leave one logical CPU to the reads
(``_actor_cpus``).
"""

from __future__ import annotations

from typing import Any, TextIO

import ray

from blitz.bulk import images as bulk_images
from blitz.bulk.job import BatchEncoder, output_metadata
from blitz.bulk.plan import BulkPlan, BulkReport, job_payloads
from blitz.bulk.publish import UnitPublisher
from blitz.bulk.read import read_rows
from blitz.bulk.units import Unit
from blitz.bulk.write import UnitWriter
from blitz.runtime import model_threads
from blitz.settings.bulk import BulkSettings
from blitz.settings.config import BlitzSettings
from blitz.settings.images import ImageSettings
from blitz.settings.registry import ModelSpec
from blitz.sources.storage import filesystem_for
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
    plan = BulkPlan.prepare(input, output, settings, options or BulkSettings())
    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False)
    device = _device(plan.options)

    def embed(pending: list[Unit], attempt: str, job: dict[str, Any], report: BulkReport,
              started: float) -> None:
        _embed_units(plan, pending, device, attempt, job, report, log, progress, started)

    return plan.run(device, embed)


def _embed_units(plan: BulkPlan, pending: list[Unit], device: str, attempt: str,
                 job: dict[str, Any], report: BulkReport, log: TextIO | None,
                 progress: bool | None, started: float) -> None:
    """The pipeline over ``pending``; each unit published as soon as it is complete."""
    from tqdm import tqdm

    options, spec = plan.options, plan.spec
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True  # units complete in order
    context.enable_progress_bars = False  # ours below counts rows across the whole job
    payloads = job_payloads(pending, spec, options, device,
                            str(plan.settings.resolved_cache_dir()), images=plan.images,
                            limits=plan.settings.images)
    ds: Any = ray.data.from_items(payloads["files"], override_num_blocks=len(pending))
    ds = ds.map_batches(read_file, batch_size=1, batch_format="pyarrow",
                        fn_kwargs=payloads["read_kwargs"], **payloads["read_remote_args"])
    ds = ds.repartition(target_num_rows_per_block=options.batch_size)
    actors = options.actors or _actor_count(device, options)
    per_actor = {"num_gpus": 1} if device == "cuda" else {"num_cpus": _actor_cpus(actors)}
    ds = ds.map_batches(EmbedBatches, batch_size=options.batch_size, batch_format="pyarrow",
                        fn_constructor_args=payloads["encoder_args"], concurrency=actors,
                        **per_actor)
    bar = tqdm(total=sum(int(u.fingerprint["size"]) for u in pending), unit="B",
               unit_scale=True, desc="blitz embed", disable=(
                   None if progress is None else not progress), leave=False)
    metadata = output_metadata(spec, options, device)

    def writer(unit: Unit) -> UnitWriter:
        staging = f"{attempt}/{unit.directory.rsplit('/', 1)[-1]}"
        return UnitWriter(plan.out_fs, staging, unit, options.id_column, metadata)

    publisher = UnitPublisher(pending, writer, job, report, started, bar, log)
    try:
        for table in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
            publisher.add(table)
        publisher.finish()
    finally:
        bar.close()
        publisher.close()


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
