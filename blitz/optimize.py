"""Optimized CPU backends: ONNX export, dynamic int8 quantization, bf16, and their guard.

ONNX models are prepared once per (source files, backend, quantization, library
versions) into the model cache (``blitz.model_cache``, area ``optimized``) and loaded
through sentence-transformers' own ONNX backend, so the encoders call them exactly as
they call a torch model: ``model(features)["sentence_embedding"]`` or ``predict``.

int8 builds are dynamic quantizations of the weights (per channel, configured for this
CPU's instructions: avx512_vnni, avx512, avx2 or arm64) after onnxruntime's transformer
fusions. Recipes go from fast to conservative (``INT8_RECIPES``); the first whose
accuracy meets the spec's threshold is kept.

The accuracy guard: every prepared model is compared with the full-precision torch
model on a fixed probe set (``blitz.probes``). Embeddings are compared by cosine per
probe sentence; cross-encoder scores by Pearson correlation per probe query. A model
whose minimum falls below ``spec.accuracy_threshold`` is refused with
``ModelLoadFailed``. The numbers are recorded in the cache entry, so a cached model is
not checked again on each load, and one that failed is never served (unless its
threshold is lowered).
"""

from __future__ import annotations

import contextlib
import logging
import math
import platform
import re
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from blitz import model_cache
from blitz.errors import ModelLoadFailed
from blitz.probes import PROBE_QUERIES, PROBE_TEXTS
from blitz.registry import ModelSpec

if TYPE_CHECKING:
    from sentence_transformers import CrossEncoder, SentenceTransformer

    from blitz.encoders.base import Encoder

logger = logging.getLogger("blitz.optimize")

AREA = "optimized"
CACHE_FORMAT = 3  # bump when how entries are built, laid out or checked changes
ONNX_FILE = "onnx/model.onnx"
# Tokens per micro-batch on CPU (the guard probes with what the CPU pool runs). ~512
# measured fastest on a 2-core Xeon, short and long texts alike; 8192 was 2.5x slower
# at 128 texts/call (padding to the longest text, cache misses).
CPU_TOKEN_BUDGET = 512
Progress = Callable[[str], None]


# --- the CPU ---------------------------------------------------------------------------

@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU feature flags (``/proc/cpuinfo`` flags on x86, Features on ARM)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    match = re.search(r"^(?:flags|Features)\s*:\s*(.*)$", text, re.MULTILINE)
    return frozenset(match.group(1).split()) if match else frozenset()


def quantization_target(flags: frozenset[str] | None = None,
                        machine: str | None = None) -> str:
    """The int8 quantization config that suits this CPU, best first.

    ``avx512_vnni`` (and AVX-VNNI) has int8 dot-product instructions; ``avx512`` and
    ``avx2`` use reduced-range weights; ARM gets ``arm64``. An x86 CPU older than AVX2
    gets ``avx2`` too: onnxruntime still runs it, only without the fast kernels.
    """
    flags = cpu_flags() if flags is None else flags
    machine = (machine or platform.machine()).lower()
    if machine in ("arm64", "aarch64") or machine.startswith("armv8"):
        return "arm64"
    if "avx512_vnni" in flags or "avx512vnni" in flags:
        return "avx512_vnni"
    if "avx512f" in flags and "avx512bw" in flags:
        return "avx512"
    return "avx2"


def cpu_supports_bf16(flags: frozenset[str] | None = None) -> bool:
    """Whether the CPU computes bf16 natively (AVX512-BF16, AMX, or ARM BF16)."""
    flags = cpu_flags() if flags is None else flags
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


# --- the accuracy guard -----------------------------------------------------------------

@dataclass(frozen=True)
class AccuracyReport:
    """How closely an optimized model follows torch fp32 on the probe set."""

    metric: str  # "cosine" per probe sentence, or "pearson" per probe query
    minimum: float
    mean: float
    probes: int

    def passes(self, threshold: float) -> bool:
        """Whether the minimum meets ``threshold``; a threshold of 0 turns the check off."""
        return threshold <= 0 or self.minimum >= threshold

    def describe(self) -> str:
        """The numbers, cut (not rounded) to 4 decimals: 0.99997 must not read as 1.0000."""
        unit = "sentences" if self.metric == "cosine" else "queries"
        return (f"min {self.metric} {_cut(self.minimum)}, mean {_cut(self.mean)} "
                f"over {self.probes} probe {unit} vs torch fp32")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> AccuracyReport:
        return cls(str(value["metric"]), float(value["minimum"]), float(value["mean"]),
                   int(value["probes"]))


