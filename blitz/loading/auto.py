"""``cpu_backend: auto``: the fastest accurate CPU backend for a model, chosen once and
recorded.

The first time a model loads on a machine, every candidate backend is opened through the
loader's one opener (``blitz.loading.opening.open_backend``, so each meets the same
accuracy guard as when named explicitly; one that fails is dropped), timed on the probe
set at ``SMALL_TEXTS`` and at ``LARGE_TEXTS`` texts per call, and only the winner stays
resident. The choice is a model cache entry (``blitz.sources.model_cache``) beside the
ONNX builds, ``<root>/auto-choice/<model>-auto-<digest>/blitz-entry.json``, keyed
(``choice_key``) by all that would change the answer: the model (source, the fingerprint
of its files, kind, pooling, max_seq_length), the candidates, the CPU
(``cpu_identity``: model, instruction-set flags, usable cores), the intra-op threads, the
library versions, the accuracy guard and how the measurement is taken. A later load with
the same key reuses it, timing nothing:

    load_auto(spec, open_backend, folder, chooser, ...)
      -> remember_choice(...)             the record under choice_key(...), else measure:
      -> chooser(spec)                    loading.child_work: measure_choice in a child process
         or measure_choice(...)           (here, when there is no chooser or it failed):
           -> candidates()                torch, torch-bf16 (native bf16 only), onnx, onnx-int8
           -> open_backend(name) for each guard failures and load errors drop the candidate
           -> measure_rates(...)          texts/s per (backend, texts per call), injectable timer
           -> choose(...)                 the best over both sizes
      -> open_backend(winner)             in the child's case: only the winner is opened here

Replicas starting together on one node measure once (the entry's lock): the others wait
and reuse the record. A record that is not well formed, or was written for other parts,
is logged, discarded and measured again; to measure again by hand, delete the entry (its
path is logged) or the whole ``auto-choice`` folder.

One backend serves every call: a model id has one numeric path, so a text gets the same
vector whether it arrives alone or inside a large batch (two winners, one per micro-batch
size, gave one id two encodings where they differed, e.g. bf16 and int8 on a CPU with
AMX). The choice is logged (``cached choice`` or ``measured``), the loaded encoder's
``backend`` (shown in the pool's stats) reads ``auto(<winner>)`` and its ``auto_choice``
holds the rates, how it was chosen and when it was measured.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from blitz.encoders.base import Encoder
from blitz.encoders.bi_encoder import BiEncoder
from blitz.encoders.probes import PROBE_QUERIES, PROBE_TEXTS
from blitz.runtime import malloc
from blitz.runtime.cpu_features import cpu_identity, cpu_supports_bf16
from blitz.settings.registry import ModelSpec
from blitz.sources import model_cache

logger = logging.getLogger("blitz.encoders")

SMALL_TEXTS = 1  # texts per call for the small measurement: one request of one text
LARGE_TEXTS = 32  # texts per call for the large one: enough to fill token-budget micro-batches
MEASURE_SECONDS = 1.5  # timed seconds per candidate, both sizes and all rounds together
MEASURE_ROUNDS = 2  # interleaved rounds; the best rate of each is kept
MAX_CALLS_PER_SLOT = 10_000  # bounds a slot whatever the timer says

Timer = Callable[[], float]
# (backend, texts per call, offset into the probe set) -> one timed call
RunCall = Callable[[str, int, int], object]


def candidates(native_bf16: bool | None = None) -> list[str]:
    """The backends ``auto`` tries, in order of preference on a tie."""
    bf16 = cpu_supports_bf16() if native_bf16 is None else native_bf16
    return ["torch", *(["torch-bf16"] if bf16 else []), "onnx", "onnx-int8"]


def measure_rates(run: RunCall, backends: Sequence[str], sizes: Sequence[int], *,
                  seconds: float = MEASURE_SECONDS, rounds: int = MEASURE_ROUNDS,
                  timer: Timer = time.perf_counter) -> dict[str, dict[int, float]]:
    """Texts/s of each backend at each call size: ``{backend: {texts per call: rate}}``.

    Each backend gets ``seconds`` of timed calls in all, shared evenly among its sizes
    and ``rounds`` interleaved rounds (so a burst of other work on the machine does not
    hit one backend only); the best round is kept. Every (backend, size) makes one
    untimed warm-up call first and at least one timed call per round.
    """
    slot = seconds / (len(sizes) * rounds)
    best = {backend: dict.fromkeys(sizes, 0.0) for backend in backends}
    for round_ in range(rounds):
        for backend in backends:
            for size in sizes:
                if round_ == 0:
                    run(backend, size, 0)
                calls, began = 0, timer()
                while True:
                    run(backend, size, calls * size)
                    calls += 1
                    elapsed = timer() - began
                    if elapsed >= slot or calls >= MAX_CALLS_PER_SLOT:
                        break
                rate = calls * size / max(elapsed, 1e-9)
                best[backend][size] = max(best[backend][size], rate)
    return best


@dataclass(frozen=True)
class AutoChoice:
    """What ``auto`` measured and chose."""

    chosen: str
    rates: dict[str, dict[int, float]]  # texts/s per backend per texts per call
    dropped: dict[str, str] = field(default_factory=dict)  # backend -> why

    @property
    def backend(self) -> str:
        return f"auto({self.chosen})"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, fields: dict[str, Any]) -> AutoChoice:
        """The choice ``to_dict`` gave, read back from JSON (call sizes as strings)."""
        rates = {backend: {int(size): float(rate) for size, rate in by_size.items()}
                 for backend, by_size in fields["rates"].items()}
        return cls(str(fields["chosen"]), rates, dict(fields.get("dropped", {})))

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> AutoChoice:
        return cls.from_dict(json.loads(text))

    def table(self) -> str:
        sizes = sorted(next(iter(self.rates.values()), {}))
        lines = [f"{b}: " + ", ".join(f"{r[s]:.0f}/s at {s}" for s in sizes)
                 for b, r in self.rates.items()]
        lines += [f"{b}: dropped ({why})" for b, why in self.dropped.items()]
        return "; ".join(lines)


def choose(rates: dict[str, dict[int, float]],
           dropped: dict[str, str] | None = None) -> AutoChoice:
    """The one backend with the best geometric mean, over the measured call sizes, of its
    rate relative to the fastest at that size; the first listed wins a tie."""
    sizes = sorted(next(iter(rates.values())))
    best = {size: max(r[size] for r in rates.values()) or 1.0 for size in sizes}

    def score(backend: str) -> float:
        return math.prod(rates[backend][size] / best[size] for size in sizes)

    return AutoChoice(max(rates, key=score), rates, dropped or {})


def return_freed_memory() -> None:
    """Collect, then hand freed heap pages back to the OS (glibc's ``malloc_trim``): the
    closed candidates' weights otherwise stay in this process's resident memory (~100-200
    MiB for MiniLM's three losers)."""
    gc.collect()
    malloc.trim()


@dataclass(frozen=True)
class RememberedChoice:
    """A choice and where it came from: ``cached`` (a record) or ``measured`` (just now)."""

    choice: AutoChoice
    how: Literal["cached", "measured"]
    measured_at: float  # seconds since the epoch
    record: Path | None = None  # the cache entry that holds it

    @property
    def measured_on(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.measured_at))

    def summary(self) -> dict[str, Any]:
        """What a pool's ``stats()`` shows of it (``Encoder.auto_choice``)."""
        return {"chosen": self.choice.chosen, "how": self.how, "measured_at": self.measured_on,
                "rates": self.choice.rates, "dropped": self.choice.dropped}


Chooser = Callable[[ModelSpec], "AutoChoice | None"]
"""Measures and chooses elsewhere (``blitz.loading.child_work.choose_in_child``); None when that
failed and the choice is to be measured here."""
Measure = Callable[[], AutoChoice]

AREA = "auto-choice"
CACHE_FORMAT = 1  # bump when what is measured, or how the record reads, changes
RECORD_FIELDS: model_cache.Fields = {"choice": dict, "parts": dict, "created": (int, float)}


def measure_choice(spec: ModelSpec, open_backend: Callable[[str], Encoder], *,
                   backends: Sequence[str] | None = None, timer: Timer = time.perf_counter,
                   seconds: float | None = None
                   ) -> tuple[AutoChoice, dict[str, BiEncoder]]:
    """Open every candidate (``open_backend(name)`` opens ``spec`` with
    ``cpu_backend=name``, accuracy guard included; a candidate whose opening fails is
    dropped with a warning), time them on the probe set and choose. Returns the choice
    and every opened encoder; the caller closes the ones it does not keep. When every
    candidate fails, the first one's error is raised."""
    encoders: dict[str, BiEncoder] = {}
    dropped: dict[str, str] = {}
    failures: list[Exception] = []
    for name in backends or candidates():
        try:
            encoder = open_backend(name)
        except Exception as exc:  # a guard's refusal, a failed build: this one is out
            why = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
            dropped[name] = why
            failures.append(exc)
            logger.warning("model %r: cpu_backend auto drops %s: %s", spec.id, name, why)
            continue
        encoders[name] = _bi_encoder(encoder)
    if not encoders:
        raise failures[0]

    texts = list(PROBE_TEXTS)

    def run(name: str, size: int, start: int) -> None:
        batch = [texts[(start + i) % len(texts)] for i in range(size)]
        encoders[name].embed(batch, normalize=True)

    rates = measure_rates(run, list(encoders), (SMALL_TEXTS, LARGE_TEXTS),
                          seconds=MEASURE_SECONDS if seconds is None else seconds, timer=timer)
    return choose(rates, dropped), encoders


def load_auto(spec: ModelSpec, open_backend: Callable[[str], Encoder], *,
              folder: Path | None = None, cache_dir: str | Path | None = None,
              threads: int = 1, chooser: Chooser | None = None,
              backends: Sequence[str] | None = None, timer: Timer = time.perf_counter,
              seconds: float | None = None) -> Encoder:
    """``spec`` on the fastest accurate CPU backend.

    With ``folder`` (the model's files; the loader passes it), a choice recorded for the
    same model, candidates, CPU, ``threads``, libraries and guard in the model cache
    under ``cache_dir`` is reused and nothing is timed; otherwise it measures (below) and
    records what it chose. With a ``chooser`` (the loader passes
    ``blitz.loading.child_work.choose_in_child``), the candidates are opened and timed
    elsewhere and only the winner is opened here: a replica that opened all four kept
    ~170 MiB of the losers' memory after closing them (docs/benchmarks-history.md,
    "Memory per process"). Otherwise, or when the chooser fails, ``measure_choice`` runs
    here and the losers are closed before this returns.
    """
    opened: dict[str, BiEncoder] = {}
    names = list(backends or candidates())

    def measure() -> AutoChoice:
        choice = chooser(spec) if chooser is not None else None
        if choice is None:
            choice, encoders = measure_choice(spec, open_backend, backends=names,
                                              timer=timer, seconds=seconds)
            opened.update(encoders)
        return choice

    remembered = (RememberedChoice(measure(), "measured", time.time()) if folder is None
                  else remember_choice(spec, folder, names, threads, measure, cache_dir))
    choice = remembered.choice
    kept: Encoder | None = opened.pop(choice.chosen, None)
    if opened:
        for loser in opened.values():
            loser.close()
        return_freed_memory()
    winner = kept if kept is not None else open_backend(choice.chosen)
    if remembered.how == "cached":
        logger.info("model %r: cpu_backend auto: cached choice %s (measured %s; to measure "
                    "again, delete %s): %s", spec.id, choice.chosen, remembered.measured_on,
                    remembered.record, choice.table())
    else:
        recorded = f"; recorded in {remembered.record}" if remembered.record else ""
        logger.info("model %r: cpu_backend auto measured texts/s per call size on the probe "
                    "set: %s; chose %s for every call%s", spec.id, choice.table(),
                    choice.chosen, recorded)
    winner.backend = choice.backend
    winner.auto_choice = remembered.summary()
    return winner


def _bi_encoder(encoder: Encoder) -> BiEncoder:
    if not isinstance(encoder, BiEncoder):
        raise TypeError(f"cpu_backend auto serves bi-encoders, not {type(encoder)}")
    return encoder


def choice_key(spec: ModelSpec, folder: Path, backends: Sequence[str], threads: int, *,
               seconds: float | None = None) -> tuple[str, dict[str, Any]]:
    """The cache key of ``spec``'s choice among ``backends`` with its files in ``folder``
    and ``threads`` intra-op threads, timed for ``seconds`` per candidate; and its parts."""
    from blitz.loading.onnx_export import CACHE_FORMAT as BUILD_FORMAT

    probes = hashlib.sha256("\n".join((*PROBE_TEXTS, "", *PROBE_QUERIES)).encode())
    parts = {
        "format": CACHE_FORMAT, "builds": BUILD_FORMAT,
        "kind": spec.kind, "source": spec.source,
        "files": model_cache.directory_fingerprint(folder), "pooling": spec.pooling,
        "max_seq_length": spec.max_seq_length,
        "candidates": list(backends), "cpu": cpu_identity(), "threads": threads,
        "versions": model_cache.library_versions(),
        "guard": {"threshold": spec.accuracy_threshold, "probes": probes.hexdigest()[:16]},
        "measure": {"sizes": [SMALL_TEXTS, LARGE_TEXTS],
                    "seconds": MEASURE_SECONDS if seconds is None else seconds,
                    "rounds": MEASURE_ROUNDS},
    }
    return model_cache.entry_key(f"{spec.id}-auto", parts), parts


def remember_choice(spec: ModelSpec, folder: Path, backends: Sequence[str], threads: int,
                    measure: Measure, cache_dir: str | Path | None = None, *,
                    lock_timeout: float | None = None) -> RememberedChoice:
    """The choice recorded under ``choice_key(spec, folder, backends, threads)``, or
    ``measure()``'s, recorded there now.

    ``measure`` runs only when no usable record is found (under the entry's lock); what it
    raises propagates and nothing is recorded.
    """
    key, parts = choice_key(spec, folder, backends, threads)
    read: list[AutoChoice] = []  # check() reads every usable record, a fresh one included

    def build(tmp: Path) -> dict[str, Any]:
        read.append(measure())
        return {"model_id": spec.id, "parts": parts, "choice": read[-1].to_dict()}

    def check(entry: model_cache.CacheEntry) -> None:
        read.append(recorded_choice(entry.meta, parts))

    entry = model_cache.get_or_build(model_cache.cache_root(cache_dir), AREA, key, build,
                                     validate=check, fields=RECORD_FIELDS,
                                     lock_timeout=lock_timeout, model=spec.id)
    how: Literal["cached", "measured"] = "measured" if entry.built else "cached"
    return RememberedChoice(read[-1], how, float(entry.meta["created"]), entry.path)


def recorded_choice(meta: dict[str, Any], parts: dict[str, Any]) -> AutoChoice:
    """The choice a record holds; ``ValueError`` unless it is well formed, was measured
    for ``parts`` and chose one of the measured candidates."""
    if _canonical(meta["parts"]) != _canonical(parts):
        raise ValueError("it was measured for other parts than its key's")
    value = meta["choice"]
    chosen, rates, dropped = value.get("chosen"), value.get("rates"), value.get("dropped", {})
    names = parts["candidates"]
    if not isinstance(rates, dict) or not isinstance(dropped, dict) or chosen not in rates:
        raise ValueError("it holds no valid choice")
    for backend, by_size in rates.items():
        if backend not in names or not isinstance(by_size, dict) or not by_size:
            raise ValueError(f"it holds no valid rates for {backend!r}")
        for rate in by_size.values():
            if not isinstance(rate, int | float) or isinstance(rate, bool) or not (
                    math.isfinite(rate) and rate >= 0):
                raise ValueError(f"it holds no valid rates for {backend!r}")
    if not all(isinstance(b, str) and isinstance(why, str) for b, why in dropped.items()):
        raise ValueError("it holds no valid list of dropped backends")
    in_order = {b: rates[b] for b in names if b in rates}  # JSON sorted them
    return AutoChoice.from_dict({**value, "rates": in_order})


def _canonical(parts: dict[str, Any]) -> str:
    """``parts`` as the record stores them (JSON: tuples read back as lists)."""
    return json.dumps(parts, sort_keys=True, default=str)
