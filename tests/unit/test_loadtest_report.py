"""The load generator's reports (loadtest.report)."""

from __future__ import annotations

import math

import orjson

from loadtest import report
from loadtest.runner import LoadConfig, RunResult
from loadtest.stats import Recorder, summarize


def test_report_markdown_and_json_round_trip(tmp_path):
    rec = Recorder()
    rec.ok(0.010, 32, None, 49_287, 900)
    rec.error("exception_ReadTimeout")
    config = LoadConfig(api="raw", texts_per_request=32, concurrency=4, api_key="secret")
    result = RunResult(config, summarize(rec, 1.0), warmup_requests=3)
    table = report.results_markdown([result])
    header, rule, row = table.strip().splitlines()
    assert header.startswith("| API | texts/req | conc | req/s | emb/s | p50 ms")
    assert row.startswith("| raw | 32 | 4 | 1.0 | 32.0 | 10.0 |")
    assert "49,287" in row and "1 (exception_ReadTimeout: 1)" in row
    path = tmp_path / "r.json"
    report.write_json(path, report.loadtest_document([result], "run"))
    document = orjson.loads(path.read_bytes())
    assert document["results"][0]["config"]["api_key"] == "***"
    assert "secret" not in path.read_text()
    [(cfg, summary)] = report.read_loadtest(path)
    assert cfg["concurrency"] == 4 and summary == result.summary
    empty = report.loadtest_document([RunResult(config, summarize(Recorder(), 1.0), 0)], "run")
    report.write_json(path, empty)  # NaN latencies become null, and back
    assert math.isnan(report.read_loadtest(path)[0][1].latency_ms.p99)
