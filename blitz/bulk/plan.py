"""A bulk job planned before and around its pipeline: its checks, its units, its report.

``BulkPlan.prepare`` refuses what cannot be done before anything starts (the options,
the inputs, an output that overlaps them); ``BulkPlan.run`` claims and locks OUTPUT, decides
which units run (``blitz.bulk.units.plan_units``), checks their columns, hands the pending
ones to the pipeline (``EmbedUnits``: ``deployments/bulk.py`` runs Ray Data) and merges
the errors. ``job_payloads`` is everything the pipeline hands to Ray, never a credential.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from blitz.bulk import images as bulk_images
from blitz.bulk import units as bulk_units
from blitz.bulk import write as bulk_write
from blitz.bulk.job import backend_label, build_units, check_options, list_inputs
from blitz.bulk.read import columns_of
from blitz.errors import InvalidValue
from blitz.settings.bulk import BulkSettings
from blitz.settings.config import BlitzSettings
from blitz.settings.images import ImageSettings
from blitz.settings.kinds import kind_of
from blitz.settings.registry import ModelSpec
from blitz.sources.storage import filesystem_for, location_env


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


EmbedUnits = Callable[[list[bulk_units.Unit], str, dict[str, Any], BulkReport, float], None]
"""The pipeline: (the pending units, the attempt's directory, the job's record, the report,
when the job started) -> each unit written and published (``blitz.bulk.publish``)."""


@dataclass
class BulkPlan:
    settings: BlitzSettings
    options: BulkSettings
    spec: ModelSpec
    in_fs: Any
    out_fs: Any
    out_path: str
    base: str  # what the inputs' unit names are relative to
    files: list[str]
    images: bool  # an image job (a dual encoder's), else a text job
    errors_fs: Any
    errors_path: str

    @classmethod
    def prepare(cls, input: str, output: str, settings: BlitzSettings,
                options: BulkSettings) -> BulkPlan:
        """The job's model, inputs and targets, everything checked that can be before a
        worker starts."""
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
        return cls(settings, options, spec, in_fs, out_fs, out_path, base, files, images,
                   errors_fs, errors_path)

    def job_record(self, device: str) -> dict[str, Any]:
        """What a unit's record holds of the job: a rerun redoes a unit whose job differs."""
        options, spec = self.options, self.spec
        job: dict[str, Any] = {
            "model": spec.id, "source": spec.source, "backend": backend_label(spec, device),
            "dtype": options.dtype, "dimensions": options.dimensions,
            "prompt_name": options.prompt_name, "normalize": options.normalize,
            "text_column": options.text_column, "id_column": options.id_column}
        if self.images:  # (text jobs' records stay as they were: their units stay done)
            del job["text_column"]
            job.update(images=True, image_column=options.image_column,
                       images_per_unit=options.images_per_unit)
            if options.allow_urls:  # (absent otherwise: earlier runs' units stay done)
                job["allow_urls"] = options.allow_urls
        return job

    def run(self, device: str, embed: EmbedUnits) -> BulkReport:
        """The job on ``device``: OUTPUT claimed and locked, the units a rerun skips
        counted, the others embedded by ``embed`` in one attempt, the errors merged."""
        out_fs, out_path = self.out_fs, self.out_path
        job = self.job_record(device)
        units = build_units(self.in_fs, self.base, self.files, out_path,
                            self.options.images_per_unit)
        report = BulkReport(files=len(self.files), errors_path=self.errors_path)
        started = time.perf_counter()
        bulk_units.claim_output(out_fs, out_path)  # refused, untouched, when it is not ours
        with bulk_units.output_lock(out_fs, out_path):
            plan = bulk_units.plan_units(out_fs, out_path, units, job, self.options.force)
            check_columns(self.in_fs, plan.pending, self.options, self.images)
            bulk_units.remove_orphans(out_fs, plan)  # --force: chunks no image starts now
            for unit in plan.units:
                if unit.done is not None:
                    report.skipped.append(unit.file)
                    report.rows_total += int(unit.done.get("rows", 0))
            if plan.pending:
                attempt = bulk_units.new_attempt(out_fs, out_path)
                embed(plan.pending, attempt, job, report, started)
                bulk_units.end_attempt(out_fs, out_path)
            report.refused = bulk_write.merge_errors(
                self.errors_fs, [u.directory for u in units], self.errors_path)
        report.seconds = time.perf_counter() - started
        return report


def check_columns(in_fs: Any, pending: list[bulk_units.Unit], options: BulkSettings,
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
