"""Loading a registered model: one way from a ``ModelSpec`` to an ``Encoder``.

    load_encoder(spec, device, cache_dir, timeout_s)  the boundary: every failure under it
      |                                                becomes one ModelLoadFailed (424)
      -> Load(spec, device, cache_dir, until)          the load; its deadline travels with it
      -> resolve_source(spec)                          source -> a local folder, fetched if
                                                       need be (``blitz.loading.fetch``)
      -> check_model_folder(spec, path)                trust: refused if it would run code
                                                       (``blitz.loading.model_trust``)
      -> open_backend(load, path, backend)             a named backend: fake | torch |
                                                       torch-bf16 | onnx | onnx-int8, or
         load_auto(spec, open_backend, ...)            ``auto``: the recorded choice, else each
                                                       candidate through ``open_backend``
                                                       (in a child), timed; the winner once
           -> OPENERS[spec.kind, backend]              torch, or ONNX built once in a child
                                                       (export, quantization, accuracy
                                                       guard; cached), then opened
           -> the bf16 guard (torch-bf16 only)         ``blitz.loading.accuracy`` vs fp32
           -> wrap(spec, model, device)                the Encoder

Layers under it raise their own plain errors (``blitz.errors.LoadProblem`` and its
kind: ``SourceUnavailable``, ``UntrustedCode``, ``AccuracyRefused``, ...);
``blitz.loading.failures.as_load_failure`` makes the one ``ModelLoadFailed`` here.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blitz.encoders.base import Encoder
from blitz.encoders.fake import FakeEncoder
from blitz.encoders.models import open_torch_bi_encoder, open_torch_cross_encoder, wrap
from blitz.loading import accuracy
from blitz.loading.auto import candidates, load_auto
from blitz.loading.auto_cache import choice_key, remember_choice
from blitz.loading.children import build_in_child, choose_in_child
from blitz.loading.failures import as_load_failure
from blitz.loading.fetch import resolve_source
from blitz.loading.model_trust import check_model_folder
from blitz.loading.onnx_export import load_onnx
from blitz.runtime import model_threads
from blitz.runtime.child_process import DEFAULT_TIMEOUT_S
from blitz.runtime.cpu_features import cpu_supports_bf16
from blitz.settings.registry import ModelSpec

logger = logging.getLogger("blitz.encoders")

BUILD_IN_CHILD = True
"""ONNX builds run in a child process (``blitz.loading.children``) so that the loading process,
a long-lived replica or bulk actor, does not keep the export's memory."""


@dataclass(frozen=True)
class Load:
    """One load of ``spec`` for ``device``: what every step of it reads, its deadline
    included (a child build or measurement is killed past it; ``blitz.runtime.child_process``)."""

    spec: ModelSpec
    device: str
    cache_dir: str | Path | None
    until: float  # time.monotonic() by which the load ends

    def time_left(self) -> float:
        return max(0.0, self.until - time.monotonic())


# (the spec as this backend opens it, weights directory, the load) -> the model
Opener = Callable[[ModelSpec, Path, Load], Any]


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


def _torch_bi_encoder(spec: ModelSpec, path: Path, load: Load) -> Any:
    return open_torch_bi_encoder(spec, path, load.device).to(_torch_dtype(spec, load.device))


def _torch_cross_encoder(spec: ModelSpec, path: Path, load: Load) -> Any:
    return open_torch_cross_encoder(spec, path, load.device).to(
        _torch_dtype(spec, load.device))


def _onnx(spec: ModelSpec, path: Path, load: Load) -> Any:
    if BUILD_IN_CHILD:
        build_in_child(spec, path, load.cache_dir, timeout_s=load.time_left())
    return load_onnx(spec, path, load.cache_dir)


OPENERS: dict[tuple[str, str], Opener] = {
    ("embedding", "torch"): _torch_bi_encoder,
    ("embedding", "torch-bf16"): _torch_bi_encoder,  # opened in fp32: the guard's reference
    ("embedding", "onnx"): _onnx,
    ("embedding", "onnx-int8"): _onnx,
    ("cross-encoder", "torch"): _torch_cross_encoder,
    ("cross-encoder", "torch-bf16"): _torch_cross_encoder,
    ("cross-encoder", "onnx"): _onnx,
    ("cross-encoder", "onnx-int8"): _onnx,
}


