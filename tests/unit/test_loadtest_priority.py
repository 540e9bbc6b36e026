"""``loadtest.priority`` without a server: its bulk job marks every request low and
retries a 503 until each text has its row; the latency summary and the report's verdict."""

from __future__ import annotations

import httpx
import numpy as np

from blitz import codecs
from blitz.client import Client
from loadtest import priority


def test_the_bulk_job_sends_low_and_retries_until_every_text_has_its_row():
    seen: list[tuple[str | None, int]] = []

    def reply(request: httpx.Request) -> httpx.Response:
        body = codecs.unpack(request.content)
        seen.append((body.get("priority"), len(body["texts"])))
        if len(seen) == 2:  # one request answered "overloaded": sent again
            return httpx.Response(503, json={"error": {"message": "full", "code": "overloaded"}},
                                  headers={"retry-after": "1"})
        rows = np.zeros((len(body["texts"]), 4), np.float32)
        return httpx.Response(200, content=codecs.pack({"embeddings": rows}),
                              headers={"content-type": codecs.MSGPACK_TYPES[0]})

    priority.RETRY_PAUSE_S = 0.0
    texts = priority.passages(10, 2)
    assert len(texts) == 10 and all(text.count(".") >= 1 for text in texts)
    with Client("http://blitz", transport=httpx.MockTransport(reply), priority="low") as client:
        result = priority.run_bulk(client, "m", texts, batch=4, concurrency=1, max_seconds=30)
    assert {p for p, _ in seen} == {"low"}
    assert sorted(n for _, n in seen) == [2, 4, 4, 4]  # three chunks, one of them twice
    assert result["finished"] and result["rows"] == 10 and result["retries_503"] == 1
    assert result["failed"] == 0


def test_latency_counts_only_queries_inside_the_window_and_the_verdict_reads_it():
    done = [(float(at), 0.010) for at in range(100)] + [(200.0, 5.0)]
    assert priority.latency(done)["queries"] == 101
    window = priority.latency(done, since=10, until=50)
    assert window["queries"] == 40 and round(window["p99_ms"], 6) == 10.0
    assert priority.latency([], 0, 1)["p99_ms"] is None
    bulk = {"rows": 8, "texts": 8, "seconds": 4.0, "texts_per_s": 2.0, "retries_503": 0,
            "finished": True}
    result = {"phases": [
        {"phase": "idle", "queries": 9, "p50_ms": 5.0, "p99_ms": 10.0, "p99_over_idle": 1.0,
         "errors": {}},
        {"phase": "bulk low", "queries": 9, "p50_ms": 6.0, "p99_ms": 15.0,
         "p99_over_idle": 1.5, "errors": {"http_503": 1}, "bulk": bulk}],
        "verdict": {"p99_within_target": True, "bulk_finished": True, "target_ratio": 2.0}}
    text = priority.markdown(result)
    assert "| bulk low | 9 | 6.0 | 15.0 | 1.50x | 8/8 |" in text and "http_503 1" in text
    assert "within 2x of idle p99: yes; the job finished: yes" in text
