"""Opening a model on a backend: the loader's one opener, the last stage of a load.

``open_backend(load, path, backend)`` looks the (kind, backend) pair up in ``OPENERS``
and returns what that opener makes, an ``Encoder`` sized for the load's device, once it
has measured what it needs to size its micro-batches (``calibrate``):

    fake                      ``blitz.encoders.fake`` from the source's own parameters
    torch                     sentence-transformers in fp32 (a GPU: in ``spec.gpu_dtype``)
    torch-bf16                fp32 first, the accuracy guard's reference, then bf16
                              (``blitz.loading.accuracy``: refused when it strays)
    onnx, onnx-int8           built once in a child (export, quantization, accuracy
                              guard; ``blitz.loading.onnx_export``, a dual encoder's two
                              towers ``blitz.loading.dual_export``; cached), then opened
                              (not for an llm-reranker: its spec refuses them)
    (sparse, hybrid, vision-language and multi-vector models: torch and fake alone; dual-encoder
    models: no torch-bf16 nor auto; their specs refuse the others)

Nothing here fetches, trust-checks or chooses: the loader (``blitz.loading.load``) hands
this a folder it resolved and checked and a backend it named or ``auto`` chose. ``auto``'s
measurement (here or in its child) opens each candidate through this same function.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blitz.encoders.base import Encoder
from blitz.encoders.fake import FakeEncoder
from blitz.encoders.llm_reranker import open_llm_reranker
from blitz.encoders.sparse import open_hybrid
from blitz.encoders.st_models import (
    CPU_TOKEN_BUDGET,
    GPU_TOKEN_BUDGET,
    open_sparse,
    open_torch_bi_encoder,
    open_torch_cross_encoder,
    with_long_inputs,
    wrap,
)
from blitz.loading import accuracy
from blitz.loading.child_work import build_in_child
from blitz.loading.onnx_export import load_onnx
from blitz.runtime.cpu_features import cpu_supports_bf16
from blitz.settings.registry import ModelSpec

logger = logging.getLogger("blitz.encoders")

BUILD_IN_CHILD = True
"""ONNX builds run in a child process (``blitz.loading.child_work``) so that the loading process,
a long-lived replica or bulk actor, does not keep the export's memory."""


@dataclass(frozen=True)
class Load:
    """One load of ``spec`` for ``device``: what every stage of it reads, its deadline
    included (a child build or measurement is killed past it; ``blitz.runtime.child_process``)."""

    spec: ModelSpec
    device: str
    cache_dir: str | Path | None
    until: float  # time.monotonic() by which the load ends

    def time_left(self) -> float:
        return max(0.0, self.until - time.monotonic())


# (the spec as this backend opens it, weights directory (None: fake), the load) -> encoder
Opener = Callable[[ModelSpec, Any, Load], Encoder]


def open_backend(load: Load, path: Path | None, backend: str) -> Encoder:
    """``load.spec``'s model in ``path`` (resolved and checked; None for a fake source) on
    ``backend``: the one opener of a named backend and of each ``auto`` candidate."""
    spec = load.spec
    if spec.cpu_backend == "auto" and backend != "fake":  # a candidate: its own builds
        spec = spec.model_copy(update={"cpu_backend": backend})
    encoder = OPENERS[spec.kind, backend](spec, path, load)
    encoder.backend = backend
    encoder.calibrate()
    return encoder


def _fake(spec: ModelSpec, path: None, load: Load) -> Encoder:
    dimension, load_s, batch_s = spec.fake_params()
    time.sleep(load_s)  # a slow load, for fault tests (runs on a loader thread)
    return FakeEncoder(spec.id, dimension, spec.max_seq_length or 128, batch_s=batch_s,
                       batches_at_once=spec.fake_batches_at_once(), kind=spec.kind)


def _torch_bi_encoder(spec: ModelSpec, path: Path, load: Load) -> Encoder:
    dtype = _torch_dtype(spec, load.device)
    kwargs = gpu_model_kwargs(load.device, dtype)
    try:
        model = open_torch_bi_encoder(spec, path, load.device, kwargs)
    except (ImportError, ValueError) as exc:  # FlashAttention 2 refused for this family
        if "attn_implementation" not in kwargs:
            raise
        logger.warning("model %r: FlashAttention 2 refused (%s); loading with SDPA",
                       spec.id, exc)
        kwargs.pop("attn_implementation")
        model = open_torch_bi_encoder(spec, path, load.device, kwargs)
    return wrap(spec, model.to(dtype), load.device)