def _cut(value: float) -> str:
    return f"{math.floor(value * 10_000) / 10_000:.4f}"


def probe_embeddings(encoder: Encoder) -> np.ndarray:
    """Normalized embeddings of the probe sentences."""
    return encoder.embed(list(PROBE_TEXTS), normalize=True).values


def probe_scores(encoder: Encoder) -> np.ndarray:
    """Scores of every probe sentence for each probe query: (queries, sentences)."""
    return np.stack([encoder.score(query, list(PROBE_TEXTS)).values for query in PROBE_QUERIES])


def compare_embeddings(reference: np.ndarray, candidate: np.ndarray) -> AccuracyReport:
    """Cosine of each candidate row with its reference row."""
    ref = reference / np.maximum(np.linalg.norm(reference, axis=1, keepdims=True), 1e-12)
    cand = candidate / np.maximum(np.linalg.norm(candidate, axis=1, keepdims=True), 1e-12)
    cosine = np.sum(ref.astype(np.float64) * cand, axis=1)
    return AccuracyReport("cosine", float(cosine.min()), float(cosine.mean()), len(cosine))


def compare_scores(reference: np.ndarray, candidate: np.ndarray) -> AccuracyReport:
    """Pearson correlation of the candidate's scores with the reference's, per query row."""
    ref = reference - reference.mean(axis=1, keepdims=True)
    cand = candidate - candidate.mean(axis=1, keepdims=True)
    spread = np.linalg.norm(ref, axis=1) * np.linalg.norm(cand, axis=1)
    same = np.all(np.isclose(reference, candidate, atol=1e-3), axis=1)
    r = np.sum(ref * cand, axis=1) / np.maximum(spread, 1e-12)
    r = np.where(spread < 1e-12, same.astype(np.float64), r)  # a constant row: equal or not
    return AccuracyReport("pearson", float(r.min()), float(r.mean()), len(r))


def enforce_accuracy(spec: ModelSpec, backend: str, report: AccuracyReport) -> None:
    """Refuse to serve a model whose probe accuracy is below the spec's threshold."""
    threshold = spec.accuracy_threshold
    if not report.passes(threshold):
        raise ModelLoadFailed(
            f"model {spec.id!r}: the {backend} build is not accurate enough to serve: "
            f"{report.describe()} is below accuracy_threshold {threshold}; use a more precise "
            "cpu_backend ('onnx' or 'torch') or lower accuracy_threshold", model=spec.id,
        )


# --- torch loaders (the reference the guard compares with) ----------------------------

def load_torch_sentence_transformer(spec: ModelSpec, path: Path,
                                    device: str = "cpu") -> SentenceTransformer:
    """``spec``'s bi-encoder in torch, full precision, as the torch backend serves it."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    if (path / "modules.json").exists():
        return SentenceTransformer(str(path), device=device, local_files_only=True)
    # a plain transformers checkpoint: add the pooling the spec asks for
    word = Transformer(str(path))
    pool = Pooling(word.get_embedding_dimension(), spec.pooling or "mean")
    return SentenceTransformer(modules=[word, pool], device=device)


def load_torch_cross_encoder(spec: ModelSpec, path: Path, device: str = "cpu") -> CrossEncoder:
    """``spec``'s cross-encoder in torch, full precision."""
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(path), device=device, local_files_only=True)


# --- ONNX -------------------------------------------------------------------------------

@dataclass(frozen=True)
class PreparedModel:
    """An ONNX build in the cache, ready to load."""

    path: Path
    file_name: str  # relative to ``path``, e.g. onnx/model_qint8_avx512_vnni.onnx
    backend: str
    quantization: str | None
    int8_recipe: str | None  # which weights are int8 (see INT8_RECIPES)
    accuracy: AccuracyReport
    built: bool  # True when this call built it
    build_seconds: float


