"""``cpu_backend: auto``'s choice, measured once and kept in the model cache.

Measuring (every candidate opened and timed, ``blitz.loading.auto``) costs seconds at
each replica start, and its answer changes only when something it depends on does. So
the choice is a model cache entry (``blitz.sources.model_cache``) beside the ONNX builds::

    <root>/auto-choice/<model>-auto-<digest>/blitz-entry.json

keyed (``choice_key``) by all that would change the answer: the model (source, the
fingerprint of its files, kind, pooling, max_seq_length), the candidate backends, the
CPU (``blitz.runtime.cpu_features.cpu_identity``: model, instruction-set flags, usable cores),
the intra-op threads, the library versions (torch, onnxruntime, ...: the ONNX builds'
own), the accuracy guard (threshold, probe set) and how the measurement is taken. The
record holds the choice (``AutoChoice``: the winner, texts/s per backend and call size,
the dropped ones and why), when it was measured, and the key's parts.

A start whose key has a finished record reuses it and times nothing; the loader then
opens only the winner. Otherwise the choice is measured under the entry's lock and
written as every entry is (a temporary directory renamed into place), so replicas
starting together on one node measure once: the others wait and reuse it. A record that
is not well formed, or was written for other parts, is logged, discarded and measured
again. To measure again by hand, delete the entry (its path is logged) or the whole
``auto-choice`` folder; the next start measures and writes it anew.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from blitz.encoders.probes import PROBE_QUERIES, PROBE_TEXTS
from blitz.loading.auto import (
    LARGE_TEXTS,
    MEASURE_ROUNDS,
    MEASURE_SECONDS,
    SMALL_TEXTS,
    AutoChoice,
    RememberedChoice,
)
from blitz.runtime.cpu_features import cpu_identity
from blitz.settings.registry import ModelSpec
from blitz.sources import model_cache

logger = logging.getLogger("blitz.encoders.auto")

AREA = "auto-choice"
CACHE_FORMAT = 1  # bump when what is measured, or how the record reads, changes
RECORD_FIELDS: model_cache.Fields = {"choice": dict, "parts": dict, "created": (int, float)}
Measure = Callable[[], AutoChoice]


def choice_key(spec: ModelSpec, path: Path, backends: Sequence[str], threads: int, *,
               seconds: float = MEASURE_SECONDS) -> tuple[str, dict[str, Any]]:
    """The cache key of ``spec``'s choice among ``backends`` with its files at ``path`` and
    ``threads`` intra-op threads, timed for ``seconds`` per candidate; and its parts."""
    from blitz.loading.onnx_export import CACHE_FORMAT as BUILD_FORMAT

    probes = hashlib.sha256("\n".join((*PROBE_TEXTS, "", *PROBE_QUERIES)).encode())
    parts = {
        "format": CACHE_FORMAT, "builds": BUILD_FORMAT,
        "kind": spec.kind, "source": spec.source,
        "files": model_cache.directory_fingerprint(path), "pooling": spec.pooling,
        "max_seq_length": spec.max_seq_length,
        "candidates": list(backends), "cpu": cpu_identity(), "threads": threads,
        "versions": model_cache.library_versions(),
        "guard": {"threshold": spec.accuracy_threshold, "probes": probes.hexdigest()[:16]},
        "measure": {"sizes": [SMALL_TEXTS, LARGE_TEXTS], "seconds": seconds,
                    "rounds": MEASURE_ROUNDS},
    }
    name = PurePosixPath(spec.location().rest.rstrip("/")).name or "model"
    return model_cache.entry_key(f"{name}-auto", parts), parts


def remember_choice(spec: ModelSpec, key: str, parts: dict[str, Any], measure: Measure,
                    cache_dir: str | Path | None = None, *,
                    lock_timeout: float | None = None) -> RememberedChoice:
    """The choice recorded under ``key``, or ``measure()``'s, recorded there now.

    ``measure`` runs only when no usable record is found (under the entry's lock); what it
    raises propagates and nothing is recorded.
    """
    measured: list[AutoChoice] = []

    def build(tmp: Path) -> dict[str, Any]:
        measured.append(measure())
        return {"model_id": spec.id, "parts": parts, "choice": measured[-1].to_dict()}

    def check(entry: model_cache.CacheEntry) -> None:
        recorded_choice(entry.meta, parts)

    entry = model_cache.get_or_build(model_cache.cache_root(cache_dir), AREA, key, build,
                                     validate=check, fields=RECORD_FIELDS,
                                     lock_timeout=lock_timeout, model=spec.id)
    how: Literal["cached", "measured"] = "measured" if entry.built else "cached"
    return RememberedChoice(recorded_choice(entry.meta, parts), how,
                            float(entry.meta["created"]), entry.path)


def recorded_choice(meta: dict[str, Any], parts: dict[str, Any]) -> AutoChoice:
    """The choice a record holds; ``ValueError`` unless it is well formed, was measured
    for ``parts`` and chose one of the measured candidates."""
    if _canonical(meta["parts"]) != _canonical(parts):
        raise ValueError("it was measured for other parts than its key's")
    value = meta["choice"]
    chosen, rates, dropped = value.get("chosen"), value.get("rates"), value.get("dropped", {})
    candidates = parts["candidates"]
    if not isinstance(rates, dict) or not isinstance(dropped, dict) or chosen not in rates:
        raise ValueError("it holds no valid choice")
    for backend, by_size in rates.items():
        if backend not in candidates or not isinstance(by_size, dict) or not by_size:
            raise ValueError(f"it holds no valid rates for {backend!r}")
        for rate in by_size.values():
            if not isinstance(rate, int | float) or isinstance(rate, bool) or not (
                    math.isfinite(rate) and rate >= 0):
                raise ValueError(f"it holds no valid rates for {backend!r}")
    if not all(isinstance(b, str) and isinstance(why, str) for b, why in dropped.items()):
        raise ValueError("it holds no valid list of dropped backends")
    in_order = {b: rates[b] for b in candidates if b in rates}  # JSON sorted them
    return AutoChoice.from_dict({**value, "rates": in_order})


def _canonical(parts: dict[str, Any]) -> str:
    """``parts`` as the record stores them (JSON: tuples read back as lists)."""
    return json.dumps(parts, sort_keys=True, default=str)