def gpu_model_kwargs(device: str, dtype: Any, flash_installed: bool | None = None
                     ) -> dict[str, Any]:
    """transformers' loading options for a bi-encoder on ``device``: none on a CPU (fp32,
    transformers' default attention: SDPA for every family it has SDPA for). On a GPU the
    weights load in their serving ``dtype``, never as an fp32 copy on the device first (an
    8B model's would need 32 GB), and in fp16/bf16 the attention is FlashAttention 2 where
    the ``flash_attn`` package is installed: it runs the batch's texts unpadded
    (variable-length kernels), so a length-mixed batch spends nothing on padding. Without it,
    SDPA (``plan_free_attention`` keeps it off cuDNN's per-shape plans)."""
    if not device.startswith("cuda"):
        return {}
    import torch

    kwargs: dict[str, Any] = {"dtype": dtype}
    if flash_installed is None:
        import importlib.util

        flash_installed = importlib.util.find_spec("flash_attn") is not None
    if flash_installed and dtype in (torch.float16, torch.bfloat16):
        kwargs["attn_implementation"] = "flash_attention_2"
    return kwargs


def _torch_cross_encoder(spec: ModelSpec, path: Path, load: Load) -> Encoder:
    model = open_torch_cross_encoder(spec, path, load.device).to(
        _torch_dtype(spec, load.device))
    return wrap(spec, model, load.device)


def _torch_sparse(spec: ModelSpec, path: Path, load: Load) -> Encoder:
    return with_long_inputs(open_sparse(spec, path, load.device,
                                        _torch_dtype(spec, load.device)), spec)


def _torch_hybrid(spec: ModelSpec, path: Path, load: Load) -> Encoder:
    return with_long_inputs(open_hybrid(
        spec.id, path, max_seq_length=spec.max_seq_length, device=load.device,
        dtype=_torch_dtype(spec, load.device),
        token_budget=CPU_TOKEN_BUDGET if load.device == "cpu" else GPU_TOKEN_BUDGET,
        trust_remote_code=spec.trust_remote_code), spec)


def _torch_llm_reranker(spec: ModelSpec, path: Path, load: Load) -> Encoder:
    return open_llm_reranker(spec, path, load.device, _torch_dtype(spec, load.device),
                             CPU_TOKEN_BUDGET if load.device == "cpu" else GPU_TOKEN_BUDGET)


def _bf16_llm_reranker(spec: ModelSpec, path: Path, load: Load) -> Encoder:
    """fp32 first, the guard's reference, then the same weights in bf16."""
    import torch

    encoder = open_llm_reranker(spec, path, load.device, torch.float32, CPU_TOKEN_BUDGET)
    reference = accuracy.probe(encoder)
    encoder.model = encoder.model.to(torch.bfloat16)
    report = accuracy.compare(spec.kind, reference, accuracy.probe(encoder))
    accuracy.enforce_accuracy(spec, "torch-bf16", report)
    return encoder


def _bf16(open_fp32: Callable[[ModelSpec, Path, str], Any]) -> Opener:
    def opener(spec: ModelSpec, path: Path, load: Load) -> Encoder:
        return _checked_bf16(spec, open_fp32(spec, path, load.device), load.device)
    return opener


def _onnx(spec: ModelSpec, path: Path, load: Load) -> Encoder:
    if BUILD_IN_CHILD:
        build_in_child(spec, path, load.cache_dir, timeout_s=load.time_left())
    return wrap(spec, load_onnx(spec, path, load.cache_dir), load.device)


def _torch_dual_encoder(spec: ModelSpec, path: Path, load: Load) -> Encoder:
    from blitz.images.dual_encoder import DualEncoder

    return DualEncoder(spec.id, path, load.device, spec.max_seq_length,
                       dtype=_torch_dtype(spec, load.device))