def onnx_cache_key(spec: ModelSpec, path: Path) -> tuple[str, dict[str, Any]]:
    """The cache key of ``spec``'s ONNX build from the files at ``path``, and what it covers."""
    backend = spec.cpu_backend
    if not backend.startswith("onnx"):
        raise ValueError(f"model {spec.id!r} has cpu_backend {backend!r}, not an ONNX one")
    quantization = quantization_target() if backend == "onnx-int8" else None
    parts = {
        "format": CACHE_FORMAT, "kind": spec.kind, "source": spec.source,
        "files": model_cache.directory_fingerprint(path), "pooling": spec.pooling,
        "backend": backend, "quantization": quantization,
        "versions": model_cache.library_versions(),
        # the int8 recipe is the first that meets the threshold, so it is part of the key
        "threshold": spec.accuracy_threshold if quantization else None,
    }
    label = f"{_source_name(spec.source)}-{backend}" + (f"-{quantization}" if quantization else "")
    return model_cache.entry_key(label, parts), parts


def prepare_onnx(spec: ModelSpec, path: Path, cache_dir: str | Path | None = None,
                 progress: Progress | None = None, *, lock_timeout: float | None = None,
                 validate: Callable[[Path, str], object] | None = None) -> PreparedModel:
    """Export (and quantize) ``spec`` into the cache, or find it there; enforce its accuracy.

    A cached build is checked before it is used: its metadata, its files' sizes, and
    ``validate(directory, file_name)`` when given (the loaders open the model with it).
    A build that fails is rebuilt once (``model_cache.get_or_build``). ``lock_timeout``
    bounds the wait for another process building the same entry
    (``model_cache.LOCK_TIMEOUT_S`` by default).
    """
    key, parts = onnx_cache_key(spec, path)
    backend, quantization = spec.cpu_backend, parts["quantization"]
    root = model_cache.cache_root(cache_dir)
    say = progress or (lambda stage: logger.info("model %r: %s", spec.id, stage))

    def build(tmp: Path) -> dict[str, Any]:
        file_name, report, recipe = _build_onnx(spec, path, tmp, quantization, say)
        return {**parts, "model_id": spec.id, "file_name": file_name, "int8_recipe": recipe,
                "accuracy": report.to_dict()}

    def check(entry: model_cache.CacheEntry) -> None:
        file_name = str(entry.meta["file_name"])
        report = AccuracyReport.from_dict(entry.meta["accuracy"])
        if not (entry.path / file_name).is_file():
            raise FileNotFoundError(f"{file_name} is missing")
        if validate is not None and report.passes(spec.accuracy_threshold):
            validate(entry.path, file_name)  # a build that will be refused is not opened

    try:
        entry = model_cache.get_or_build(root, AREA, key, build, validate=check,
                                         lock_timeout=lock_timeout, model=spec.id)
    except ModelLoadFailed:
        raise
    except Exception as exc:
        raise ModelLoadFailed(
            f"model {spec.id!r}: preparing the {backend} build failed: {type(exc).__name__}: {exc}",
            model=spec.id,
        ) from exc
    report = AccuracyReport.from_dict(entry.meta["accuracy"])
    prepared = PreparedModel(entry.path, str(entry.meta["file_name"]), backend, quantization,
                             entry.meta.get("int8_recipe"), report, entry.built,
                             float(entry.meta.get("build_seconds", 0.0)))
    if not entry.built:
        logger.info("model %r: %s build found in the cache at %s", spec.id, backend, entry.path)
    enforce_accuracy(spec, _describe_backend(backend, quantization, prepared.int8_recipe),
                     report)
    return prepared


def load_onnx_sentence_transformer(spec: ModelSpec, path: Path,
                                   cache_dir: str | Path | None = None, *,
                                   lock_timeout: float | None = None) -> SentenceTransformer:
    """``spec`` as a sentence-transformers model on onnxruntime (CPU), prepared and cached."""
    return _load_onnx(spec, path, cache_dir, lock_timeout)


def load_onnx_cross_encoder(spec: ModelSpec, path: Path, cache_dir: str | Path | None = None, *,
                            lock_timeout: float | None = None) -> CrossEncoder:
    """``spec`` as a sentence-transformers ``CrossEncoder`` on onnxruntime (CPU), cached."""
    return _load_onnx(spec, path, cache_dir, lock_timeout)


