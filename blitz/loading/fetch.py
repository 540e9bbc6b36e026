"""Source and fetch: where a model's weights are, as a local folder, before anything
opens them.

``resolve_source(spec)`` turns a spec's ``source`` (``blitz.settings.registry`` lists
the kinds) into a local directory: an installed package's folder, a local path, a hub
snapshot (downloaded if need be) or an object-storage prefix copied into the model cache
(``blitz.sources.storage``). A source that gives no folder raises ``SourceUnavailable``;
the loader's boundary makes it the client's ``ModelLoadFailed``. ``read_dimension``
reads a local model's embedding size from its files, loading no weights.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from blitz.errors import LoadProblem
from blitz.loading.model_trust import check_model_folder
from blitz.settings.kinds import kind_of
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


def read_dimension(spec: ModelSpec) -> int | None:
    """The embedding size, from the spec or the model's files, without loading weights."""
    if spec.dimension:
        return spec.dimension
    if spec.is_fake:
        return spec.fake_params()[0]
    source = kind_of(spec.kind).dimension
    if source is None or not spec.location().is_local:
        return None
    if source == "projection":  # CLIP's projection_dim; SigLIP's text projection
        try:
            config = json.loads((resolve_source(spec) / "config.json").read_text())
            text = config.get("text_config") or {}
            return int(config.get("projection_dim") or text.get("projection_size")
                       or text["hidden_size"])
        except Exception:
            return None
    if source == "vocabulary":  # one weight per vocabulary token
        try:
            return int(json.loads((resolve_source(spec) / "config.json").read_text())
                       ["vocab_size"])
        except Exception:
            return None
    try:
        path = resolve_source(spec)
        modules = json.loads((path / "modules.json").read_text()) if (
            path / "modules.json").exists() else []
        for module in reversed(modules):
            cfg = path / module.get("path", "") / "config.json"
            if module.get("type", "").endswith("Dense") and cfg.exists():
                return int(json.loads(cfg.read_text())["out_features"])
        return int(json.loads((path / "config.json").read_text())["hidden_size"])
    except Exception:
        return None


POOLING_MODES = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
                 "pooling_mode_max_tokens": "max", "pooling_mode_lasttoken": "last_token"}


def read_facts(spec: ModelSpec) -> dict[str, object]:
    """A local model's max input length and pooling, from its files (no weights loaded);
    None where the files do not say or are not on this machine."""
    facts: dict[str, object] = {"max_input_length": spec.max_seq_length,
                                "pooling": spec.pooling}
    if spec.is_fake or not spec.location().is_local:
        return facts
    try:
        path = resolve_source(spec)
        sbert = _read_json(path / "sentence_bert_config.json")
        config = _read_json(path / "config.json")
        facts["max_input_length"] = (spec.max_seq_length or sbert.get("max_seq_length")
                                     or _shortest(config.get("max_position_embeddings"),
                                                  _read_json(path / "tokenizer_config.json")
                                                  .get("model_max_length")))
        if isinstance(config.get("id2label"), dict):
            facts["id2label"] = {str(k): str(v) for k, v in config["id2label"].items()}
        if facts["pooling"] is None:
            modules = _read_json(path / "modules.json") or []
            pool_dir = next((m.get("path", "") for m in modules
                             if str(m.get("type", "")).endswith("Pooling")), None)
            pooling = _read_json(path / pool_dir / "config.json") if pool_dir else {}
            facts["pooling"] = next((name for key, name in POOLING_MODES.items()
                                     if pooling.get(key)), None)
    except Exception:  # facts for /info: never worth failing a request over
        pass
    return facts


def _shortest(*lengths: object) -> int | None:
    """The least of the lengths that are sane ints (a tokenizer without a limit says 1e30),
    as sentence-transformers takes a model's max_seq_length where its config names none."""
    sane = [n for n in lengths if isinstance(n, int) and 0 < n < 1_000_000]
    return min(sane) if sane else None


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else {}
