"""In-process throughput of encoders: texts per second through ``embed`` or ``score``.

For ``blitz optimize`` (a built backend against torch fp32) and ``loadtest backends``;
it lives in the product because ``blitz optimize`` uses it (the product never imports
the load tester).
"""

from __future__ import annotations

import time

from blitz.encoders.base import Encoder
from blitz.settings.kinds import kind_of


def measure_throughput(encoder: Encoder, texts: list[str], batch_size: int, *,
                       min_seconds: float = 1.0, min_calls: int = 3) -> float:
    """Texts per second through ``encoder`` in calls of ``batch_size`` texts (in process).

    One warm-up call first; then calls until both ``min_calls`` and ``min_seconds`` are met.
    Cross-encoders score ``batch_size`` documents against one query per call.
    """
    def call(start: int) -> None:
        batch = [texts[(start + i) % len(texts)] for i in range(batch_size)]
        answers = kind_of(encoder.kind).answers
        if answers == "scores":
            encoder.score(texts[start % len(texts)], batch)
        elif answers == "labels":
            encoder.classify([[t] for t in batch])
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
