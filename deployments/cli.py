"""The installed ``blitz`` command: ``blitz.cli`` plus the subcommands that need Ray.

``blitz/`` never imports Ray, so ``embed`` (a Ray Data job, deployments/bulk.py) is added
here, where the Ray glue lives; the console script points at this module. The job is
imported only when ``embed`` runs: it needs the ``bulk`` extra (Ray Data, pandas,
pyarrow), which the serving install leaves out, and the other subcommands do not.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from blitz import cli
from blitz.settings.bulk import BulkSettings
from deployments.bulk_requirements import require_ray_data

EXIT_CODES = """exit status: 0 every row is in OUTPUT; 3 done, but some rows were refused (see
the errors file); 1 the job failed or no row could be embedded; 2 usage (bad options,
OUTPUT overlapping INPUT, a rerun that would mix outputs without --force)"""
DEFAULT_CONFIG = "serve_config.yaml"


def add_embed_command(commands: Any) -> None:
    """Add ``embed`` to the ``blitz`` command's subcommands."""
    fields = BulkSettings.model_fields
    embed = commands.add_parser(
        "embed", help="embed a corpus (Parquet, JSONL or CSV; with a dual-encoder model also "
        "images; local or s3://) into Parquet files with Ray Data", epilog=EXIT_CODES)
    embed.add_argument("input", help="a file, a directory or a glob; with a dual-encoder "
                       "model also image files (jpg, png, webp, gif, bmp), a .txt list of "
                       "image paths, or tables whose --image-column names images")
    embed.add_argument("output", help="a directory (local or s3://)")
    embed.add_argument("--model", help=fields["model"].description)
    embed.add_argument("--config", metavar="FILE", help="serve config YAML whose application "
                       "args name the models (default: ./serve_config.yaml when there is "
                       "one, as `serve run` uses it; else the built-in registry)")
    embed.add_argument("--app", metavar="NAME", help="application in --config")
    embed.add_argument("--address", help="Ray cluster address (default: start a local Ray)")
    embed.add_argument("--force", action="store_true", help=fields["force"].description)
    embed.add_argument("--no-progress", action="store_true",
                       help="no progress bar (shown on a terminal: rows/s and ETA)")
    for name in ("text_column", "image_column", "id_column", "errors", "dtype", "dimensions",
                 "prompt_name", "batch_size", "actors", "device", "torch_threads",
                 "max_row_bytes", "images_per_unit"):
        info = fields[name]
        flag = "--" + name.replace("_", "-")
        kind = {"dimensions": int, "batch_size": int, "actors": int,
                "torch_threads": int, "max_row_bytes": int,
                "images_per_unit": int}.get(name, str)
        embed.add_argument(flag, type=kind, default=info.default,
                           help=f"{info.description} (default: {info.default})")
    embed.add_argument("--allow-urls", nargs="+", metavar="PREFIX", default=[],
                       help=fields["allow_urls"].description)
    embed.set_defaults(run=run_embed)


def run_embed(args: argparse.Namespace, out: TextIO) -> int:
    from pathlib import Path

    from pydantic import ValidationError

    from blitz.cli import UsageError, load_settings
    from blitz.errors import ClientError

    try:
        require_ray_data()
    except RuntimeError as exc:
        raise UsageError(str(exc)) from exc
    config = Path(args.config) if args.config else (
        Path(DEFAULT_CONFIG) if Path(DEFAULT_CONFIG).is_file() else None)
    settings = load_settings(config, args.app)
    out.write(f"models from {config} (application {args.app or 'the first'})\n" if config
              else "models from the built-in registry (no ./serve_config.yaml, no --config)\n")
    try:
        options = BulkSettings.model_validate({
            "model": args.model, "text_column": args.text_column,
            "image_column": args.image_column, "images_per_unit": args.images_per_unit,
            "allow_urls": args.allow_urls,
            "id_column": args.id_column, "errors": args.errors, "dtype": args.dtype,
            "dimensions": args.dimensions, "prompt_name": args.prompt_name,
            "batch_size": args.batch_size, "actors": args.actors, "device": args.device,
            "torch_threads": args.torch_threads, "max_row_bytes": args.max_row_bytes,
            "force": args.force})
    except ValidationError as exc:
        raise UsageError(f"invalid embed options:\n{exc}") from exc
    from deployments.bulk import embed_dataset  # Ray Data and pyarrow: only when run

    try:
        report = embed_dataset(args.input, args.output, settings=settings, options=options,
                               address=args.address, log=out,
                               progress=False if args.no_progress else None)
    except ClientError as exc:  # refused before anything was read or written
        raise UsageError(exc.message) from exc
    rate = report.rows_written / report.seconds if report.seconds else 0.0
    out.write(f"wrote {report.rows_written} rows, refused {report.refused_now} rows, skipped "
              f"{len(report.skipped)} files already done, in {report.seconds:.1f} s "
              f"({rate:.0f} rows/s); {report.rows_total} rows in {args.output}, "
              f"{report.refused} refused in all (see {report.errors_path})\n")
    if not report.rows_total:
        return 1
    return 3 if report.refused else 0


def main(argv: list[str] | None = None) -> int:
    return cli.main(argv, extend=add_embed_command)


if __name__ == "__main__":
    sys.exit(main())
