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
from blitz.config import BulkSettings

BULK_EXTRA_MISSING = (
    "blitz embed needs Ray Data, which the serving install leaves out (it brings pandas, "
    "which every Serve process would then import): install the bulk extra with "
    "`bash scripts/install.sh bulk` or `pip install -e '.[bulk]'`")


def require_ray_data() -> None:
    """Raise ``RuntimeError`` saying which extra to install when Ray Data cannot import."""
    try:
        import ray.data  # noqa: F401
    except ImportError as exc:  # pandas or pyarrow missing: the bulk extra is not installed
        raise RuntimeError(f"{BULK_EXTRA_MISSING} ({exc})") from exc


def add_embed_command(commands: Any) -> None:
    """Add ``embed`` to the ``blitz`` command's subcommands."""
    fields = BulkSettings.model_fields
    embed = commands.add_parser(
        "embed", help="embed a corpus (Parquet, JSONL or CSV; local or s3://) into Parquet "
        "files with Ray Data")
    embed.add_argument("input", help="a file, a directory or a glob")
    embed.add_argument("output", help="a directory (local or s3://)")
    embed.add_argument("--model", help=fields["model"].description)
    embed.add_argument("--config", metavar="FILE", help="serve config YAML whose application "
                       "args name the models (default: the built-in registry)")
    embed.add_argument("--app", metavar="NAME", help="application in --config")
    embed.add_argument("--address", help="Ray cluster address (default: start a local Ray)")
    for name in ("text_column", "id_column", "errors", "dtype", "dimensions", "prompt_name",
                 "batch_size", "actors", "device", "torch_threads"):
        info = fields[name]
        flag = "--" + name.replace("_", "-")
        kind = {"dimensions": int, "batch_size": int, "actors": int,
                "torch_threads": int}.get(name, str)
        embed.add_argument(flag, type=kind, default=info.default,
                           help=f"{info.description} (default: {info.default})")
    embed.set_defaults(run=run_embed)


def run_embed(args: argparse.Namespace, out: TextIO) -> int:
    from pathlib import Path

    from pydantic import ValidationError

    from blitz.cli import UsageError, load_settings

    try:
        require_ray_data()
    except RuntimeError as exc:
        raise UsageError(str(exc)) from exc
    settings = load_settings(Path(args.config) if args.config else None, args.app)
    try:
        options = BulkSettings.model_validate({
            "model": args.model, "text_column": args.text_column,
            "id_column": args.id_column, "errors": args.errors, "dtype": args.dtype,
            "dimensions": args.dimensions, "prompt_name": args.prompt_name,
            "batch_size": args.batch_size,
            "actors": args.actors, "device": args.device,
            "torch_threads": args.torch_threads})
    except ValidationError as exc:
        raise UsageError(f"invalid embed options:\n{exc}") from exc
    from deployments.bulk import embed_dataset  # Ray Data and pyarrow: only when run

    report = embed_dataset(args.input, args.output, settings=settings, options=options,
                           address=args.address, log=out)
    rate = report.rows_written / report.seconds if report.seconds else 0.0
    out.write(f"wrote {report.rows_written} rows ({rate:.0f} rows/s) from "
              f"{report.files - len(report.skipped)} files; skipped {len(report.skipped)} "
              f"files already done; {report.rows_total} rows in {args.output}; "
              f"refused {report.refused} rows (see {report.errors_path})\n")
    return 0 if report.rows_total else 1


def main(argv: list[str] | None = None) -> int:
    return cli.main(argv, extend=add_embed_command)


if __name__ == "__main__":
    sys.exit(main())