def _onnx_dual_encoder(spec: ModelSpec, path: Path, load: Load) -> Encoder:
    from blitz.loading.dual_export import load_dual_onnx

    if BUILD_IN_CHILD:
        build_in_child(spec, path, load.cache_dir, timeout_s=load.time_left())
    return load_dual_onnx(spec, path, load.cache_dir)


def _torch_vl_embedder(spec: ModelSpec, path: Path, load: Load) -> Encoder:
    from blitz.vision_language.embedder import open_vl_embedder

    return open_vl_embedder(spec, path, load.device, _torch_dtype(spec, load.device),
                            CPU_TOKEN_BUDGET if load.device == "cpu" else GPU_TOKEN_BUDGET)


def _torch_vl_reranker(spec: ModelSpec, path: Path, load: Load) -> Encoder:
    from blitz.vision_language.reranker import open_vl_reranker

    return open_vl_reranker(spec, path, load.device, _torch_dtype(spec, load.device),
                            CPU_TOKEN_BUDGET if load.device == "cpu" else GPU_TOKEN_BUDGET)


def _torch_colbert(spec: ModelSpec, path: Path, load: Load) -> Encoder:
    from blitz.encoders.colbert import open_colbert

    return open_colbert(spec.id, path, device=load.device,
                        dtype=_torch_dtype(spec, load.device),
                        token_budget=CPU_TOKEN_BUDGET if load.device == "cpu"
                        else GPU_TOKEN_BUDGET, max_seq_length=spec.max_seq_length,
                        trust_remote_code=spec.trust_remote_code)


def _torch_col_retriever(spec: ModelSpec, path: Path, load: Load) -> Encoder:
    from blitz.vision_language.retriever import open_col_retriever

    return open_col_retriever(spec.id, path, device=load.device,
                              dtype=_torch_dtype(spec, load.device),
                              token_budget=CPU_TOKEN_BUDGET if load.device == "cpu"
                              else GPU_TOKEN_BUDGET, max_seq_length=spec.max_seq_length,
                              trust_remote_code=spec.trust_remote_code)


OPENERS: dict[tuple[str, str], Opener] = {
    ("embedding", "fake"): _fake,
    ("embedding", "torch"): _torch_bi_encoder,
    ("embedding", "torch-bf16"): _bf16(open_torch_bi_encoder),
    ("embedding", "onnx"): _onnx,
    ("embedding", "onnx-int8"): _onnx,
    ("cross-encoder", "fake"): _fake,
    ("cross-encoder", "torch"): _torch_cross_encoder,
    ("cross-encoder", "torch-bf16"): _bf16(open_torch_cross_encoder),
    ("cross-encoder", "onnx"): _onnx,
    ("cross-encoder", "onnx-int8"): _onnx,
    ("classifier", "fake"): _fake,
    ("classifier", "torch"): _torch_cross_encoder,
    ("classifier", "torch-bf16"): _bf16(open_torch_cross_encoder),
    ("classifier", "onnx"): _onnx,
    ("classifier", "onnx-int8"): _onnx,
    ("sparse", "fake"): _fake,
    ("sparse", "torch"): _torch_sparse,
    ("hybrid", "fake"): _fake,
    ("hybrid", "torch"): _torch_hybrid,
    ("llm-reranker", "fake"): _fake,
    ("llm-reranker", "torch"): _torch_llm_reranker,
    ("llm-reranker", "torch-bf16"): _bf16_llm_reranker,
    ("dual-encoder", "fake"): _fake,
    ("dual-encoder", "torch"): _torch_dual_encoder,
    ("dual-encoder", "onnx"): _onnx_dual_encoder,
    ("dual-encoder", "onnx-int8"): _onnx_dual_encoder,
    ("vl-embedding", "fake"): _fake,
    ("vl-embedding", "torch"): _torch_vl_embedder,
    ("vl-reranker", "fake"): _fake,
    ("vl-reranker", "torch"): _torch_vl_reranker,
    ("multi-vector", "fake"): _fake,
    ("multi-vector", "torch"): _torch_colbert,
    ("vl-multi-vector", "fake"): _fake,
    ("vl-multi-vector", "torch"): _torch_col_retriever,
}


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