def _load_onnx(spec: ModelSpec, path: Path, cache_dir: str | Path | None,
               lock_timeout: float | None) -> Any:
    """Prepare ``spec``'s ONNX build and open it; a cached build that cannot be opened
    (a truncated graph, say) is rebuilt once, and the model opened then is the one served."""
    opened: list[Any] = []
    prepare_onnx(spec, path, cache_dir, lock_timeout=lock_timeout,
                 validate=lambda directory, file_name: opened.append(
                     _open_onnx(spec, directory, file_name)))
    return opened[-1]


def onnx_model_kwargs(file_name: str | None = None) -> dict[str, Any]:
    """onnxruntime session settings: CPU provider, as many intra-op threads as torch uses.

    A pool sets torch's thread count per replica before it loads models; ONNX models
    follow it, so both backends use the same cores. Threads do not spin while idle: a
    replica holds several models, and spinning threads of one slow down the others.
    """
    import onnxruntime as ort
    import torch

    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.inter_op_num_threads = 1
    # idle onnxruntime threads spin by default, starving torch models in the same replica
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    kwargs: dict[str, Any] = {"provider": "CPUExecutionProvider", "session_options": options}
    if file_name:
        kwargs["file_name"] = file_name
    return kwargs


def _open_onnx(spec: ModelSpec, directory: Path, file_name: str) -> Any:
    from sentence_transformers import CrossEncoder, SentenceTransformer

    kwargs = onnx_model_kwargs(file_name)
    if spec.kind == "cross-encoder":
        return CrossEncoder(str(directory), backend="onnx", device="cpu", local_files_only=True,
                            model_kwargs=kwargs)
    return SentenceTransformer(str(directory), backend="onnx", device="cpu",
                               local_files_only=True, model_kwargs=kwargs)


def _export_onnx(spec: ModelSpec, path: Path) -> Any:
    """The model exported to ONNX by optimum (in memory; ``save_pretrained`` writes it)."""
    from sentence_transformers import CrossEncoder, SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    kwargs = {**onnx_model_kwargs(), "export": True}
    with _quiet_export():
        if spec.kind == "cross-encoder":
            return CrossEncoder(str(path), backend="onnx", device="cpu", local_files_only=True,
                                model_kwargs=kwargs)
        if (path / "modules.json").exists():
            return SentenceTransformer(str(path), backend="onnx", device="cpu",
                                       local_files_only=True, model_kwargs=kwargs)
        word = Transformer(str(path), backend="onnx", model_kwargs=kwargs)
        pool = Pooling(word.get_embedding_dimension(), spec.pooling or "mean")
        return SentenceTransformer(modules=[word, pool], device="cpu")


class _DropBelow(logging.Filter):
    """Drops records under ``level`` (from modules whose path contains ``origin``)."""

    def __init__(self, level: int, origin: str = ""):
        super().__init__()
        self.level, self.origin = level, origin

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.level or self.origin not in record.pathname


@contextlib.contextmanager
def _quiet_export() -> Iterator[None]:
    """Silence the export's noise that does not apply here.

    sentence-transformers warns that the export should be saved (we save it), transformers
    that optimum passes ``torch_dtype``, the tracer about constants, and onnxruntime's
    quantizer logs a line per tensor (and advice) on the root logger. Logger filters apply to records
    of that very logger only, hence one per module.
    """
    quiet = [(logging.getLogger(name), _DropBelow(logging.ERROR)) for name in
             ("sentence_transformers.backend.utils", "transformers.configuration_utils")]
    quiet.append((logging.getLogger(), _DropBelow(logging.ERROR, "onnxruntime")))
    for logger_, drop in quiet:
        logger_.addFilter(drop)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning)
            warnings.filterwarnings("ignore", message=".*trace.*")
            yield
    finally:
        for logger_, drop in quiet:
            logger_.removeFilter(drop)


