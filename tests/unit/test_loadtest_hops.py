"""``loadtest hops``: one user's latency per hop, from the replies' server-timing header."""

from __future__ import annotations

import httpx
import numpy as np

from blitz import codecs, timing
from loadtest import hops


async def _app(scope, receive, send):
    while (await receive()).get("more_body"):
        pass
    body = codecs.pack({"embeddings": np.ones((1, 4), np.float32),
                        "usage": {"prompt_tokens": 3, "total_tokens": 3}})
    value = timing.header_value({"call": 0.002, "pool": 0.0015, "model": 0.001}, 0.003)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/msgpack"),
                            (timing.HEADER.encode(), value.encode())]})
    await send({"type": "http.response.body", "body": body})


async def test_hops_collects_every_hop_and_the_inprocess_calls():
    calls = []
    report = await hops.measure("http://blitz", "m", rounds=2, per_round=5, warmup=2,
                                inprocess=calls.append, inprocess_backend="fake",
                                gap_ms=0.1, transport=httpx.ASGITransport(_app))
    assert len(report.served_ms) == 10 and len(report.inprocess_ms) == 10
    assert len(report.inprocess_gapped_ms) == 10
    assert len(calls) == 2 + 10 + 10  # warm-up, then back to back and after gaps
    summary = report.summary()
    assert summary["hops_p50_ms"]["model"] == 1.0 and summary["hops_p50_ms"]["handle"] == 0.5
    assert summary["hops_p50_ms"]["proxy"] >= 0
    assert set(summary) >= {"served", "inprocess", "inprocess_after_gaps",
                            "served_minus_inprocess_p50_ms"}
    assert "model" in hops.render(report)
