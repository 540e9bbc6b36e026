"""ONNX builds for the CPU pool: export, dynamic int8 quantization, and their cache entry.

A build is prepared once per (source files, backend, quantization, library versions)
into the model cache (``blitz.sources.model_cache``, area ``optimized``): the transformer's
graph (``blitz.loading.graph_export``, torch's exporter) beside the model's folder less its
weights. A bi-encoder build that ``blitz.encoders.onnx_native.verify`` finds equal both ways
is opened on onnxruntime and ``tokenizers`` alone (no torch in the process); any other runs
in the sentence-transformers model with the graph in its transformer's place
(``blitz.encoders.onnx_module``), so the encoders call it exactly as they call a torch
model: ``model(features)["sentence_embedding"]`` or ``predict``. The verdict is recorded in
the entry (``native``, ``native_note``).

int8 builds are dynamic quantizations of the weights (per channel, configured for this
CPU's instructions, ``blitz.runtime.cpu_features.quantization_target``) after onnxruntime's
transformer fusions. Recipes go from fast to conservative (``INT8_RECIPES``); the first
whose accuracy meets the spec's threshold is kept.

Every build is checked against torch fp32 by the accuracy guard (``blitz.loading.accuracy``)
while it is built. The numbers are recorded in the cache entry, so a cached build is not
checked again on each load, and one that failed is never served (unless its threshold
is lowered). A cached entry is used only when its record is complete (``RECORD_FIELDS``,
a well-formed accuracy report), its graph is one of the files it was built with, and the
folder names no code of its own (``blitz.loading.model_trust``); otherwise it is rebuilt.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from blitz.encoders.bi_encoder import BiEncoder
from blitz.encoders.onnx_native import verify
from blitz.encoders.st_models import (
    open_onnx_file,
    open_torch_bi_encoder,
    open_torch_cross_encoder,
    wrap,
)
from blitz.loading.accuracy import AccuracyReport, compare, cut, enforce_accuracy, probe
from blitz.loading.facts import read_config
from blitz.loading.graph_export import export_transformer
from blitz.loading.model_trust import check_model_folder
from blitz.runtime.cpu_features import quantization_target
from blitz.settings.kinds import kind_of
from blitz.settings.registry import ModelSpec
from blitz.sources import model_cache

logger = logging.getLogger("blitz.onnx_export")

AREA = "optimized"
CACHE_FORMAT = 5  # bump when how entries are built, laid out or checked changes
ONNX_FILE = "onnx/model.onnx"
# the transformer's weights, which a build's folder leaves to its graph (``_save_folder``)
WEIGHT_FILES = ("model.safetensors", "model-*-of-*.safetensors", "model.safetensors.index.json",
                "pytorch_model*.bin", "pytorch_model.bin.index.json")
Progress = Callable[[str], None]
# what a cached build's record must hold for ``prepare_onnx`` to read it
RECORD_FIELDS: model_cache.Fields = {
    "file_name": str, "accuracy": dict, "int8_recipe": (str, type(None)),
    "build_seconds": (int, float), "native": bool}


@dataclass(frozen=True)
class PreparedModel:
    """An ONNX build in the cache, ready to open."""

    path: Path
    file_name: str  # relative to ``path``, e.g. onnx/model_qint8_avx512_vnni.onnx
    backend: str
    quantization: str | None
    int8_recipe: str | None  # which weights are int8 (see INT8_RECIPES)
    accuracy: AccuracyReport
    built: bool  # True when this call built it
    build_seconds: float
    native_note: str | None = None  # why it runs through sentence-transformers; None: it does not


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
    label = f"{_source_name(spec)}-{backend}" + (f"-{quantization}" if quantization else "")
    return model_cache.entry_key(label, parts), parts


def prepare_onnx(spec: ModelSpec, path: Path, cache_dir: str | Path | None = None,
                 progress: Progress | None = None, *, lock_timeout: float | None = None,
                 validate: Callable[[Path, str, bool], object] | None = None) -> PreparedModel:
    """Export (and quantize) ``spec`` into the cache, or find it there; enforce its accuracy.

    ``path`` is refused first if it would run its own code (``blitz.loading.model_trust``). A
    cached build is checked before it is used: its record, its files' sizes, the trust
    check on its folder, and ``validate(directory, file_name, native)`` when given
    (``load_onnx`` opens the model with it). A build that fails is rebuilt once
    (``model_cache.get_or_build``). ``lock_timeout`` bounds the wait for another process
    building the same entry (``model_cache.LOCK_TIMEOUT_S`` by default). What the export
    raises propagates.
    """
    check_model_folder(spec, path)
    key, parts = onnx_cache_key(spec, path)
    backend, quantization = spec.cpu_backend, parts["quantization"]
    say = progress or (lambda stage: logger.info("model %r: %s", spec.id, stage))

    def build(tmp: Path) -> dict[str, Any]:
        file_name, report, recipe = _build_onnx(spec, path, tmp, quantization, say)
        note = (_native_verdict(spec, path, tmp, file_name, say)
                if report.passes(spec.accuracy_threshold) else "refused by the accuracy guard")
        return {**parts, "model_id": spec.id, "file_name": file_name, "int8_recipe": recipe,
                "accuracy": report.to_dict(), "native": note is None, "native_note": note}

    def check(entry: model_cache.CacheEntry) -> None:
        file_name = entry.meta["file_name"]  # RECORD_FIELDS: a str
        # contents lists the build's files, each checked to lie inside the entry
        if file_name not in entry.meta["contents"]:
            raise ValueError(f"its graph {file_name!r} is not one of the files it was built with")
        report = recorded_accuracy(entry.meta)
        check_model_folder(spec, entry.path)
        if validate is not None and report.passes(spec.accuracy_threshold):
            # a build that will be refused is not opened
            validate(entry.path, file_name, entry.meta["native"])

    entry = model_cache.get_or_build(model_cache.cache_root(cache_dir), AREA, key, build,
                                     validate=check, fields=RECORD_FIELDS,
                                     lock_timeout=lock_timeout, model=spec.id)
    report = AccuracyReport.from_dict(entry.meta["accuracy"])
    prepared = PreparedModel(entry.path, str(entry.meta["file_name"]), backend, quantization,
                             entry.meta.get("int8_recipe"), report, entry.built,
                             float(entry.meta.get("build_seconds", 0.0)),
                             None if entry.meta["native"] else str(entry.meta.get("native_note")))
    if not entry.built:
        logger.info("model %r: %s build found in the cache at %s", spec.id, backend, entry.path)
    described = f"{backend} ({quantization}, {prepared.int8_recipe})" if quantization else backend
    enforce_accuracy(spec, described, report)
    if not entry.meta["native"]:
        logger.info("model %r: the %s build runs through sentence-transformers (torch "
                    "imported): %s", spec.id, backend, entry.meta.get("native_note"))
    return prepared


def load_onnx(spec: ModelSpec, path: Path, cache_dir: str | Path | None = None, *,
              lock_timeout: float | None = None) -> Any:
    """``spec``'s ONNX build, prepared and cached, opened on onnxruntime (CPU): on its own
    where the build was verified for it, else as a sentence-transformers model. A cached
    build that cannot be opened (a truncated graph, say) is rebuilt once, and the model
    opened then is the one returned."""
    opened: list[Any] = []
    prepare_onnx(spec, path, cache_dir, lock_timeout=lock_timeout,
                 validate=lambda directory, file_name, native: opened.append(
                     open_onnx_file(spec, path, directory, file_name, native=native)))
    return opened[-1]


def _native_verdict(spec: ModelSpec, path: Path, directory: Path, file_name: str,
                    say: Progress) -> str | None:
    """None when the build runs on onnxruntime alone exactly as through
    sentence-transformers (``onnx_native.verify``), else why not."""
    if kind_of(spec.kind).opens != "sentence-transformers":
        return f"a {spec.kind} runs through sentence-transformers"
    say("checking the build on onnxruntime alone against sentence-transformers")
    reference = wrap(spec, open_onnx_file(spec, path, directory, file_name), "cpu")
    assert isinstance(reference, BiEncoder)  # an embedding model's encoder
    try:
        return verify(reference, directory, file_name)
    finally:
        reference.close()


def _build_onnx(spec: ModelSpec, path: Path, tmp: Path, quantization: str | None,
                say: Progress) -> tuple[str, AccuracyReport, str | None]:
    """Fill ``tmp`` with the ONNX build; returns its file, accuracy and int8 recipe."""
    say("running torch fp32 on the probe set")
    headed = _headed(spec)
    torch_model = (open_torch_cross_encoder if headed else open_torch_bi_encoder)(spec, path)
    reference = _probe(spec, torch_model)
    say("exporting to ONNX")
    _export_onnx(spec, torch_model, tmp)
    del torch_model
    if not quantization:
        say("checking accuracy against torch fp32")
        return ONNX_FILE, _accuracy(spec, reference, path, tmp, ONNX_FILE), None

    file_name = f"onnx/model_qint8_{quantization}.onnx"
    say("fusing attention, layer norm and GELU for int8")
    graph = fuse_transformer_ops(tmp / ONNX_FILE, tmp / "onnx" / "fused.onnx")
    weights = weight_matmuls(graph)
    note = ""
    for recipe in INT8_RECIPES:
        say(f"quantizing to int8 for {quantization}: {recipe.description}{note}")
        quantize_int8(graph, tmp / file_name, quantization, recipe.excluded(weights))
        say("checking accuracy against torch fp32")
        report = _accuracy(spec, reference, path, tmp, file_name)
        if report.passes(spec.accuracy_threshold) or recipe is INT8_RECIPES[-1]:
            break
        note = (f" (with {recipe.description}: min {report.metric} {cut(report.minimum)} "
                f"< {spec.accuracy_threshold})")
    for leftover in {graph, tmp / ONNX_FILE}:  # the int8 entry keeps only the int8 graph
        leftover.unlink()
    return file_name, report, recipe.name


def _export_onnx(spec: ModelSpec, model: Any, tmp: Path) -> None:
    """``model`` (``spec``'s, torch) into ``tmp``: its transformer as the graph
    (``ONNX_FILE``, ``blitz.loading.graph_export``), and its folder (modules, tokenizer,
    configs) beside it less the transformer's weights: the graph holds them, and a build
    that runs through sentence-transformers opens the model's own folder
    (``open_onnx_file``)."""
    headed = _headed(spec)
    export_transformer(model[0].model, model[0].tokenizer, tmp / ONNX_FILE,
                       output="logits" if headed else "last_hidden_state", pairs=headed)
    model.save_pretrained(str(tmp))
    for pattern in WEIGHT_FILES:
        for file in tmp.glob(pattern):
            file.unlink()


def _probe(spec: ModelSpec, model: Any) -> np.ndarray:
    """``model``'s probe answers, run as the CPU pool runs it; the encoder is closed after."""
    encoder = wrap(spec, model, "cpu")
    try:
        return probe(encoder)
    finally:
        encoder.close()


def _accuracy(spec: ModelSpec, reference: np.ndarray, path: Path, directory: Path,
              file_name: str) -> AccuracyReport:
    return compare(spec.kind, reference,
                   _probe(spec, open_onnx_file(spec, path, directory, file_name)))


def recorded_accuracy(meta: dict[str, Any]) -> AccuracyReport:
    """The accuracy report a cache record holds; ``ValueError`` unless it is well formed."""
    value = meta["accuracy"]

    def number(name: str) -> bool:
        return isinstance(value.get(name), int | float) and not isinstance(value.get(name), bool)

    if (value.get("metric") not in ("cosine", "pearson") or not number("minimum")
            or not number("mean") or not number("probes")
            or not float(value["probes"]).is_integer()):
        raise ValueError(f"{model_cache.ENTRY_FILE} holds no valid accuracy report")
    return AccuracyReport.from_dict(value)


def _source_name(spec: ModelSpec) -> str:
    return PurePosixPath(spec.location().rest.rstrip("/")).name or "model"


# --- export -----------------------------------------------------------------------------

def _headed(spec: ModelSpec) -> bool:
    """Whether ``spec``'s model is a sequence-classification head (a ``CrossEncoder``)."""
    return kind_of(spec.kind).opens == "sequence-classification"


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

    onnxruntime's quantizer logs a line per tensor (and advice) on the root logger, and
    its tools warn of what they deprecate. Logger filters apply
    to records of that very logger only, hence one per module.
    """
    quiet = [(logging.getLogger(), _DropBelow(logging.ERROR, "onnxruntime"))]
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
    config = read_config(source.parent.parent)  # the build folder's config.json
    fusable = config.get("model_type") in _FUSABLE
    heads, width = config.get("num_attention_heads", config.get("n_heads")), config.get(
        "hidden_size", config.get("dim"))
    if (not fusable or not isinstance(heads, int) or not isinstance(width, int)
            or (source.parent / f"{source.name}_data").exists()):
        return source
    from onnxruntime.transformers.optimizer import optimize_model

    try:
        with _quiet_export():
            fused = optimize_model(str(source), model_type="bert", num_heads=heads,
                                   hidden_size=width, opt_level=0)
            fused.save_model_to_file(str(target))
    except Exception as exc:  # the unfused graph is still correct, only slower
        logger.warning("transformer fusion failed (%s: %s); quantizing the unfused graph",
                       type(exc).__name__, exc)
        return source
    return target


# Dynamic int8 for each CPU (quantization_target): weights per channel and symmetric,
# activations asymmetric, full range; unsigned weights where the CPU's int8 kernels want
# them (AVX2 without VNNI). These are the values optimum's AutoQuantizationConfig gave
# (optimum 2.1, is_static=False), which Blitz used until it dropped optimum.
INT8_WEIGHTS = {"arm64": "QInt8", "avx2": "QUInt8", "avx512": "QInt8", "avx512_vnni": "QInt8"}


def quantize_int8(source: Path, target: Path, cpu: str, exclude: list[str]) -> None:
    """Dynamic int8 quantization of ``source``'s weights for ``cpu`` (see quantization_target
    and ``INT8_WEIGHTS``), but the nodes named in ``exclude``."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with _quiet_export():
        quantize_dynamic(
            source, target, op_types_to_quantize=["MatMul", "Attention"],
            per_channel=True, reduce_range=False, weight_type=QuantType[INT8_WEIGHTS[cpu]],
            nodes_to_exclude=exclude,
            use_external_data_format=(source.parent / f"{source.name}_data").exists(),
            extra_options={"MatMulConstBOnly": True, "DefaultTensorType": onnx.TensorProto.FLOAT,
                           "WeightSymmetric": True, "ActivationSymmetric": False},
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
