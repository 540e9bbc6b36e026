"""Source and fetch: where a model's weights are, as a local folder, before anything
opens them.

``resolve_source(spec)`` turns a spec's ``source`` (``blitz.settings.registry`` lists
the kinds) into a local directory: an installed package's folder, a local path, a hub
snapshot (downloaded if need be) or an object-storage prefix copied into the model cache
(``blitz.sources.storage``). A source that gives no folder raises ``SourceUnavailable``;
the loader's boundary makes it the client's ``ModelLoadFailed``. What a model's files say
(its dimension, shape, max input length) is read by ``blitz.loading.facts``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
from collections.abc import Callable
from pathlib import Path

from blitz.errors import LoadProblem
from blitz.loading.model_trust import check_model_folder
from blitz.settings.registry import OBJECT_STORES, ModelSpec, hub_repo
from blitz.sources.storage import fetch_to_cache


class SourceUnavailable(LoadProblem):
    """A model's source gives no local folder: not installed, missing, not fetched."""


def resolve_source(spec: ModelSpec, cache_dir: str | os.PathLike | None = None) -> Path:
    """A local directory holding ``spec``'s weights; raises ``SourceUnavailable`` if none.

    One fetcher per scheme (``FETCHERS``). Object-storage sources are downloaded into the
    model cache under ``cache_dir`` (``model_cache.cache_root``'s default when None).
    """
    scheme, rest = spec.location()
    return FETCHERS[scheme](spec, rest, cache_dir)


def preflight_source(spec: ModelSpec) -> None:
    """Raise now what loading a local or package source would: ``SourceUnavailable`` when
    it is missing, ``UntrustedCode`` when its folder would run code its spec does not
    trust. Cheap (only JSON is read, no weights); object-storage and hub sources are
    checked when loaded."""
    if spec.location().is_local and not spec.is_fake:
        check_model_folder(spec, resolve_source(spec))


def check_package(spec: ModelSpec) -> None:
    """Raise ``SourceUnavailable`` unless a ``package:`` source's top-level module belongs
    to an installed distribution, from the distributions' metadata alone: nothing is
    imported or run (an import runs the module's code; ``find_spec`` of a dotted name
    imports its parents). What the module gives is known only when a replica loads it."""
    name = spec.location().rest.strip()
    top = name.partition(".")[0]
    if not all(part.isidentifier() for part in name.split(".")) or (
            top not in importlib.metadata.packages_distributions()):
        raise SourceUnavailable(f"model {spec.id!r}: package {name!r} is not a module of "
                                "an installed distribution")


Fetcher = Callable[[ModelSpec, str, "str | os.PathLike | None"], Path]


def _from_package(spec: ModelSpec, rest: str, cache_dir: str | os.PathLike | None) -> Path:
    try:
        module = importlib.import_module(rest)
    except ImportError as exc:
        raise SourceUnavailable(
            f"model {spec.id!r}: package {rest!r} is not installed ({exc})") from exc
    getter = getattr(module, "get_model_path", None)
    if callable(getter):
        path = Path(getter())
    elif module.__file__ is not None:
        path = Path(module.__file__).parent / "model"
    else:
        raise SourceUnavailable(
            f"model {spec.id!r}: package {rest!r} has neither get_model_path() nor a "
            "model/ folder beside its __init__.py")
    return _existing_dir(spec, path)


def _from_dir(spec: ModelSpec, rest: str, cache_dir: str | os.PathLike | None) -> Path:
    return _existing_dir(spec, Path(rest).expanduser())


def _existing_dir(spec: ModelSpec, path: Path) -> Path:
    if not path.is_dir():
        raise SourceUnavailable(f"model {spec.id!r}: directory {str(path)!r} does not exist")
    return path


def _from_hub(spec: ModelSpec, rest: str, cache_dir: str | os.PathLike | None) -> Path:
    from huggingface_hub import snapshot_download

    repo_id, revision = hub_repo(rest)
    try:
        return Path(snapshot_download(repo_id, revision=revision))
    except Exception as exc:  # offline, unknown repo, auth: all mean "cannot load"
        offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
        hint = " (HF_HUB_OFFLINE is set and it is not in the local cache)" if offline else ""
        raise SourceUnavailable(
            f"model {spec.id!r}: cannot fetch hf:{rest} from the Hugging Face hub{hint}: "
            f"{type(exc).__name__}") from exc


def _from_object_store(spec: ModelSpec, rest: str,
                       cache_dir: str | os.PathLike | None) -> Path:
    return fetch_to_cache(spec.id, spec.source, cache_dir)


def _no_files(spec: ModelSpec, rest: str, cache_dir: str | os.PathLike | None) -> Path:
    raise ValueError("fake sources have no files")


FETCHERS: dict[str, Fetcher] = {
    "package": _from_package, "hf": _from_hub, "dir": _from_dir, "fake": _no_files,
    **dict.fromkeys(OBJECT_STORES, _from_object_store)}
"""Source scheme (``blitz.settings.registry.parse_source``) -> its fetcher."""
