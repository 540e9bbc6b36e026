"""Encoders: one contract (``base.Encoder``), one backend per module, and a loader."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from blitz.encoders.base import Encoded, Encoder
from blitz.errors import BlitzError, ModelLoadFailed
from blitz.registry import ModelSpec, resolve_source

__all__ = ["Encoded", "Encoder", "load_encoder", "resolve_device"]
logger = logging.getLogger("blitz.encoders")


def resolve_device(requested: str) -> str:
    """``requested`` if it exists here; a pool that finds no CUDA falls back to CPU."""
    if requested.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            logger.warning("no CUDA device found: this %s pool runs on CPU instead", requested)
            return "cpu"
    return requested


def load_encoder(spec: ModelSpec, device: str = "cpu", cache_dir: str | Path | None = None,
                 token_budget: int | None = None) -> Encoder:
    """Load ``spec`` for ``device`` with the backend the spec names for that kind of pool.

    Every failure becomes ``ModelLoadFailed`` (HTTP 424) naming the model.
    """
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if spec.is_fake:
        from blitz.encoders.fake import FakeEncoder

        dimension, load_s = spec.fake_params()
        time.sleep(load_s)  # a slow load, for fault tests (runs on a loader thread)
        return FakeEncoder(spec.id, dimension, spec.max_seq_length or 128)
    try:
        path = resolve_source(spec, cache_dir)
        if spec.kind == "cross-encoder":
            return _load_cross_encoder(spec, path, device, cache_dir)
        return _load_bi_encoder(spec, path, device, cache_dir, token_budget)
    except BlitzError:
        raise
    except Exception as exc:
        raise ModelLoadFailed(
            f"model {spec.id!r} failed to load from {spec.source}: {type(exc).__name__}: {exc}"
        ) from exc


def _torch_dtype(spec: ModelSpec, device: str):
    import torch

    if device.startswith("cuda"):
        return {"float16": torch.float16, "bfloat16": torch.bfloat16,
                "float32": torch.float32}[spec.gpu_dtype]
    return torch.bfloat16 if spec.cpu_backend == "torch-bf16" else torch.float32


def _load_bi_encoder(spec: ModelSpec, path: Path, device: str, cache_dir, token_budget):
    from blitz import optimize
    from blitz.encoders.sentence_transformer import SentenceTransformerEncoder

    budget = token_budget or (optimize.CPU_TOKEN_BUDGET if device == "cpu" else 262_144)

    def wrap(model) -> SentenceTransformerEncoder:
        return SentenceTransformerEncoder(spec.id, model.eval(),
                                          max_seq_length=spec.max_seq_length,
                                          token_budget=budget)

    if device == "cpu" and spec.cpu_backend.startswith("onnx"):
        return wrap(optimize.load_onnx_sentence_transformer(spec, path, cache_dir))
    model = optimize.load_torch_sentence_transformer(spec, path, device)
    dtype = _torch_dtype(spec, device)
    if device == "cpu" and spec.cpu_backend == "torch-bf16":
        _warn_without_native_bf16(spec)
        reference = optimize.probe_embeddings(wrap(model))
        encoder = wrap(model.to(dtype))
        report = optimize.compare_embeddings(reference, optimize.probe_embeddings(encoder))
        optimize.enforce_accuracy(spec, "torch-bf16", report)
        return encoder
    return wrap(model.to(dtype))


def _load_cross_encoder(spec: ModelSpec, path: Path, device: str, cache_dir=None):
    from blitz import optimize
    from blitz.encoders.cross_encoder import CrossEncoderEncoder

    batch_size = 32 if device == "cpu" else 256

    def wrap(model) -> CrossEncoderEncoder:
        return CrossEncoderEncoder(spec.id, model, max_seq_length=spec.max_seq_length,
                                   batch_size=batch_size)

    if device == "cpu" and spec.cpu_backend.startswith("onnx"):
        return wrap(optimize.load_onnx_cross_encoder(spec, path, cache_dir))
    model = optimize.load_torch_cross_encoder(spec, path, device)
    dtype = _torch_dtype(spec, device)
    if device == "cpu" and spec.cpu_backend == "torch-bf16":
        _warn_without_native_bf16(spec)
        reference = optimize.probe_scores(wrap(model))
        model.model.to(dtype)
        encoder = wrap(model)
        report = optimize.compare_scores(reference, optimize.probe_scores(encoder))
        optimize.enforce_accuracy(spec, "torch-bf16", report)
        return encoder
    model.model.to(dtype)
    return wrap(model)


def _warn_without_native_bf16(spec: ModelSpec) -> None:
    from blitz.optimize import cpu_supports_bf16

    if not cpu_supports_bf16():
        logger.warning("model %r: this CPU has no native bf16 (avx512_bf16 or AMX); "
                       "torch-bf16 runs, but slower than fp32", spec.id)