def load_encoder(spec: ModelSpec, device: str = "cpu", cache_dir: str | Path | None = None,
                 *, timeout_s: float = DEFAULT_TIMEOUT_S) -> Encoder:
    """Load ``spec`` for ``device`` with the backend the spec names for that kind of pool.

    ``cache_dir`` holds ONNX builds and object-storage downloads (``model_cache.cache_root``
    when None). Work in child processes ends ``timeout_s`` from now at the latest (a
    pool passes its ``load_timeout_s``). Every failure becomes ``ModelLoadFailed`` (HTTP
    424) naming the model: here, and nowhere under it.
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    load = Load(spec, device, cache_dir, time.monotonic() + timeout_s)
    try:
        backend = backend_for(spec, device)
        if backend == "fake":
            return _fake(spec)
        path = resolve_source(spec, cache_dir)
        check_model_folder(spec, path)
        if backend == "auto":
            return _open_auto(load, path)
        return open_backend(load, path, backend)
    except Exception as exc:
        raise as_load_failure(spec.id, exc, spec.source) from exc


def open_backend(load: Load, path: Path, backend: str) -> Encoder:
    """``load.spec``'s model in ``path`` (resolved and checked) on ``backend``: the one
    opener of a named backend and of each ``auto`` candidate."""
    spec = load.spec
    if spec.cpu_backend == "auto":  # a candidate: its own builds and cache keys
        spec = spec.model_copy(update={"cpu_backend": backend})
    model = OPENERS[spec.kind, backend](spec, path, load)
    encoder = (_checked_bf16(spec, model, load.device) if backend == "torch-bf16"
               else wrap(spec, model, load.device))
    encoder.backend = backend
    encoder.calibrate()
    return encoder


def _open_auto(load: Load, path: Path) -> Encoder:
    """``cpu_backend: auto``: the choice recorded for this model, candidate set, CPU,
    threads, libraries and guard (``blitz.loading.auto_cache``), else measured in a child
    process (each candidate through ``open_backend`` there) and recorded; then only the
    winner is opened here, through ``open_backend``."""
    spec, threads = load.spec, model_threads.count()  # the child runs with this process's
    key, parts = choice_key(spec, path, candidates(), threads)
    return load_auto(
        spec, lambda name: open_backend(load, path, name),
        chooser=lambda spec: choose_in_child(spec, path, load.cache_dir, threads=threads,
                                             timeout_s=load.time_left()),
        remember=lambda measure: remember_choice(spec, key, parts, measure, load.cache_dir))


def _fake(spec: ModelSpec) -> Encoder:
    dimension, load_s, batch_s = spec.fake_params()
    time.sleep(load_s)  # a slow load, for fault tests (runs on a loader thread)
    return FakeEncoder(spec.id, dimension, spec.max_seq_length or 128, batch_s=batch_s,
                       batches_at_once=spec.fake_batches_at_once())


def _checked_bf16(spec: ModelSpec, model: Any, device: str) -> Encoder:
    """The bf16 guard: ``model`` (fp32) in bf16, refused when its probe answers stray
    from fp32's further than ``spec.accuracy_threshold`` allows."""
    import torch

    if not cpu_supports_bf16():
        logger.warning("model %r: this CPU has no native bf16 (avx512_bf16 or AMX); "
                       "torch-bf16 runs, but slower than fp32", spec.id)
    reference = accuracy.probe(wrap(spec, model, device))
    encoder = wrap(spec, model.to(torch.bfloat16), device)
    report = accuracy.compare(spec.kind, reference, accuracy.probe(encoder))
    accuracy.enforce_accuracy(spec, "torch-bf16", report)
    return encoder


def _torch_dtype(spec: ModelSpec, device: str) -> Any:
    import torch

    if device.startswith("cuda"):
        plan_free_attention(torch)
        return {"float16": torch.float16, "bfloat16": torch.bfloat16,
                "float32": torch.float32}[spec.gpu_dtype]
    return torch.float32


def plan_free_attention(torch: Any) -> None:
    """Keep cuDNN out of torch's attention on CUDA, for this process.

    torch (2.5 and later) sends a masked ``scaled_dot_product_attention`` to cuDNN first
    on Hopper and newer GPUs, and cuDNN builds an execution plan for each new (batch,
    length) shape it sees: ~0.2 s each on an H200. A GPU pool batches whatever requests
    are waiting, so nearly every batch is a new shape, and the single profile served 154
    texts/s at a 200 ms p50 (docs/benchmarks-history.md, "GPU pool on an NVIDIA H200").
    The flash and memory-efficient kernels need no plan; torch falls back to them."""
    torch.backends.cuda.enable_cudnn_sdp(False)
