"""Loading a registered model: one straight path from a ``ModelSpec`` to an ``Encoder``.

    load_encoder(spec, device)
      -> backend_for(spec, device)             fake | torch | torch-bf16 | onnx | onnx-int8
                                               | auto (``loading.auto``: each of the others
                                               through this same path, measured, the winner;
                                               the choice cached by ``blitz.loading.auto_cache``)
      -> resolve_source(spec)                  a local directory (downloaded if need be)
      -> check_model_folder(spec, path)        refused if it would run its own code
                                               (``blitz.loading.model_trust``;
                                               ``trust_remote_code``)
      -> OPENERS[spec.kind, backend](...)      the sentence-transformers model
      -> the bf16 guard (torch-bf16 only)      ``blitz.loading.accuracy`` vs fp32, then bf16
      -> wrap(spec, model, device)             the Encoder

Every failure on the way becomes one ``ModelLoadFailed`` (HTTP 424) naming the model,
made by ``blitz.loading.failures.as_load_failure``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
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
from blitz.loading.model_trust import check_model_folder
from blitz.loading.onnx_export import load_onnx
from blitz.runtime import model_threads
from blitz.runtime.cpu_features import cpu_supports_bf16
from blitz.settings.registry import ModelSpec, resolve_source

logger = logging.getLogger("blitz.encoders")

BUILD_IN_CHILD = True
"""ONNX builds run in a child process (``blitz.loading.children``) so that the loading process,
a long-lived replica or bulk actor, does not keep the export's memory."""


# (spec, weights directory, device, cache dir) -> the sentence-transformers model
Opener = Callable[[ModelSpec, Path, str, str | Path | None], Any]


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


def _torch_bi_encoder(spec: ModelSpec, path: Path, device: str,
                      cache_dir: str | Path | None) -> Any:
    return open_torch_bi_encoder(spec, path, device).to(_torch_dtype(spec, device))


def _torch_cross_encoder(spec: ModelSpec, path: Path, device: str,
                         cache_dir: str | Path | None) -> Any:
    return open_torch_cross_encoder(spec, path, device).to(_torch_dtype(spec, device))


def _onnx(spec: ModelSpec, path: Path, device: str,
          cache_dir: str | Path | None) -> Any:
    if BUILD_IN_CHILD:
        build_in_child(spec, path, cache_dir)
    return load_onnx(spec, path, cache_dir)


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


def load_encoder(spec: ModelSpec, device: str = "cpu",
                 cache_dir: str | Path | None = None) -> Encoder:
    """Load ``spec`` for ``device`` with the backend the spec names for that kind of pool.

    ``cache_dir`` holds ONNX builds and object-storage downloads (``model_cache.cache_root``
    when None). Every failure becomes ``ModelLoadFailed`` (HTTP 424) naming the model.
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    backend = backend_for(spec, device)
    try:
        if backend == "fake":
            return _fake(spec)
        if backend == "auto":
            return _load_auto(spec, device, cache_dir)
        path = resolve_source(spec, cache_dir)
        check_model_folder(spec, path)
        model = OPENERS[spec.kind, backend](spec, path, device, cache_dir)
        encoder = (_checked_bf16(spec, model, device) if backend == "torch-bf16"
                   else wrap(spec, model, device))
        encoder.backend = backend
        encoder.calibrate()
        return encoder
    except Exception as exc:
        raise as_load_failure(spec.id, exc, spec.source) from exc


def _load_auto(spec: ModelSpec, device: str, cache_dir: str | Path | None) -> Encoder:
    """``cpu_backend: auto``: the choice recorded for this model, candidate set, CPU,
    threads, libraries and guard (``blitz.loading.auto_cache``), else measured in a child
    process and recorded; then only the winner is opened, through ``load_encoder``."""
    threads = model_threads.count()  # what this process's models run with: the child too
    key, parts = choice_key(spec, resolve_source(spec, cache_dir), candidates(), threads)
    return load_auto(
        spec, lambda name: load_encoder(spec.model_copy(update={"cpu_backend": name}),
                                        device, cache_dir),
        chooser=lambda spec: choose_in_child(spec, cache_dir, threads),
        remember=lambda measure: remember_choice(spec, key, parts, measure, cache_dir))


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
