"""The load generator's statistics (loadtest.stats)."""

from __future__ import annotations

import math

import pytest

from loadtest.stats import Recorder, summarize


def test_summary_arithmetic():
    rec = Recorder()
    for i in range(1, 101):  # 1..100 ms
        rec.ok(i / 1000, embeddings=4, tokens=100, reply_bytes=1000, request_bytes=50)
    rec.error("http_503")
    rec.error("http_503")
    rec.error("verify_count")
    s = summarize(rec, duration_s=2.0, client_cpu_s=0.206)
    assert (s.requests, s.errors, s.embeddings, s.tokens) == (100, 3, 400, 10_000)
    assert s.error_kinds == {"http_503": 2, "verify_count": 1}
    assert (s.requests_per_s, s.embeddings_per_s, s.tokens_per_s) == (50.0, 200.0, 5000.0)
    assert s.latency_ms.p50 == pytest.approx(50.5)
    assert s.latency_ms.p95 == pytest.approx(95.05)
    assert s.latency_ms.p99 == pytest.approx(99.01)
    assert s.latency_ms.max == pytest.approx(100.0)
    assert s.latency_ms.mean == pytest.approx(50.5)
    assert s.reply_bytes_per_request == 1000 and s.request_bytes_per_request == 50
    assert s.client_cpu_ms_per_request == pytest.approx(2.0)  # 206 ms over 103 requests
    empty = summarize(Recorder(), duration_s=1.0)
    assert empty.requests == 0 and math.isnan(empty.latency_ms.p50)
    assert math.isnan(empty.latency_ms.mean) and math.isnan(empty.latency_ms.max)
