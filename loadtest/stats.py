"""What one measured phase recorded, and the summary a report shows.

Latencies are those of successful requests; failed ones are counted by kind.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field

import numpy as np

from loadtest.cpu import CpuSample


@dataclass
class Recorder:
    """Counters for one phase; the runner calls ``ok`` or ``error`` once per request."""

    latencies_s: list[float] = field(default_factory=list)
    embeddings: int = 0
    tokens: int = 0
    reply_bytes: int = 0
    request_bytes: int = 0
    errors: Counter[str] = field(default_factory=Counter)

    @property
    def ok_count(self) -> int:
        return len(self.latencies_s)

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    @property
    def completed(self) -> int:
        return self.ok_count + self.error_count

    def ok(self, latency_s: float, embeddings: int, tokens: int | None, reply_bytes: int,
           request_bytes: int) -> None:
        self.latencies_s.append(latency_s)
        self.embeddings += embeddings
        self.tokens += tokens or 0
        self.reply_bytes += reply_bytes
        self.request_bytes += request_bytes

    def error(self, kind: str) -> None:
        self.errors[kind] += 1


@dataclass(frozen=True)
class Latency:
    mean: float
    p50: float
    p95: float
    p99: float
    max: float


@dataclass(frozen=True)
class Summary:
    """One row of a report: throughput over the measured window, latency in ms."""

    requests: int  # successful
    errors: int
    error_kinds: dict[str, int]
    embeddings: int
    tokens: int
    duration_s: float
    requests_per_s: float
    embeddings_per_s: float
    tokens_per_s: float
    latency_ms: Latency
    reply_bytes_per_request: float
    request_bytes_per_request: float
    client_cpu_ms_per_request: float
    server_cpu_ms_per_request: float | None = None  # with --server-pid
    machine_busy_pct: float | None = None  # all cores, all processes
    others_busy_pct: float | None = None  # the part neither the server nor this client used

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Summary:
        return cls(**{**data, "latency_ms": Latency(**data["latency_ms"])})


def summarize(recorder: Recorder, duration_s: float, client_cpu_s: float = 0.0,
              cpu: CpuSample | None = None) -> Summary:
    n = recorder.ok_count
    per_s = (lambda count: count / duration_s) if duration_s > 0 else (lambda count: 0.0)
    per_request = (lambda total: total / n) if n else (lambda total: 0.0)
    return Summary(
        requests=n,
        errors=recorder.error_count,
        error_kinds=dict(sorted(recorder.errors.items())),
        embeddings=recorder.embeddings,
        tokens=recorder.tokens,
        duration_s=duration_s,
        requests_per_s=per_s(n),
        embeddings_per_s=per_s(recorder.embeddings),
        tokens_per_s=per_s(recorder.tokens),
        latency_ms=_latency_ms(recorder.latencies_s),
        reply_bytes_per_request=per_request(recorder.reply_bytes),
        request_bytes_per_request=per_request(recorder.request_bytes),
        client_cpu_ms_per_request=(1000 * client_cpu_s / recorder.completed
                                   if recorder.completed else 0.0),
        server_cpu_ms_per_request=(1000 * cpu.server_s / recorder.completed
                                   if cpu and cpu.server_s is not None and recorder.completed
                                   else None),
        machine_busy_pct=_pct(cpu.busy_s, cpu.total_s) if cpu else None,
        others_busy_pct=(_pct(cpu.busy_s - cpu.server_s - client_cpu_s, cpu.total_s)
                         if cpu and cpu.busy_s is not None and cpu.server_s is not None
                         else None),
    )


def _latency_ms(latencies_s: list[float]) -> Latency:
    if not latencies_s:
        return Latency(math.nan, math.nan, math.nan, math.nan, math.nan)
    ms = 1000 * np.asarray(latencies_s)
    p50, p95, p99 = (float(p) for p in np.percentile(ms, [50, 95, 99]))
    return Latency(float(ms.mean()), p50, p95, p99, float(ms.max()))


def _pct(part: float | None, whole: float | None) -> float | None:
    return None if part is None or not whole else min(100.0, max(0.0, 100 * part / whole))