def _build_onnx(spec: ModelSpec, path: Path, tmp: Path, quantization: str | None,
                say: Progress) -> tuple[str, AccuracyReport, str | None]:
    """Fill ``tmp`` with the ONNX build; returns its file, accuracy and int8 recipe."""
    say("exporting to ONNX")
    model = _export_onnx(spec, path)
    model.save_pretrained(str(tmp))
    del model
    say("running torch fp32 on the probe set")
    reference = _probe(spec, _torch_encoder(spec, path))
    if not quantization:
        say("checking accuracy against torch fp32")
        return ONNX_FILE, _probe_report(spec, reference, tmp, ONNX_FILE), None

    file_name = f"onnx/model_qint8_{quantization}.onnx"
    say("fusing attention, layer norm and GELU for int8")
    graph = fuse_transformer_ops(tmp / ONNX_FILE, tmp / "onnx" / "fused.onnx")
    weights = weight_matmuls(graph)
    note = ""
    for recipe in INT8_RECIPES:
        say(f"quantizing to int8 for {quantization}: {recipe.description}{note}")
        quantize_int8(graph, tmp / file_name, quantization, recipe.excluded(weights))
        say("checking accuracy against torch fp32")
        report = _probe_report(spec, reference, tmp, file_name)
        if report.passes(spec.accuracy_threshold) or recipe is INT8_RECIPES[-1]:
            break
        note = (f" (with {recipe.description}: min {report.metric} {_cut(report.minimum)} "
                f"< {spec.accuracy_threshold})")
    for leftover in {graph, tmp / ONNX_FILE}:  # the int8 entry keeps only the int8 graph
        leftover.unlink()
    return file_name, report, recipe.name


# --- int8 -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Int8Recipe:
    """Which weights of the graph are quantized to int8 (dynamic quantization).

    Only weights are quantized: MatMuls with a constant second input and the fused
    Attention's QKV projection. The activation-by-activation MatMuls inside attention,
    the embeddings (Gather) and Transpose, which onnxruntime would quantize by default,
    stay in fp32: quantizing them costs accuracy and, on these models, speed.
    """

    name: str
    description: str
    keep_expanding: bool  # keep the expanding MatMuls (FFN up-projections) in fp32

    def excluded(self, weights: list[tuple[str, int, int]]) -> list[str]:
        return [name for name, rows, cols in weights if self.keep_expanding and cols > rows]


INT8_RECIPES = (
    Int8Recipe("linear", "every linear layer", keep_expanding=False),
    Int8Recipe("linear-but-ffn-up", "linear layers but the FFN up-projections",
               keep_expanding=True),
)
_FUSABLE = {"bert", "roberta", "xlm-roberta", "camembert", "distilbert", "electra"}


def fuse_transformer_ops(source: Path, target: Path) -> Path:
    """``source`` with onnxruntime's transformer fusions applied, written to ``target``.

    Fusing before quantizing lets the Attention op run its QKV projection in int8 as one
    kernel; the unfused int8 graph defeats onnxruntime's own run-time fusions. Returns
    ``source`` itself when the architecture is not one the fusions know, or they fail.
    """
    import json

    config = source.parent.parent / "config.json"
    model_type = json.loads(config.read_text()).get("model_type") if config.exists() else None
    if model_type not in _FUSABLE or (source.parent / f"{source.name}_data").exists():
        return source
    from onnxruntime.transformers.optimizer import optimize_model

    try:
        with _quiet_export():
            fused = optimize_model(str(source), model_type="bert", num_heads=0, hidden_size=0,
                                   opt_level=0)
            fused.save_model_to_file(str(target))
    except Exception as exc:  # the unfused graph is still correct, only slower
        logger.warning("transformer fusion failed (%s: %s); quantizing the unfused graph",
                       type(exc).__name__, exc)
        return source
    return target


