"""``cpu_backend: auto``: the fastest accurate CPU backend for each micro-batch size.

At load time every candidate backend is opened through the ordinary loader (so each
meets the same accuracy guard as when named explicitly; one that fails is dropped),
timed on the probe set at ``SMALL_TEXTS`` and at ``LARGE_TEXTS`` texts per call, and
only the winners stay resident:

    load_auto(spec, open_backend, chooser)
      -> chooser(spec)                    blitz.auto_child: measure_choice in a child process
         or measure_choice(...)           (here, when there is no chooser or it failed):
           -> candidates()                torch, torch-bf16 (native bf16 only), onnx, onnx-int8
           -> open_backend(name) for each guard failures and load errors drop the candidate
           -> measure_rates(...)          texts/s per (backend, texts per call), injectable timer
           -> choose(...)                 the fastest per size; the crossover in padded tokens
      -> open_backend(winner)             in the child's case: only the winners are opened here
      -> AutoEncoder(small, large)        or the one winner alone when it wins both

The crossover: a micro-batch's size is its padded tokens (texts x longest text, what
the matrix products compute). Micro-batches smaller than ``threshold_tokens`` run on the
small winner, the others on the large winner; ``threshold_tokens`` is the geometric mean
of the mean micro-batch sizes the two measurements ran (a 1-text call on the probe set
is ~15 tokens; 32 texts fill token-budget micro-batches of ~500).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import gc
import json
import logging
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from blitz.child_process import run_child
from blitz.cpu_features import cpu_supports_bf16
from blitz.encoders.base import Encoder
from blitz.encoders.sentence_transformer import SentenceTransformerEncoder, length_batches
from blitz.errors import ModelLoadFailed
from blitz.probes import PROBE_TEXTS
from blitz.registry import ModelSpec

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


def fastest(rates: dict[str, dict[int, float]], size: int) -> str:
    """The backend with the highest rate at ``size``; the first listed wins a tie."""
    return max(rates, key=lambda backend: rates[backend][size])


def crossover_tokens(small_tokens: float, large_tokens: float) -> int:
    """The micro-batch size (padded tokens) from which the large winner serves."""
    return max(1, round(math.sqrt(small_tokens * large_tokens)))


def mean_micro_batch_tokens(lengths: Sequence[int], texts_per_call: int,
                            token_budget: int, call_tokens: float = math.inf) -> float:
    """Mean padded tokens per micro-batch when ``lengths`` (token counts, cycled) are
    embedded ``texts_per_call`` at a time, as ``measure_rates`` calls them."""
    sizes = []
    for start in range(0, len(lengths), texts_per_call):
        call = [lengths[(start + i) % len(lengths)] for i in range(texts_per_call)]
        sizes += [len(batch) * max(call[i] for i in batch)
                  for batch in length_batches(call, token_budget, call_tokens)]
    return float(np.mean(sizes))


@dataclass(frozen=True)
class AutoChoice:
    """What ``auto`` measured and chose."""

    small: str
    large: str
    threshold_tokens: int
    rates: dict[str, dict[int, float]]  # texts/s per backend per texts per call
    dropped: dict[str, str] = field(default_factory=dict)  # backend -> why

    @property
    def backend(self) -> str:
        return f"auto(small={self.small}, large={self.large})"

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> AutoChoice:
        fields = json.loads(text)
        fields["rates"] = {backend: {int(size): rate for size, rate in rates.items()}
                           for backend, rates in fields["rates"].items()}
        return cls(**fields)

    def table(self) -> str:
        sizes = sorted(next(iter(self.rates.values()), {}))
        lines = [f"{b}: " + ", ".join(f"{r[s]:.0f}/s at {s}" for s in sizes)
                 for b, r in self.rates.items()]
        lines += [f"{b}: dropped ({why})" for b, why in self.dropped.items()]
        return "; ".join(lines)


def choose(rates: dict[str, dict[int, float]], small_tokens: float, large_tokens: float,
           dropped: dict[str, str] | None = None) -> AutoChoice:
    """The fastest backend at ``SMALL_TEXTS`` and at ``LARGE_TEXTS`` per call."""
    return AutoChoice(fastest(rates, SMALL_TEXTS), fastest(rates, LARGE_TEXTS),
                      crossover_tokens(small_tokens, large_tokens), rates, dropped or {})


def return_freed_memory() -> None:
    """Collect, then hand freed heap pages back to the OS (glibc's ``malloc_trim``): the
    closed candidates' weights otherwise stay in this process's resident memory (~100-200
    MiB for MiniLM's three losers)."""
    gc.collect()
    libc = ctypes.util.find_library("c")
    if libc:
        trim = getattr(ctypes.CDLL(libc), "malloc_trim", None)  # glibc only
        if trim is not None:
            trim(0)


class AutoEncoder(SentenceTransformerEncoder):
    """Two loaded backends of one bi-encoder; each micro-batch runs on the one measured
    fastest for its size. Tokenization, length sorting and the token budget are the
    small encoder's (both backends share the model's tokenizer and budget)."""

    def __init__(self, small: SentenceTransformerEncoder, large: SentenceTransformerEncoder,
                 choice: AutoChoice):
        super().__init__(small.model_id, small.model, max_seq_length=small.max_seq_length,
                         token_budget=small.token_budget)
        self.small, self.large, self.choice = small, large, choice
        self.call_tokens = small.call_tokens  # what splits the small micro-batches
        self.backend = choice.backend
        self.served = {choice.small: 0, choice.large: 0}  # micro-batches per backend

    def _forward(self, rows: list[list[int]], width: int) -> np.ndarray:
        small = len(rows) * width < self.choice.threshold_tokens
        name, encoder = ((self.choice.small, self.small) if small
                         else (self.choice.large, self.large))
        self.served[name] += 1
        return encoder._forward(rows, width)

    def close(self) -> None:
        self.small.close()
        self.large.close()
        super().close()


Chooser = Callable[[ModelSpec], "AutoChoice | None"]
"""Measures and chooses elsewhere (``choose_in_child``); None when that failed and the
choice is to be measured here."""

CHILD_MARK = "blitz-auto-choice "  # the line of the child's stdout that holds its choice
STDERR_KEPT = 2000  # characters of the child's stderr quoted when it fails


def choose_in_child(spec: ModelSpec, cache_dir: str | Path | None,
                    threads: int) -> AutoChoice | None:
    """The choice ``measure_choice`` makes for ``spec`` with ``threads`` intra-op threads,
    made in a child process (``python -m blitz.auto_child``): the candidates' memory goes
    with it. None (logged) when the child fails, so the caller measures in process and
    raises what it always raised (a load failure, say)."""
    command = [sys.executable, "-m", "blitz.auto_child", spec.model_dump_json(), str(threads)]
    if cache_dir is not None:
        command.append(str(cache_dir))
    logger.info("model %r: cpu_backend auto measures its candidates in a child process",
                spec.id)
    done = run_child(command)  # killed past the load deadline, or with this process
    lines = [line for line in done.stdout.splitlines() if line.startswith(CHILD_MARK)]
    if done.returncode != 0 or not lines:
        logger.warning("model %r: the cpu_backend auto child failed (exit %s); measuring in "
                       "process:\n%s", spec.id, done.returncode, done.stderr[-STDERR_KEPT:])
        return None
    return AutoChoice.from_json(lines[-1][len(CHILD_MARK):])


def measure_choice(spec: ModelSpec, open_backend: Callable[[str], Encoder], *,
                   backends: Sequence[str] | None = None, timer: Timer = time.perf_counter,
                   seconds: float | None = None
                   ) -> tuple[AutoChoice, dict[str, SentenceTransformerEncoder]]:
    """Open every candidate (``open_backend(name)`` loads ``spec`` with
    ``cpu_backend=name``, accuracy guard included; a candidate whose load fails is
    dropped with a warning), time them on the probe set and choose. Returns the choice
    and every opened encoder; the caller closes the ones it does not keep."""
    encoders: dict[str, SentenceTransformerEncoder] = {}
    dropped: dict[str, str] = {}
    failures: list[ModelLoadFailed] = []
    for name in backends or candidates():
        try:
            encoder = open_backend(name)
        except ModelLoadFailed as exc:
            dropped[name] = exc.message
            failures.append(exc)
            logger.warning("model %r: cpu_backend auto drops %s: %s", spec.id, name,
                           exc.message)
            continue
        encoders[name] = _bi_encoder(encoder)
    if not encoders:
        raise failures[0]

    texts = list(PROBE_TEXTS)
    first = next(iter(encoders.values()))
    lengths = [int(n) for n in first.token_ids(texts, truncate=True)[1]]

    def run(name: str, size: int, start: int) -> None:
        batch = [texts[(start + i) % len(texts)] for i in range(size)]
        encoders[name].embed(batch, normalize=True)

    rates = measure_rates(run, list(encoders), (SMALL_TEXTS, LARGE_TEXTS),
                          seconds=MEASURE_SECONDS if seconds is None else seconds, timer=timer)
    split = (first.token_budget, first.call_tokens)
    choice = choose(rates, mean_micro_batch_tokens(lengths, SMALL_TEXTS, *split),
                    mean_micro_batch_tokens(lengths, LARGE_TEXTS, *split), dropped)
    return choice, encoders


def load_auto(spec: ModelSpec, open_backend: Callable[[str], Encoder], *,
              backends: Sequence[str] | None = None, timer: Timer = time.perf_counter,
              seconds: float | None = None, chooser: Chooser | None = None) -> Encoder:
    """``spec`` on the fastest accurate CPU backend per micro-batch size.

    With a ``chooser`` (the loader passes ``choose_in_child``), the candidates are
    opened and timed elsewhere and only the winners are opened here: a replica that
    opened all four kept ~170 MiB of the losers' memory after closing them (BENCHMARKS.md,
    "Memory per process"). Otherwise, or when the chooser fails, ``measure_choice`` runs
    here and the losers are closed before this returns.
    """
    choice = chooser(spec) if chooser is not None else None
    if choice is not None:
        encoders = {name: _bi_encoder(open_backend(name))
                    for name in dict.fromkeys((choice.small, choice.large))}
    else:
        choice, encoders = measure_choice(spec, open_backend, backends=backends, timer=timer,
                                          seconds=seconds)
        for name in set(encoders) - {choice.small, choice.large}:
            encoders.pop(name).close()
        return_freed_memory()
    logger.info("model %r: cpu_backend auto measured texts/s per call size on the probe set: "
                "%s; chose %s (micro-batches under %d padded tokens run on %s)", spec.id,
                choice.table(), choice.backend, choice.threshold_tokens, choice.small)
    if choice.small == choice.large:
        winner = encoders[choice.small]
        winner.backend = choice.backend
        return winner
    return AutoEncoder(encoders[choice.small], encoders[choice.large], choice)


def _bi_encoder(encoder: Encoder) -> SentenceTransformerEncoder:
    if not isinstance(encoder, SentenceTransformerEncoder):
        raise TypeError(f"cpu_backend auto serves bi-encoders, not {type(encoder)}")
    return encoder
