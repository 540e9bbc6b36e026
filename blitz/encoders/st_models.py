"""sentence-transformers models, opened and wrapped: what the loader table
(``blitz.loading.load``) and the ONNX build (``blitz.loading.onnx_export``) share.

``open_*`` return the library's own model (torch, or with an ONNX graph in its
transformer's place, ``blitz.encoders.onnx_module``), or for an ONNX build verified for it, a ``NativeOnnxModel`` (onnxruntime and
``tokenizers`` alone, ``blitz.encoders.onnx_native``); ``wrap`` makes any of them an
``Encoder`` sized for the device it runs on.
Each passes ``spec.trust_remote_code`` on; the folder was checked before
(``blitz.loading.model_trust``), as sentence-transformers trusts any local folder's modules.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from blitz.encoders.base import Encoder
from blitz.encoders.bi_encoder import BiEncoder
from blitz.encoders.cross_encoder import ClassifierEncoder, CrossEncoderEncoder
from blitz.encoders.onnx_module import replace_transformer
from blitz.encoders.onnx_native import NativeOnnxModel, OnnxEncoder, open_native
from blitz.encoders.sentence_transformer import SentenceTransformerEncoder
from blitz.encoders.sparse import SparseEncoder
from blitz.runtime import model_threads
from blitz.settings.kinds import kind_of
from blitz.settings.registry import ModelSpec

if TYPE_CHECKING:
    from sentence_transformers import CrossEncoder, SentenceTransformer

# Tokens per micro-batch. On a CPU a small budget is fastest for short and long texts
# alike: a large one pads every text to the longest and leaves the CPU's caches
# (docs/benchmarks-history.md, "What was measured, adopted and rejected"). On a GPU,
# 65,536 tokens ran within 1% of 262,144's throughput with a quarter of its activation
# memory (docs/models.md, "Token budgets and memory"). A pool lowers either where its
# memory needs it, and a model's
# or pool's max_batch_tokens replaces it (blitz.pool.memory_budget).
CPU_TOKEN_BUDGET = 512
GPU_TOKEN_BUDGET = 65_536
# (query, document) pairs per cross-encoder forward pass
CPU_PAIRS_PER_BATCH = 32
GPU_PAIRS_PER_BATCH = 256


PER_ROW_BACKENDS = frozenset({"onnx-int8"})
"""Backends whose numbers depend on the batch (dynamic int8 quantization scales each call's
activations as a whole): each text runs alone, so its vector never depends on others."""


def wrap(spec: ModelSpec, model: Any, device: str) -> Encoder:
    """``spec``'s opened model as an ``Encoder`` with the batch sizes that suit ``device``."""
    return with_long_inputs(_wrap(spec, model, device), spec)


def with_long_inputs(encoder: Encoder, spec: ModelSpec) -> Encoder:
    """``encoder`` with ``spec``'s truncation_side, long_inputs and chunk_overlap, when it
    is a bi-encoder (dense, sparse or hybrid)."""
    if isinstance(encoder, BiEncoder):
        encoder.truncation_side = spec.truncation_side
        encoder.long_inputs, encoder.chunk_overlap = spec.long_inputs, spec.chunk_overlap
    return encoder


def _wrap(spec: ModelSpec, model: Any, device: str) -> Encoder:
    on_cpu = device == "cpu"
    rows_per_call = 1 if on_cpu and spec.cpu_backend in PER_ROW_BACKENDS else 0
    if isinstance(model, NativeOnnxModel):
        return OnnxEncoder(spec.id, model, max_seq_length=spec.max_seq_length,
                           token_budget=CPU_TOKEN_BUDGET, rows_per_call=rows_per_call)
    kind = kind_of(spec.kind)
    if kind.opens == "sequence-classification":  # a classifier's head answers labels
        headed = ClassifierEncoder if "classify" in kind.capabilities else CrossEncoderEncoder
        return headed(spec.id, model, max_seq_length=spec.max_seq_length,
                      batch_size=CPU_PAIRS_PER_BATCH if on_cpu else GPU_PAIRS_PER_BATCH)
    return SentenceTransformerEncoder(
        spec.id, model.eval(), max_seq_length=spec.max_seq_length,
        token_budget=CPU_TOKEN_BUDGET if on_cpu else GPU_TOKEN_BUDGET,
        rows_per_call=rows_per_call)


def open_torch_bi_encoder(spec: ModelSpec, path: Path, device: str = "cpu",
                          model_kwargs: dict[str, Any] | None = None) -> SentenceTransformer:
    """``spec``'s bi-encoder in torch: full precision, or as ``model_kwargs`` (passed to
    transformers' ``from_pretrained``: a GPU's dtype and attention) say."""
    model_threads.torch_module()  # torch runs the replica's thread count
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    if (path / "modules.json").exists():
        return SentenceTransformer(str(path), device=device, local_files_only=True,
                                   trust_remote_code=spec.trust_remote_code,
                                   model_kwargs=dict(model_kwargs or {}))
    # a plain transformers checkpoint: add the pooling the spec asks for
    word = Transformer(str(path), **transformer_trust(spec, model_kwargs))
    pool = Pooling(word.get_embedding_dimension(), spec.pooling or "mean")
    return SentenceTransformer(modules=[word, pool], device=device)


def open_torch_cross_encoder(spec: ModelSpec, path: Path, device: str = "cpu") -> CrossEncoder:
    """``spec``'s cross-encoder in torch, full precision."""
    model_threads.torch_module()
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(path), device=device, local_files_only=True,
                        trust_remote_code=spec.trust_remote_code)


def transformer_trust(spec: ModelSpec, model_kwargs: dict[str, Any] | None = None
                      ) -> dict[str, dict[str, Any]]:
    """A ``Transformer`` module's keyword arguments passing ``spec.trust_remote_code`` to
    each transformers loader (model, processor, config); ``model_kwargs`` added to the
    model's."""
    trust = {"trust_remote_code": spec.trust_remote_code}
    return {"model_kwargs": {**(model_kwargs or {}), **trust}, "processor_kwargs": trust,
            "config_kwargs": trust}


def open_onnx_file(spec: ModelSpec, source: Path, directory: Path, file_name: str, *,
                   native: bool = False) -> Any:
    """The ONNX graph ``directory/file_name`` (a build of ``spec`` from the folder
    ``source``) on onnxruntime (CPU): on its own when ``native`` (a build
    ``onnx_native.verify`` passed), else in the sentence-transformers model opened from
    ``source`` in the place of its transformer (``blitz.encoders.onnx_module``)."""
    if native:
        return open_native(directory, file_name)
    opened = (open_torch_cross_encoder if kind_of(spec.kind).opens == "sequence-classification"
              else open_torch_bi_encoder)
    return replace_transformer(opened(spec, source), directory / file_name)


def open_sparse(spec: ModelSpec, path: Path, device: str = "cpu",
                dtype: Any = None) -> SparseEncoder:
    """``spec``'s SPLADE model (a masked-language model) in torch, as a ``SparseEncoder``."""
    model_threads.torch_module()
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    trust = spec.trust_remote_code
    tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust)
    model = AutoModelForMaskedLM.from_pretrained(str(path), trust_remote_code=trust)
    model = model.to(device=device, **({"dtype": dtype} if dtype is not None else {})).eval()
    return SparseEncoder(spec.id, model, tokenizer, max_seq_length=spec.max_seq_length,
                         device=device,
                         token_budget=CPU_TOKEN_BUDGET if device == "cpu" else GPU_TOKEN_BUDGET)
