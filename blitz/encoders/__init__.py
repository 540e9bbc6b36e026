"""Encoders: one contract (``base.Encoder``), one backend per module, and a loader."""

from __future__ import annotations

import logging
import os
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

        return FakeEncoder(spec.id, int(spec.source[5:]), spec.max_seq_length or 128)
    try:
        path = resolve_source(spec, cache_dir)
        if spec.kind == "cross-encoder":
            return _load_cross_encoder(spec, path, device)
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
    from sentence_transformers import SentenceTransformer, models

    from blitz.encoders.sentence_transformer import SentenceTransformerEncoder

    if device == "cpu" and spec.cpu_backend.startswith("onnx"):
        from blitz.optimize import load_onnx_sentence_transformer

        model = load_onnx_sentence_transformer(spec, path, cache_dir)
    elif (path / "modules.json").exists():
        model = SentenceTransformer(str(path), device=device, local_files_only=True)
    else:  # a plain transformers checkpoint: add the pooling the spec asks for
        word = models.Transformer(str(path))
        pool = models.Pooling(word.get_word_embedding_dimension(), spec.pooling or "mean")
        model = SentenceTransformer(modules=[word, pool], device=device)
    dtype = _torch_dtype(spec, device)
    if not spec.cpu_backend.startswith("onnx") or device != "cpu":
        model = model.to(dtype)
    model.eval()
    budget = token_budget or (8192 if device == "cpu" else 262_144)
    return SentenceTransformerEncoder(spec.id, model, max_seq_length=spec.max_seq_length,
                                      token_budget=budget)


def _load_cross_encoder(spec: ModelSpec, path: Path, device: str):
    from sentence_transformers import CrossEncoder

    from blitz.encoders.cross_encoder import CrossEncoderEncoder

    model = CrossEncoder(str(path), device=device, local_files_only=True)
    dtype = _torch_dtype(spec, device)
    model.model.to(dtype)
    return CrossEncoderEncoder(spec.id, model, max_seq_length=spec.max_seq_length,
                               batch_size=32 if device == "cpu" else 256)
