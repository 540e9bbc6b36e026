"""Which models the admin API may add: where their weights come from, and whether they may
run their own code. The admin key is not a code-execution key: the config decides.

- ``trust_remote_code: true`` is refused unless ``admin.allow_remote_code`` is set.
- The source, normalized, must be under one of ``admin.allowed_sources``; with none
  listed, it must be one of the config's own models' sources (a variant of a model the
  operator already serves: other settings, the same files). Normalized means: a folder
  made absolute with its links and ``..`` resolved (a relative folder is refused: each
  replica's working directory is its own), an object-storage path with no ``.``/``..``
  segment, ``%`` or backslash, a hub id in lower case (the hub's ids are not
  case-sensitive) matching the hub's own id rule.
- A prefix matches the source itself, or what follows it after ``/`` or ``@`` (``hf:BAAI``
  matches ``hf:BAAI/bge-m3``, not ``hf:BAAI-x/y``); a prefix that ends in ``:`` or ``/``
  (``package:``, ``s3://bucket/models/``) matches whatever starts with it.
- An added model's folder source is stored resolved, so the replicas load the folder
  that was checked.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from blitz.errors import Forbidden, InvalidValue, echo
from blitz.settings.config import AdminSettings
from blitz.settings.registry import OBJECT_STORES, ModelSpec, hub_repo, parse_source

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
SCHEMES = ("package:", "hf:", "fake:", *(f"{s}://" for s in OBJECT_STORES))


def normalized(source: str, relative_from: Path | None = None) -> str:
    """``source`` in the one spelling prefixes are compared with; ``InvalidValue`` where
    it has none (``relative_from``: resolve a relative folder against it, for the config's
    own sources; None: a relative folder is refused)."""
    scheme, rest = parse_source(source)
    if scheme == "dir":
        path = Path(rest).expanduser()
        if not path.is_absolute():
            if relative_from is None:
                raise InvalidValue(f"a folder source added over the admin API must be an "
                                   f"absolute path, not {echo(source)!r}",
                                   param="model.source")
            path = relative_from / path
        return os.path.realpath(path)
    if scheme in OBJECT_STORES:
        parts = rest.split("/")
        if any(p in (".", "..") for p in parts) or "%" in rest or "\\" in rest:
            raise InvalidValue(f"source {echo(source)!r}: no '.' or '..' segments, '%' or "
                               "'\\' in an object-storage path", param="model.source")
        return f"{scheme}://" + "/".join(p for p in parts if p)
    if scheme == "hf":
        repo_id, revision = hub_repo(rest)
        if not _HUB_ID.match(repo_id) or ".." in repo_id:
            raise InvalidValue(f"source {echo(source)!r}: a hub id is <org>/<name> of "
                               "letters, digits, '.', '_' and '-'", param="model.source")
        return f"hf:{repo_id.lower()}" + (f"@{revision}" if revision else "")
    return f"{scheme}:{rest.strip()}"


def normalized_prefix(prefix: str) -> str:
    """An ``admin.allowed_sources`` entry in the spelling of ``normalized``."""
    if prefix in SCHEMES:
        return prefix
    scheme, rest = parse_source(prefix)
    if scheme == "dir":
        path = os.path.realpath(Path(rest).expanduser())
        return path + "/" if prefix.endswith("/") and not path.endswith("/") else path
    if scheme == "hf":
        return f"hf:{rest.lower()}"
    if scheme in OBJECT_STORES:
        return f"{scheme}://" + "/".join(p for p in rest.split("/") if p) + (
            "/" if rest.endswith("/") else "")
    return prefix


def under(source: str, prefix: str) -> bool:
    """Whether the normalized ``source`` is ``prefix`` or under it (module docstring)."""
    if source == prefix:
        return True
    if prefix.endswith((":", "/")):
        return source.startswith(prefix)
    follows = "/@" if prefix.startswith("hf:") else "/"  # @: a hub revision
    return source.startswith(prefix) and source[len(prefix)] in follows


class SourcePolicy:
    """``admin.allow_remote_code`` and ``admin.allowed_sources`` applied to an added spec."""

    def __init__(self, settings: AdminSettings, config_models: list[ModelSpec],
                 cwd: Path | None = None):
        self.allow_remote_code = settings.allow_remote_code
        self.prefixes = [normalized_prefix(p) for p in settings.allowed_sources]
        here = cwd or Path.cwd()
        self.config_sources = set()
        for spec in config_models:
            try:
                self.config_sources.add(normalized(spec.source, here))
            except InvalidValue:  # a config source of no normal spelling matches nothing
                continue

    def check(self, model: ModelSpec) -> ModelSpec:
        """``model`` as it may be added (a folder source resolved), or ``Forbidden``."""
        if model.trust_remote_code and not self.allow_remote_code:
            raise Forbidden("the admin API adds no model that runs its own code: "
                            "trust_remote_code is refused unless the config sets "
                            "admin.allow_remote_code: true", param="model.trust_remote_code")
        source = normalized(model.source)
        if self.prefixes:
            allowed = any(under(source, p) for p in self.prefixes)
            where = "under admin.allowed_sources"
        else:
            allowed = source in self.config_sources
            where = ("one of the config's own models' sources (admin.allowed_sources is "
                     "empty; list the prefixes the admin API may add from)")
        if not allowed:
            raise Forbidden(f"source {echo(model.source)!r} is not {where}",
                            param="model.source")
        if parse_source(model.source).scheme == "dir" and source != model.source:
            return model.model_copy(update={"source": source})
        return model
