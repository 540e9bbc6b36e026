"""The map of the library, generated from the package and module docstrings so it cannot
drift: README.md's "Layout" and docs/architecture.md's tables.

``python -m blitz.map`` rewrites the text between the markers in both documents; ``--check``
exits 1 when either differs (``tests/unit/test_map.py`` does the same). It reads the
source files and imports none of them: a package's floor is derived from its imports (one
above the highest unit it imports), so the map shows the floors the code has.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "blitz"
README = ROOT / "README.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
COMMAND = "python -m blitz.map"
GENERATED = ("tei_pb2.py",)  # protoc's output: no docstring of its own
_SENTENCE_END = re.compile(r"\.(\s+(?=[A-Z`])|\s*$)")  # a period before a capital, or the end


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:start ({COMMAND}) -->", f"<!-- {name}:end -->"


def docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""


def first_paragraph(text: str) -> str:
    return " ".join(text.split("\n\n")[0].split())


def first_sentence(text: str) -> str:
    paragraph = first_paragraph(text)
    match = _SENTENCE_END.search(paragraph)
    return paragraph[: match.start()] if match else paragraph.rstrip(".")


def headline(text: str) -> str:
    """A package's docstring up to its first colon outside code, or its first sentence."""
    sentence = first_sentence(text)
    outside = re.sub(r"``[^`]*``", lambda m: "x" * len(m.group()), sentence)
    colon = outside.find(": ")
    return sentence[:colon] if colon > 0 else sentence


def units() -> dict[str, Path]:
    """``blitz``'s packages (their ``__init__.py``) and top-level modules, by name."""
    found = {f"blitz.{p.parent.name}": p for p in sorted(PACKAGE.glob("*/__init__.py"))}
    found |= {f"blitz.{p.stem}": p for p in sorted(PACKAGE.glob("*.py"))
              if p.name != "__init__.py"}
    return dict(sorted(found.items()))


def modules(package: Path) -> list[Path]:
    """A package's modules and subpackages (their ``__init__.py``), protoc's output left out."""
    folder = package.parent
    inner = [p for p in sorted(folder.glob("*.py"))
             if p.name != "__init__.py" and p.name not in GENERATED]
    return inner + sorted(folder.glob("*/__init__.py"))


def short_name(path: Path) -> str:
    return path.parent.name + "/" if path.name == "__init__.py" else path.stem


def _imported_units(path: Path) -> set[str]:
    """The units of ``blitz`` any file of the unit at ``path`` imports (any depth, any place)."""
    files = sorted(path.parent.rglob("*.py")) if path.name == "__init__.py" else [path]
    found: set[str] = set()
    for file in files:
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: inside the unit, or a sibling unit of blitz
                    relative = file.relative_to(ROOT).with_suffix("").parts
                    anchor = relative[: len(relative) - node.level]
                    names = [".".join([*anchor, *([node.module] if node.module else [])])]
                else:
                    base = node.module or ""
                    names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            for name in names:
                parts = name.split(".")
                if parts[0] == "blitz" and len(parts) > 1:
                    found.add(".".join(parts[:2]))
    return found


def floors() -> dict[str, int]:
    """Each unit's floor: 0 when it imports no other unit, else one above the highest it
    imports (the layering test keeps the graph free of cycles)."""
    table = units()
    graph = {name: (_imported_units(path) & set(table)) - {name} for name, path in table.items()}
    floor: dict[str, int] = {}

    def of(name: str) -> int:
        if name not in floor:
            floor[name] = 1 + max((of(t) for t in graph[name]), default=-1)
        return floor[name]

    for name in graph:
        of(name)
    return floor


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("``", "`")


def layout_table() -> str:
    """README's table: each unit, lowest floor first, with its docstring's headline."""
    floor = floors()
    rows = ["| floor | package or module | what it holds |", "|---|---|---|"]
    for name, path in sorted(units().items(), key=lambda item: (floor[item[0]], item[0])):
        label = short_name(path) if path.name == "__init__.py" else f"{path.stem}.py"
        rows.append(f"| {floor[name]} | `{label}` | {_cell(headline(docstring(path)))} |")
    return "\n".join(rows)


def architecture_tables() -> str:
    """docs/architecture.md's tables: each unit's first paragraph, then every module's
    first sentence, package by package, lowest floor first."""
    floor = floors()
    ordered = sorted(units().items(), key=lambda item: (floor[item[0]], item[0]))
    rows = ["| floor | package or module | owns |", "|---|---|---|"]
    for name, path in ordered:
        label = short_name(path) if path.name == "__init__.py" else f"{path.stem}.py"
        rows.append(f"| {floor[name]} | `{label}` | "
                    f"{_cell(first_paragraph(docstring(path)))} |")
    rows += ["", "Every module, package by package (its docstring's first sentence):", "",
             "| module | what it holds |", "|---|---|"]
    for _name, path in ordered:
        if path.name == "__init__.py":
            rows += [f"| `{where}` | {_cell(first_sentence(docstring(module)))} |"
                     for where, module in _every_module(path)]
    return "\n".join(rows)


def _every_module(package: Path) -> list[tuple[str, Path]]:
    """A package's modules, then each subpackage and its modules (depth first), by the path
    under ``blitz/`` that names them."""
    found = []
    for module in modules(package):
        where = module.relative_to(PACKAGE).as_posix()
        if module.name == "__init__.py":
            found.append((where.removesuffix("__init__.py"), module))
            found += _every_module(module)
        else:
            found.append((where, module))
    return found


def unnamed_modules() -> dict[str, list[str]]:
    """Each package (subpackages too) whose docstring does not name all its modules and
    subpackages (as ``name``) -> those."""
    missing = {}
    for path in sorted(PACKAGE.glob("*/**/__init__.py")):
        name = ".".join(path.parent.relative_to(ROOT).parts)
        if path.name == "__init__.py":
            text = docstring(path)
            absent = [short_name(m).rstrip("/") for m in modules(path)
                      if f"``{short_name(m).rstrip('/')}``" not in text
                      and f"``{short_name(m)}``" not in text]  # a subpackage: ``name/`` too
            if absent:
                missing[name] = absent
    return missing


def undocumented() -> list[str]:
    """Every file of ``blitz`` (protoc's output aside) without a docstring."""
    return [p.relative_to(ROOT).as_posix() for p in sorted(PACKAGE.rglob("*.py"))
            if p.name not in GENERATED and not docstring(p)]


def updated(text: str, name: str, body: str) -> str:
    start, end = markers(name)
    head, found, rest = text.partition(start)
    _, closed, tail = rest.partition(end)
    if not found or not closed:
        raise ValueError(f"lacks the markers {start!r} ... {end!r}")
    return f"{head}{start}\n{body}\n{end}{tail}"


def rendered() -> dict[Path, str]:
    """Each document with its generated part as the code says it now."""
    return {
        README: updated(README.read_text(encoding="utf-8"), "layout", layout_table()),
        ARCHITECTURE: updated(ARCHITECTURE.read_text(encoding="utf-8"), "packages",
                              architecture_tables()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a document differs")
    args = parser.parse_args(argv)
    stale = [path for path, text in rendered().items()
             if text != path.read_text(encoding="utf-8")]
    if args.check:
        for path in stale:
            print(f"{path.relative_to(ROOT)}'s map is stale: run `{COMMAND}`", file=sys.stderr)
        return 1 if stale else 0
    for path, text in rendered().items():
        path.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
