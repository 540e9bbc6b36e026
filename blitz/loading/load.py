"""Loading a registered model: one way from a ``ModelSpec`` to an ``Encoder``.

    load_model(spec, device, cache_dir, timeout_s)    the boundary: every failure under it
      |                                                becomes one ModelLoadFailed (424);
      |                                                it answers the encoder and the folder
      |                                                (``Loaded``; ``load_encoder``: the
      |                                                encoder alone)
      -> Load(spec, device, cache_dir, until)          the load; its deadline travels with it
      -> resolve_source(spec)                          source -> a local folder, fetched if
                                                       need be (``blitz.loading.fetch``)
      -> check_model_folder(spec, path)                trust: refused if it would run code
                                                       (``blitz.loading.model_trust``)
      -> open_backend(load, path, backend)             a named backend (fake, torch,
                                                       torch-bf16, onnx, onnx-int8) opened
                                                       once (``blitz.loading.opening``), or
         load_auto(spec, open_backend, folder=path)    ``auto``: the recorded choice, else
                                                       each candidate through
                                                       ``open_backend`` (in a child), timed,
                                                       recorded; the winner opened once
                                                       (``blitz.loading.auto``)

Each stage hands the next what it made and none calls back: the loader is the only
caller of the stages. Layers under it raise their own plain errors
(``blitz.errors.LoadProblem`` and its kinds: ``SourceUnavailable``, ``UntrustedCode``,
``AccuracyRefused``, ...); ``blitz.loading.failures.as_load_failure`` makes the one
``ModelLoadFailed`` here.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import NamedTuple

from blitz.encoders.base import Encoder
from blitz.loading.auto import load_auto
from blitz.loading.child_work import choose_in_child
from blitz.loading.failures import as_load_failure
from blitz.loading.fetch import resolve_source
from blitz.loading.model_trust import check_model_folder
from blitz.loading.opening import Load, open_backend
from blitz.runtime import model_threads
from blitz.runtime.child_process import DEFAULT_TIMEOUT_S
from blitz.settings.registry import ModelSpec

__all__ = ["Load", "Loaded", "backend_for", "load_encoder", "load_model", "open_backend",
           "resolve_device"]

logger = logging.getLogger("blitz.encoders")


def resolve_device(requested: str) -> str:
    """``requested`` if it exists here; a pool that finds no CUDA falls back to CPU."""
    if requested.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            logger.warning("no CUDA device found: this %s pool runs on CPU instead", requested)
            return "cpu"
    return requested


def backend_for(spec: ModelSpec, device: str) -> str:
    """How ``spec`` runs on ``device``: GPUs run torch (in ``spec.gpu_dtype``), CPUs run
    ``spec.cpu_backend`` (``auto`` included); a fake source is fake everywhere."""
    if spec.is_fake:
        return "fake"
    return spec.cpu_backend if device == "cpu" else "torch"


class Loaded(NamedTuple):
    """A load's encoder and the folder it was opened from (None: a fake source), so the
    model's facts are read from it without resolving the source again."""

    encoder: Encoder
    folder: Path | None


def load_encoder(spec: ModelSpec, device: str = "cpu", cache_dir: str | Path | None = None,
                 *, timeout_s: float = DEFAULT_TIMEOUT_S) -> Encoder:
    """``load_model``'s encoder."""
    return load_model(spec, device, cache_dir, timeout_s=timeout_s).encoder


def load_model(spec: ModelSpec, device: str = "cpu", cache_dir: str | Path | None = None,
               *, timeout_s: float = DEFAULT_TIMEOUT_S) -> Loaded:
    """Load ``spec`` for ``device`` with the backend the spec names for that kind of pool.
    ``cache_dir`` holds ONNX builds, ``auto``'s choices and object-storage downloads
    (``model_cache.cache_root`` when None). Work in child processes ends ``timeout_s``
    from now at the latest (a pool passes its ``load_timeout_s``). Every failure becomes
    ``ModelLoadFailed`` (HTTP 424) naming the model: here, and nowhere under it.
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    load = Load(spec, device, cache_dir, time.monotonic() + timeout_s)
    try:
        backend = backend_for(spec, device)
        path = None
        if backend != "fake":
            path = resolve_source(spec, cache_dir)
            check_model_folder(spec, path)
        if backend == "auto" and path is not None:  # (auto is never fake)
            folder, threads = path, model_threads.count()  # the child measures with these
            return Loaded(load_auto(
                spec, lambda name: open_backend(load, folder, name), folder=folder,
                cache_dir=cache_dir, threads=threads,
                chooser=lambda spec: choose_in_child(spec, folder, cache_dir, threads=threads,
                                                     timeout_s=load.time_left())), path)
        return Loaded(open_backend(load, path, backend), path)
    except Exception as exc:
        raise as_load_failure(spec.id, exc, spec.source) from exc
