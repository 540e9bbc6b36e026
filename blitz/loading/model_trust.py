"""Refuse a model folder that would run its own code, unless its spec trusts it.

Every source ends as a local folder (a hub snapshot, an object-storage copy in the cache,
a package's files, a plain directory, an ONNX build in the cache), and sentence-transformers
trusts local folders: a ``modules.json`` entry of type ``modeling_evil.Evil`` imports
``modeling_evil.py`` from the folder, and so runs it, without ``trust_remote_code``.
Whoever can write a bucket, a hub repo or the cache would run code in every replica.

``check_model_folder(spec, path)`` runs before a folder is opened (``load_encoder`` after
``resolve_source``; ``prepare_onnx`` for the source and for a cached build). Unless
``spec.trust_remote_code`` is set, it refuses a folder where

- a module type (``modules.json``; a Router's ``types``) is not sentence-transformers' own
  (``sentence_transformers.*``, which covers the legacy ``sentence_transformers.models.*``
  names that sentence-transformers maps itself, and PyLate's Dense, which it opens as its
  own: ``ALIASED_TYPES``), or a module path leaves the folder;
- a transformers config (``config.json``, ``tokenizer_config.json``, ...) carries
  ``auto_map``: transformers' remote code;
- a link leads to a folder outside it, or one of those JSON files cannot be read.

Only JSON is read; nothing in the folder is imported.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from blitz.errors import LoadProblem, echo

if TYPE_CHECKING:
    from blitz.settings.registry import ModelSpec

_OWN_TYPE = re.compile(r"^sentence_transformers(\.[A-Za-z_][A-Za-z0-9_]*)+$")
MODULE_LISTS = ("modules.json",)
ROUTER_CONFIGS = ("router_config.json", "config.json")  # a Router's sub-module ``types``
TRANSFORMERS_CONFIGS = ("config.json", "tokenizer_config.json", "preprocessor_config.json",
                        "processor_config.json", "video_preprocessor_config.json")
_INSPECTED = frozenset(MODULE_LISTS + ROUTER_CONFIGS + TRANSFORMERS_CONFIGS)
MAX_JSON_BYTES = 64 * 2**20  # a tokenizer_config.json with many added tokens is a few MiB


class UntrustedCode(LoadProblem):
    """A model folder names code to run and its spec does not trust it."""


def check_model_folder(spec: ModelSpec, path: Path) -> None:
    """Raise ``UntrustedCode`` naming what in ``path`` would run code, unless
    ``spec.trust_remote_code``."""
    if spec.trust_remote_code:
        return
    found = code_references(path)
    if found:
        named = "; ".join(f for f in found if "cannot be read" not in f) or \
            "config files it cannot read"  # exception text would name server paths
        raise UntrustedCode(
            f"model {spec.id!r}: refused to open {path}: {'; '.join(found)}. Loading it would "
            "run code from the model's files; if you trust this source, set "
            "`trust_remote_code: true` on the model entry",
            hint=f"refused: its files would run code ({echo(named, 200)}); an operator who "
                 "trusts the source sets trust_remote_code: true on the model entry")


def code_references(path: Path) -> list[str]:
    """What in the folder ``path`` would make sentence-transformers or transformers import
    code from it (or from any installed module it names), each said in words."""
    files, found = _inspected_files(path)
    for file in files:
        where = file.relative_to(path).as_posix()
        try:
            if not file.is_file() or file.stat().st_size > MAX_JSON_BYTES:
                raise ValueError("not a regular file of at most "
                                 f"{MAX_JSON_BYTES // 2**20} MiB")
            value = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            found.append(f"{where} cannot be read to check it ({type(exc).__name__}: {exc})")
            continue
        if file.name in MODULE_LISTS:
            found += _module_list_problems(where, value)
        if file.name in ROUTER_CONFIGS and isinstance(value, dict) and "types" in value:
            types = value["types"]
            refs = list(types.values()) if isinstance(types, dict) else [types]
            found += [f"{where} names the module type {ref!r}, not sentence-transformers' own"
                      for ref in refs if not is_own_module_type(ref)]
        if file.name in TRANSFORMERS_CONFIGS and isinstance(value, dict) and "auto_map" in value:
            found.append(f"{where} has auto_map (transformers remote code: "
                         f"{_short(value['auto_map'])})")
    return found


ALIASED_TYPES = frozenset({"pylate.models.Dense.Dense"})
"""Module types of other libraries that sentence-transformers opens as its own class
without importing them (``MultiVectorEncoder``'s ``_CLASS_REF_ALIASES``: PyLate's Dense is
its Dense)."""


def is_own_module_type(ref: object) -> bool:
    """Whether ``ref`` names a class of sentence-transformers itself, or one it aliases to
    its own (``ALIASED_TYPES``)."""
    return isinstance(ref, str) and (bool(_OWN_TYPE.match(ref)) or ref in ALIASED_TYPES)


def _module_list_problems(where: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
        return [f"{where} is not a list of modules"]
    problems = []
    for module in value:
        ref = module.get("type")
        if not is_own_module_type(ref):
            problems.append(f"{where} names the module type {ref!r}, not "
                            "sentence-transformers' own")
        sub = module.get("path", "")
        if not isinstance(sub, str) or PurePosixPath(sub).is_absolute() or ".." in sub.split("/"):
            problems.append(f"{where} names the module path {sub!r}, outside the model folder")
    return problems


def _inspected_files(path: Path) -> tuple[list[Path], list[str]]:
    """The folder's JSON files that name code, at any depth, and what refuses the folder
    on the way: a link to a folder outside it (what it holds is unchecked, and it could
    be any size). Links to files are fine (a hub snapshot is made of them)."""
    root = os.path.realpath(path)
    files: list[Path] = []
    refused: list[str] = []
    seen: set[str] = set()
    for directory, subdirs, names in os.walk(path, followlinks=True):
        if os.path.realpath(directory) in seen:  # a link back into the folder: read once
            subdirs.clear()
            continue
        seen.add(os.path.realpath(directory))
        for name in sorted(subdirs):
            real = os.path.realpath(os.path.join(directory, name))
            if os.path.commonpath([root, real]) != root:
                where = Path(directory, name).relative_to(path).as_posix()
                refused.append(f"{where} links to a folder outside the model folder")
                subdirs.remove(name)
        subdirs.sort()
        files += [Path(directory) / name for name in sorted(names) if name in _INSPECTED]
    return files, refused


def _short(value: Any, limit: int = 120) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[:limit] + "..."
