"""The accuracy guard: how closely a reduced-precision build follows torch fp32.

Every optimized build (ONNX fp32, ONNX int8, torch bf16) is compared with the
full-precision torch model on a fixed probe set (``blitz.encoders.probes``). Embeddings are
compared by cosine per probe sentence; cross-encoder scores by Pearson correlation per
probe query; a dual encoder's (CLIP, SigLIP) by cosine per probe sentence and per probe
image, each tower on its own (``compare_dual``). A build whose minimum falls below
``spec.accuracy_threshold`` is refused with ``AccuracyRefused``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from blitz.encoders.base import l2_normalize
from blitz.encoders.probes import PROBE_QUERIES, PROBE_TEXTS
from blitz.errors import LoadProblem
from blitz.settings.kinds import kind_of
from blitz.settings.registry import ModelSpec

if TYPE_CHECKING:
    from blitz.encoders.base import Encoder
    from blitz.images.dual_encoder import DualEncoderBase


class AccuracyRefused(LoadProblem):
    """A build strays from torch fp32 further than the spec's ``accuracy_threshold``."""


@dataclass(frozen=True)
class AccuracyReport:
    """How closely an optimized model follows torch fp32 on the probe set."""

    metric: str  # "cosine" per probe sentence, or "pearson" per probe query
    minimum: float
    mean: float
    probes: int
    subject: str = ""  # what the probes were, when not the probe sentences or queries

    def passes(self, threshold: float) -> bool:
        """Whether the minimum meets ``threshold``; a threshold of 0 turns the check off."""
        return threshold <= 0 or self.minimum >= threshold

    def describe(self) -> str:
        """The numbers, cut (not rounded) to 4 decimals: 0.99997 must not read as 1.0000."""
        unit = self.subject or ("probe sentences" if self.metric == "cosine"
                                else "probe queries")
        return (f"min {self.metric} {cut(self.minimum)}, mean {cut(self.mean)} "
                f"over {self.probes} {unit} vs torch fp32")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> AccuracyReport:
        return cls(str(value["metric"]), float(value["minimum"]), float(value["mean"]),
                   int(value["probes"]), str(value.get("subject", "")))


def cut(value: float) -> str:
    """``value`` with 4 decimals, cut rather than rounded."""
    return f"{math.floor(value * 10_000) / 10_000:.4f}"


def probe(encoder: Encoder) -> np.ndarray:
    """``encoder``'s answers on the probe set: normalized embeddings of the probe sentences,
    or a cross-encoder's scores of every probe sentence for each probe query
    (queries, sentences)."""
    answers = kind_of(encoder.kind).answers
    if answers == "scores":
        return np.stack([encoder.score(query, list(PROBE_TEXTS)).values
                         for query in PROBE_QUERIES])
    if answers == "labels":  # (labels, sentences): each label's logits over the set
        logits = encoder.classify([[t] for t in PROBE_TEXTS]).values
        return np.ascontiguousarray(logits.T)
    return encoder.embed(list(PROBE_TEXTS), normalize=True).values


def probe_dual(encoder: DualEncoderBase) -> tuple[np.ndarray, np.ndarray]:
    """A dual encoder's normalized vectors of the probe sentences and of the probe images
    (``blitz.images.onnx_dual.probe_images``)."""
    from blitz.images.onnx_dual import probe_images

    return (encoder.embed(list(PROBE_TEXTS), normalize=True).values,
            encoder.embed_images(probe_images(), normalize=True).values)


def compare_dual(reference: tuple[np.ndarray, np.ndarray],
                 candidate: tuple[np.ndarray, np.ndarray]) -> AccuracyReport:
    """How closely a dual encoder's towers follow the reference's (both from
    ``probe_dual``): the report of the tower that strays further."""
    reports = [replace(compare_embeddings(want, got), subject=f"probe {subject}")
               for want, got, subject in zip(reference, candidate, ("texts", "images"),
                                             strict=True)]
    return min(reports, key=lambda report: report.minimum)


def compare(kind: str, reference: np.ndarray, candidate: np.ndarray) -> AccuracyReport:
    """How closely ``candidate``'s probe answers follow ``reference``'s (both from ``probe``)."""
    if kind_of(kind).answers != "vectors":
        return compare_scores(reference, candidate)
    return compare_embeddings(reference, candidate)


def compare_embeddings(reference: np.ndarray, candidate: np.ndarray) -> AccuracyReport:
    """Cosine of each candidate row with its reference row."""
    cosine = np.sum(l2_normalize(reference).astype(np.float64) * l2_normalize(candidate), axis=1)
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
        raise AccuracyRefused(
            f"model {spec.id!r}: the {backend} build is not accurate enough to serve: "
            f"{report.describe()} is below accuracy_threshold {threshold}; use a more precise "
            "cpu_backend ('onnx' or 'torch') or lower accuracy_threshold")
