"""Object-storage model sources: ``s3://``, ``gs://``, ``az://``, ``abfs://`` prefixes.

A prefix is downloaded once into the model cache (area ``sources``, see
``blitz.sources.model_cache``): built in a temporary directory, renamed into place, under a
file lock, so concurrent replicas download it once and none loads a partial copy. A
cache hit never contacts the store.

fsspec opens the URI (``s3fs`` for s3://, ``gcsfs`` for gs://, ``adlfs`` for az:// and
abfs://; each installed separately). Credentials and endpoints come from the usual
environment: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_PROFILE``,
``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` (MinIO, Ceph, R2, ...),
``GOOGLE_APPLICATION_CREDENTIALS``, ``AZURE_STORAGE_CONNECTION_STRING``, and so on.
"""

from __future__ import annotations

import os
import posixpath
from pathlib import Path, PurePosixPath
from typing import Any

from blitz.errors import InvalidValue, LoadProblem
from blitz.sources import model_cache

AREA = "sources"
PACKAGES = {"s3": "s3fs", "gs": "gcsfs", "az": "adlfs", "abfs": "adlfs"}


class ObjectStoreError(LoadProblem):
    """An object-storage source that cannot be fetched whole."""


def fetch_to_cache(model_id: str, uri: str, cache_dir: str | os.PathLike[str] | None = None,
                   *, lock_timeout: float | None = None) -> Path:
    """The local copy of the prefix ``uri`` (model ``model_id``'s source), downloading it
    on the first call into the cache at ``cache_dir`` (``model_cache.cache_root``).

    A cached copy missing a file, or with a file of another size than was downloaded, is
    downloaded again (``model_cache.get_or_build``). ``lock_timeout`` bounds the wait for
    another process downloading it (``model_cache.LOCK_TIMEOUT_S`` by default). What the
    store or the network raise (credentials, permissions, ...) propagates as it is; the
    loader makes it a ``ModelLoadFailed``.
    """
    uri = uri.rstrip("/")
    root = model_cache.cache_root(cache_dir)
    key = model_cache.entry_key(posixpath.basename(uri) or "source", {"uri": uri})

    def build(tmp: Path) -> dict[str, Any]:
        files = download_prefix(model_id, uri, tmp)
        return {"uri": uri, "model_id": model_id, "files": files,
                "bytes": sum(files.values())}

    return model_cache.get_or_build(root, AREA, key, build, validate=_check_files,
                                    lock_timeout=lock_timeout, model=model_id).path


def _check_files(entry: model_cache.CacheEntry) -> None:
    """Raise unless every downloaded object is there with its size (entries of any age)."""
    files = entry.meta["files"]
    if not isinstance(files, dict) or not files:
        raise ValueError(f"{model_cache.ENTRY_FILE} lists no downloaded files")
    for relative, size in files.items():
        actual = (entry.path / relative).stat().st_size  # FileNotFoundError when missing
        if actual != size:
            raise ValueError(f"{relative} has {actual} bytes, {size} when it was downloaded")


def download_prefix(model_id: str, uri: str, target: Path) -> dict[str, int]:
    """Copy every object under ``uri`` into ``target``; returns relative path -> bytes."""
    fs, prefix = _open(model_id, uri)
    try:
        listing = fs.find(prefix, detail=True)
    except FileNotFoundError as exc:  # no such bucket or container
        raise ObjectStoreError(f"model {model_id!r}: {uri} does not exist") from exc
    objects = {path: info for path, info in listing.items() if info.get("type") != "directory"}
    if not objects:
        raise ObjectStoreError(f"model {model_id!r}: no objects found under {uri}")
    copied: dict[str, int] = {}
    for path, info in sorted(objects.items()):
        relative = _relative(model_id, uri, prefix, path)
        destination = target.joinpath(*PurePosixPath(relative).parts)
        destination.parent.mkdir(parents=True, exist_ok=True)
        fs.get_file(path, str(destination))
        size = destination.stat().st_size
        expected = info.get("size")
        if expected is not None and int(expected) != size:
            raise ObjectStoreError(
                f"model {model_id!r}: {uri}/{relative} downloaded {size} of {expected} bytes")
        copied[relative] = size
    return copied


def storage_options(protocol: str) -> dict[str, Any]:
    """fsspec options from the environment (only what the libraries do not read themselves)."""
    if protocol == "s3":
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        return {"endpoint_url": endpoint} if endpoint else {}
    return {}


# Where object storage is, never who may read it: a bulk job passes these to its workers
# (a MinIO endpoint, a region); each worker finds its own credentials.
LOCATION_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION")


def location_env() -> dict[str, str]:
    """The ``LOCATION_ENV`` variables set in this process."""
    return {name: os.environ[name] for name in LOCATION_ENV if os.environ.get(name)}


def filesystem_for(uri: str) -> tuple[Any, str]:
    """(fsspec filesystem, path) for a bulk job's input or output: a local path or an
    object-storage URI. Credentials are never passed in: the filesystem resolves them
    where it runs (environment, profile, instance or pod role) and refreshes expiring
    ones, so a filesystem is opened on each worker from the URI and never shipped."""
    import fsspec

    protocol = uri.split("://", 1)[0] if "://" in uri else "file"
    try:
        return fsspec.core.url_to_fs(uri, **storage_options(protocol))
    except ImportError as exc:
        package = PACKAGES.get(protocol, protocol)
        raise InvalidValue(f"{protocol}:// paths need the {package!r} package; "
                           f"pip install {package}") from exc


def _open(model_id: str, uri: str) -> tuple[Any, str]:
    import fsspec

    protocol = uri.split("://", 1)[0]
    try:
        return fsspec.core.url_to_fs(uri, skip_instance_cache=True,
                                     **storage_options(protocol))
    except ImportError as exc:
        package = PACKAGES.get(protocol, protocol)
        raise ObjectStoreError(
            f"model {model_id!r}: {protocol}:// sources need the {package!r} package; "
            f"pip install {package}") from exc


def _relative(model_id: str, uri: str, prefix: str, path: str) -> str:
    """``path`` relative to the prefix, refusing anything that would leave the target."""
    prefix = prefix.rstrip("/")
    relative = path[len(prefix):].lstrip("/") if path.startswith(prefix + "/") else (
        posixpath.basename(path))  # the URI names one object
    if not relative or ".." in relative.split("/"):
        raise ObjectStoreError(f"model {model_id!r}: unsafe object name {path!r} under {uri}")
    return relative