def quantize_int8(source: Path, target: Path, cpu: str, exclude: list[str]) -> None:
    """Dynamic int8 quantization of ``source``'s weights for ``cpu`` (see quantization_target).

    Weight type, symmetry and per-channel scales follow optimum's configuration for that
    CPU (``AutoQuantizationConfig.<cpu>``).
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from optimum.onnxruntime.configuration import AutoQuantizationConfig

    config = getattr(AutoQuantizationConfig, cpu)(is_static=False)
    with _quiet_export():
        quantize_dynamic(
            source, target, op_types_to_quantize=["MatMul", "Attention"],
            per_channel=config.per_channel, reduce_range=config.reduce_range,
            weight_type=QuantType.QUInt8 if config.weights_dtype == QuantType.QUInt8
            else QuantType.QInt8,
            nodes_to_exclude=exclude,
            use_external_data_format=(source.parent / f"{source.name}_data").exists(),
            extra_options={"MatMulConstBOnly": True, "DefaultTensorType": onnx.TensorProto.FLOAT,
                           "WeightSymmetric": config.weights_symmetric,
                           "ActivationSymmetric": config.activations_symmetric},
        )


def weight_matmuls(onnx_file: Path) -> list[tuple[str, int, int]]:
    """(node name, rows, columns) of every MatMul whose second input is a 2-D weight."""
    import onnx

    graph = onnx.load(str(onnx_file), load_external_data=False).graph
    shapes = {init.name: tuple(init.dims) for init in graph.initializer}
    found = []
    for node in graph.node:
        shape = shapes.get(node.input[1]) if node.op_type == "MatMul" else None
        if shape is not None and len(shape) == 2:
            found.append((node.name, int(shape[0]), int(shape[1])))
    return found


# --- probing ----------------------------------------------------------------------------

def _torch_encoder(spec: ModelSpec, path: Path) -> Encoder:
    return _wrap(spec, load_torch_cross_encoder(spec, path) if spec.kind == "cross-encoder"
                 else load_torch_sentence_transformer(spec, path))


def _wrap(spec: ModelSpec, model: Any) -> Encoder:
    from blitz.encoders.cross_encoder import CrossEncoderEncoder
    from blitz.encoders.sentence_transformer import SentenceTransformerEncoder

    if spec.kind == "cross-encoder":
        return CrossEncoderEncoder(spec.id, model, max_seq_length=spec.max_seq_length)
    return SentenceTransformerEncoder(spec.id, model.eval(), max_seq_length=spec.max_seq_length,
                                      token_budget=CPU_TOKEN_BUDGET)


def _probe(spec: ModelSpec, encoder: Encoder) -> np.ndarray:
    try:
        return probe_scores(encoder) if spec.kind == "cross-encoder" else probe_embeddings(encoder)
    finally:
        encoder.close()


def _probe_report(spec: ModelSpec, reference: np.ndarray, directory: Path,
                  file_name: str) -> AccuracyReport:
    candidate = _probe(spec, _wrap(spec, _open_onnx(spec, directory, file_name)))
    if spec.kind == "cross-encoder":
        return compare_scores(reference, candidate)
    return compare_embeddings(reference, candidate)


def _describe_backend(backend: str, quantization: str | None, recipe: str | None) -> str:
    return f"{backend} ({quantization}, {recipe})" if quantization else backend


def _source_name(source: str) -> str:
    name = source.rstrip("/").rsplit("/", 1)[-1]
    return name.split(":", 1)[-1] or "model"


# --- speed ---------------------------------------------------------------------------

def measure_throughput(encoder: Encoder, texts: list[str], batch_size: int, *,
                       min_seconds: float = 1.0, min_calls: int = 3) -> float:
    """Texts per second through ``encoder`` in calls of ``batch_size`` texts (in process).

    One warm-up call first; then calls until both ``min_calls`` and ``min_seconds`` are met.
    Cross-encoders score ``batch_size`` documents against one query per call.
    """
    def call(start: int) -> None:
        batch = [texts[(start + i) % len(texts)] for i in range(batch_size)]
        if encoder.kind == "cross-encoder":
            encoder.score(texts[start % len(texts)], batch)
        else:
            encoder.embed(batch, normalize=True)

    call(0)
    calls, began = 0, time.perf_counter()
    while True:
        call(calls * batch_size)
        calls += 1
        elapsed = time.perf_counter() - began
        if calls >= min_calls and elapsed >= min_seconds:
            return calls * batch_size / elapsed


def compare_throughput(encoders: dict[str, Encoder], texts: list[str], batch_size: int, *,
                       rounds: int = 3, seconds: float = 0.5) -> dict[str, float]:
    """Best texts/s of each encoder over ``rounds`` interleaved runs.

    Interleaving and keeping the best run make ratios between encoders hold up on a
    machine where other work comes and goes.
    """
    best = dict.fromkeys(encoders, 0.0)
    for _ in range(rounds):
        for name, encoder in encoders.items():
            rate = measure_throughput(encoder, texts, batch_size, min_seconds=seconds)
            best[name] = max(best[name], rate)
    return best
