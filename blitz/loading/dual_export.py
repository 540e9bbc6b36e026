"""ONNX builds of a dual encoder (CLIP, SigLIP): both towers exported, int8 on request,
checked by the accuracy guard, cached.

Like the other ONNX builds (``blitz.loading.onnx_export``, whose cache key, int8 recipes
and quantizer this shares), a build is made once per (source files, backend,
quantization, library versions) into the model cache, in a child process when the loader
asks for one (``blitz.loading.child_work``), and its accuracy is recorded in the entry: a
cached build is not checked again, and one that failed the guard is never served.

The guard runs torch fp32 (``blitz.images.dual_encoder.DualEncoder``) and the build on the
probe sentences and the probe images (``blitz.loading.accuracy.probe_dual``), each tower
on its own; the report is the tower that strays further. int8 is onnxruntime's dynamic
quantization of each tower's weights; its recipes go from fast to conservative and the
first that meets the threshold is kept.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from blitz.images.dual_encoder import DualEncoder
from blitz.images.onnx_dual import OnnxDualEncoder, export_towers
from blitz.loading.accuracy import AccuracyReport, compare_dual, cut, enforce_accuracy, probe_dual
from blitz.loading.model_trust import check_model_folder
from blitz.loading.onnx_export import (
    AREA,
    INT8_RECIPES,
    onnx_cache_key,
    quantize_int8,
    recorded_accuracy,
    weight_matmuls,
)
from blitz.settings.registry import ModelSpec
from blitz.sources import model_cache

logger = logging.getLogger("blitz.onnx_export")

Progress = Callable[[str], None]
# what a cached build's record must hold for ``prepare_dual_onnx`` to read it
RECORD_FIELDS: model_cache.Fields = {
    "text_file": str, "image_file": str, "accuracy": dict, "int8_recipe": (str, type(None)),
    "build_seconds": (int, float)}


def prepare_dual_onnx(spec: ModelSpec, path: Path, cache_dir: str | Path | None = None,
                      progress: Progress | None = None, *, lock_timeout: float | None = None,
                      validate: Callable[[model_cache.CacheEntry], object] | None = None
                      ) -> model_cache.CacheEntry:
    """Export (and quantize) ``spec``'s towers into the cache, or find them there; enforce
    the accuracy recorded with them (``AccuracyRefused``). ``path`` is refused first if it
    would run its own code. A cached build is checked before it is used (its record, its
    files, ``validate(entry)`` when given and the build passes the guard); one that fails
    is rebuilt once. What the export raises propagates."""
    check_model_folder(spec, path)
    key, parts = onnx_cache_key(spec, path)
    quantization = parts["quantization"]
    say = progress or (lambda stage: logger.info("model %r: %s", spec.id, stage))

    def build(tmp: Path) -> dict[str, Any]:
        text_file, image_file, report, recipe = _build(spec, path, tmp, quantization, say)
        return {**parts, "model_id": spec.id, "text_file": text_file,
                "image_file": image_file, "int8_recipe": recipe, "accuracy": report.to_dict()}

    def check(entry: model_cache.CacheEntry) -> None:
        for name in (entry.meta["text_file"], entry.meta["image_file"]):
            # contents lists the build's files, each checked to lie inside the entry
            if name not in entry.meta["contents"]:
                raise ValueError(f"its graph {name!r} is not one of the files it was built with")
        report = recorded_accuracy(entry.meta)
        if validate is not None and report.passes(spec.accuracy_threshold):
            validate(entry)  # a build that will be refused is not opened

    entry = model_cache.get_or_build(model_cache.cache_root(cache_dir), AREA, key, build,
                                     validate=check, fields=RECORD_FIELDS,
                                     lock_timeout=lock_timeout, model=spec.id)
    if not entry.built:
        logger.info("model %r: %s build found in the cache at %s", spec.id, spec.cpu_backend,
                    entry.path)
    recipe = entry.meta.get("int8_recipe")
    described = (f"{spec.cpu_backend} ({quantization}, {recipe})" if quantization
                 else spec.cpu_backend)
    enforce_accuracy(spec, described, AccuracyReport.from_dict(entry.meta["accuracy"]))
    return entry


def load_dual_onnx(spec: ModelSpec, path: Path, cache_dir: str | Path | None = None, *,
                   lock_timeout: float | None = None) -> OnnxDualEncoder:
    """``spec``'s ONNX build, prepared and cached, opened on onnxruntime (CPU) with the
    tokenizer and image processor of ``path``. A cached build that cannot be opened is
    rebuilt once."""
    opened: list[OnnxDualEncoder] = []
    prepare_dual_onnx(spec, path, cache_dir, lock_timeout=lock_timeout,
                      validate=lambda entry: opened.append(_open(spec, path, entry)))
    return opened[-1]


def _open(spec: ModelSpec, path: Path, entry: model_cache.CacheEntry) -> OnnxDualEncoder:
    return OnnxDualEncoder(spec.id, path, entry.path, str(entry.meta["text_file"]),
                           str(entry.meta["image_file"]), spec.max_seq_length)


def _build(spec: ModelSpec, path: Path, tmp: Path, quantization: str | None,
           say: Progress) -> tuple[str, str, AccuracyReport, str | None]:
    """Fill ``tmp`` with the build; returns its two graphs, accuracy and int8 recipe."""
    reference = DualEncoder(spec.id, path, "cpu", spec.max_seq_length)
    say("exporting the text and vision towers to ONNX")
    graphs = export_towers(reference, tmp)
    say("running torch fp32 on the probe sentences and images")
    expected = probe_dual(reference)
    reference.close()
    if not quantization:
        say("checking accuracy against torch fp32")
        return *graphs, _accuracy(spec, path, tmp, graphs, expected), None

    text, image = (f"onnx/{Path(name).stem}_qint8_{quantization}.onnx" for name in graphs)
    quantized = (text, image)
    weights = [weight_matmuls(tmp / name) for name in graphs]
    note = ""
    for recipe in INT8_RECIPES:
        say(f"quantizing both towers to int8 for {quantization}: {recipe.description}{note}")
        for name, target, tower in zip(graphs, quantized, weights, strict=True):
            quantize_int8(tmp / name, tmp / target, quantization, recipe.excluded(tower))
        say("checking accuracy against torch fp32")
        report = _accuracy(spec, path, tmp, quantized, expected)
        if report.passes(spec.accuracy_threshold) or recipe is INT8_RECIPES[-1]:
            break
        note = (f" (with {recipe.description}: min {report.metric} {cut(report.minimum)} "
                f"< {spec.accuracy_threshold})")
    for name in graphs:  # the int8 entry keeps only the int8 graphs
        (tmp / name).unlink()
    return *quantized, report, recipe.name


def _accuracy(spec: ModelSpec, path: Path, directory: Path, graphs: tuple[str, str],
              expected: tuple[Any, Any]) -> AccuracyReport:
    encoder = OnnxDualEncoder(spec.id, path, directory, graphs[0], graphs[1],
                              spec.max_seq_length)
    try:
        return compare_dual(expected, probe_dual(encoder))
    finally:
        encoder.close()

