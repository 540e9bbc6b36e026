"""The settings reference's tables (docs/configuration.md, "Settings"), generated from the
settings models so they cannot drift.

``python -m blitz.settings.doc`` rewrites the text between the markers in
docs/configuration.md; ``--check`` exits 1 when it differs
(``tests/unit/test_settings_doc.py`` does the same).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from blitz.settings.bulk import BulkSettings
from blitz.settings.config import BlitzSettings
from blitz.settings.deployment_options import DEPLOYMENT_NOTES
from blitz.settings.registry import ModelSpec

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
START = "<!-- settings-table:start (python -m blitz.settings.doc) -->"
END = "<!-- settings-table:end -->"
COMMAND = "python -m blitz.settings.doc"
_UNSET = object()
_HEAD = "| setting | default | meaning |\n|---|---|---|"


def _value(value: Any) -> str:
    if value is _UNSET:
        return "-"
    if isinstance(value, BaseModel) or isinstance(value, dict) and "ray_actor_options" in value:
        return ""
    if isinstance(value, list) and value and isinstance(value[0], BaseModel):
        return f"{len(value)} model(s)"
    return "`" + json.dumps(value, separators=(", ", ": ")) + "`"


def _cell(text: str | None) -> str:
    return (text or "").replace("|", "\\|").replace("\n", " ")


def _flatten(options: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in options.items():
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _table(model: BaseModel, skip: tuple[str, ...] = ()) -> list[str]:
    rows = [_HEAD]
    for name, field in type(model).model_fields.items():
        if name not in skip:
            default = "required" if field.is_required() else _value(getattr(model, name))
            rows.append(f"| `{name}` | {default} | "
                        f"{_cell(field.description)} |")
    return rows


def _pool_tables(settings: BlitzSettings) -> list[str]:
    cpu, gpu = settings.cpu_pool, settings.gpu_pool
    rows = ["| setting | `cpu_pool` | `gpu_pool` | meaning |", "|---|---|---|---|"]
    for name, field in type(cpu).model_fields.items():
        if name != "deployment":
            rows.append(f"| `{name}` | {_value(getattr(cpu, name))} | "
                        f"{_value(getattr(gpu, name))} | {_cell(field.description)} |")
    description = type(cpu).model_fields["deployment"].description
    rows.append(f"| `deployment` | | | {_cell(description)} |")
    on_cpu, on_gpu = _flatten(cpu.deployment), _flatten(gpu.deployment)
    for key in [*on_cpu, *(k for k in on_gpu if k not in on_cpu)]:
        rows.append(f"| `deployment.{key}` | {_value(on_cpu.get(key, _UNSET))} | "
                    f"{_value(on_gpu.get(key, _UNSET))} | {_cell(DEPLOYMENT_NOTES.get(key))} |")
    return rows


def _deployment_rows(options: dict[str, Any]) -> list[str]:
    return [f"| `deployment.{key}` | {_value(value)} | {_cell(DEPLOYMENT_NOTES.get(key))} |"
            for key, value in _flatten(options).items()]


def render() -> str:
    """The generated Markdown between the markers."""
    settings = BlitzSettings.model_validate({}, context={"size": False})  # `auto` as written
    section = type(settings).model_fields
    parts = [f"<!-- generated from blitz/settings/config.py; edit the fields' descriptions, "
             f"then run `{COMMAND}` -->", "",
             "Top level of `args`:", "", *_table(settings, ("routing", "cpu_pool", "gpu_pool",
                                                       "ingress", "limits", "auth",
                                                       "tracing", "batches")),
             "", "Each entry of `models`:", "", *_table(ModelSpec(id="m", source="fake:8")),
             "", "`cpu_pool` and `gpu_pool` (a partial `gpu_pool` keeps the GPU defaults it "
             "leaves out):", "", *_pool_tables(settings)]
    for name in ("ingress", "routing", "limits", "auth", "tracing", "batches"):
        parts += ["", f"`{name}` ({section[name].description}):", "",
                  *_table(getattr(settings, name))]
        if name in ("ingress", "batches"):
            parts[-1:] = [parts[-1], *_deployment_rows(getattr(settings, name).deployment)]
    parts += ["", "A bulk job (`BulkSettings`: `blitz embed`, "
              "`deployments.bulk.embed_dataset`):", "",
              *_table(BulkSettings())]
    return "\n".join(parts)


def updated(reference: str) -> str:
    head, start, rest = reference.partition(START)
    _, end, tail = rest.partition(END)
    if not start or not end:
        raise ValueError(f"{REFERENCE.name} lacks the markers {START!r} ... {END!r}")
    return f"{head}{START}\n{render()}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if docs/configuration.md differs")
    args = parser.parse_args(argv)
    text = REFERENCE.read_text(encoding="utf-8")
    new = updated(text)
    if args.check:
        if new != text:
            print(f"docs/configuration.md's settings tables are stale: run `{COMMAND}`",
                  file=sys.stderr)
            return 1
        return 0
    REFERENCE.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
