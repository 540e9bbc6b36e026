"""``python -m loadtest.batch_bench``: the batch API (OpenAI's Files and Batches, served by
Blitz) against ``blitz embed`` (``deployments.bulk.embed_dataset``, a Ray Data job) on the
same corpus, and what a batch does to one interactive user's latency.

One corpus of ``--texts`` sentences (``loadtest.corpus.sentences``), in rounds
(``--rounds``), each round both sides, the order alternating (embed first in rounds 1, 3,
..., the batch first in rounds 2, 4, ...) so that the machine's drift hits both alike:

- ``blitz embed``: the corpus as one JSONL file ({"id": i, "text": ...}) embedded by
  ``embed_dataset(..., options=BulkSettings(model=MODEL))`` with the registry of
  ``--config`` (serve_config.yaml: the models the server has), into a fresh output folder
  each round. Texts/s over the job's own seconds (``BulkReport.seconds``): Ray's start and
  Ray Data's first use are outside it, the encoder actors' start and model load inside.
- ``batch API``: the same texts as request lines ({"custom_id": str(first id), "method":
  "POST", "url": "/v1/embeddings", "body": {"model": MODEL, "input": text or texts}},
  ``--texts-per-line`` texts a line) through the official ``openai`` SDK:
  ``files.create(purpose="batch")`` (timed apart: ``upload_s``), ``batches.create``, then
  ``batches.retrieve`` every second until the batch ends. Texts/s over the seconds from
  create to the poll that saw it completed (so up to a second long); the server's own
  ``completed_at - created_at`` beside it. The output file is streamed to disk and checked:
  one line per request line, every custom_id exactly once, every response 200, one vector
  per text, and its first vector against blitz embed's for the same id (cosine > 0.999).
  A batch that runs ``--stall-seconds`` with no request done, or past ``--batch-timeout``,
  is cancelled and the run fails; the run's files are deleted from the server either way.
- ``one user``: one-text ``POST /v1/embeddings`` requests sent back to back by one client
  (httpx, texts from another seed so that no cache could answer them), for
  ``--idle-seconds`` with the server idle just before the upload, then for as long as the
  batch runs: p50 and p99 of both, and during / idle.

Where the phases run. The bulk job needs Ray in this process, and the server has its own:

- ``--url`` (a running server; the default, http://127.0.0.1:8000): each embed phase joins
  the server's Ray (``ray.init(address="auto")``, ``--embed-ray shared``) when enough of
  its CPUs are free for the job's claims (its read tasks take a CPU, its actors
  ``deployments.bulk._actor_cpus`` each), else (``auto``, the default, and ``own``) starts
  a Ray of its own beside it (``ray.init(address="local")``), stopped after the phase. A
  server whose CPU pool claims every core (serve_config.yaml on a 2-core machine) leaves
  none, so ``auto`` then runs the job on its own Ray: the server's idle processes run
  beside it, as the job's do not during the batch phases.
- ``--serve``: nothing is running; each round starts what it needs and stops it after:
  a local Ray for the embed phase, then ``scripts/serve.sh`` (``loadtest.bulk.served``)
  for the batch phase (its start outside the timed batch; the Ray Data actors the batch
  runs on start inside it).

Prints a Markdown table (each round and the medians) and writes ``--out``
(loadtest/results/batch-api.json: ``kind`` "table" with the config, every round's figures
and the medians beside it) once every round has passed its checks.

    python -m loadtest.batch_bench --serve --texts 100000 --rounds 2
    python -m loadtest.batch_bench --url http://127.0.0.1:8000 --texts 20000 --rounds 3
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import math
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from loadtest.corpus import sentences, stream
from loadtest.report import environment, fmt, markdown_table, write_json

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_OUT = ROOT / "loadtest" / "results" / "batch-api.json"
TERMINAL = frozenset({"completed", "failed", "cancelled", "expired"})
POLL_S = 1.0  # how often the batch is retrieved (the create-to-completed time's resolution)
REPORT_S = 30.0  # a progress line at least this often while a batch runs
MIN_COSINE = 0.999
PROBE_WARMUP = 5  # one-text requests before the idle window, not measured
PROBE_SEED = 1  # the one user's texts: not the corpus's (seed 0)
Progress = Callable[[str], None]


# --- pure pieces (tests/unit/test_loadtest_batch.py) ---------------------------------------

def custom_ids(texts: int, per_line: int) -> list[str]:
    """The custom_id of each request line: the id of its first text."""
    return [str(i) for i in range(0, texts, per_line)]


def request_lines(corpus: Sequence[str], model: str, per_line: int) -> Iterator[dict[str, Any]]:
    """The batch's request lines for ``corpus`` (text i has id i): ``per_line`` texts a line,
    a line of one text sending it as a string (as a client embedding one text would)."""
    if per_line < 1:
        raise ValueError("texts per line must be >= 1")
    for start in range(0, len(corpus), per_line):
        chunk = list(corpus[start:start + per_line])
        yield {"custom_id": str(start), "method": "POST", "url": "/v1/embeddings",
               "body": {"model": model, "input": chunk[0] if per_line == 1 else chunk}}


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> int:
    """``rows`` as JSON lines; returns the bytes written."""
    with open(path, "wb") as f:
        for row in rows:
            f.write(orjson.dumps(row) + b"\n")
        return f.tell()


def vector(value: Any) -> np.ndarray:
    """An embedding from a reply: a list of floats, or base64 float32 (encoding_format)."""
    if isinstance(value, str):
        return np.frombuffer(base64.b64decode(value), dtype="<f4").astype(np.float32)
    return np.asarray(value, dtype=np.float32)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


@dataclass
class OutputCheck:
    """What a batch's output file holds, against the custom_ids and texts it should."""

    lines: int = 0
    texts: int = 0  # vectors in the 200 responses
    missing: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)  # custom_ids on more than one line
    unexpected: list[str] = field(default_factory=list)  # custom_ids no request line had
    failed: list[str] = field(default_factory=list)  # "custom_id: reason", a line not 200
    first_id: str | None = None  # of the first line answered 200
    first_vector: np.ndarray | None = None
    expected_lines: int = 0
    expected_texts: int = 0

    def problems(self, shown: int = 5) -> list[str]:
        """Each way the file is not every request answered exactly once (empty: it is)."""
        out = []
        if self.lines != self.expected_lines:
            out.append(f"{self.lines} lines for {self.expected_lines} requests")
        for name, items in (("missing", self.missing), ("more than once", self.duplicates),
                            ("not requested", self.unexpected), ("failed", self.failed)):
            if items:
                out.append(f"{len(items)} custom_ids {name}: {', '.join(items[:shown])}"
                           + (" ..." if len(items) > shown else ""))
        if not self.failed and self.texts != self.expected_texts:
            out.append(f"{self.texts} vectors for {self.expected_texts} texts")
        return out


def check_output(path: Path, expected: Sequence[str], texts: int) -> OutputCheck:
    """Read a batch output file (OpenAI's shape: one JSON line per request, {"custom_id",
    "response": {"status_code", "body"}, "error"}) and count it against ``expected``
    (the request lines' custom_ids) and ``texts`` (the vectors they asked for)."""
    seen: Counter[str] = Counter()
    check = OutputCheck(expected_lines=len(expected), expected_texts=texts)
    with open(path, "rb") as f:
        for raw in f:
            if not raw.strip():
                continue
            row = orjson.loads(raw)
            check.lines += 1
            cid = str(row.get("custom_id"))
            seen[cid] += 1
            response = row.get("response") or {}
            status = response.get("status_code")
            if row.get("error") or status != 200:
                reason = row.get("error") or (response.get("body") or {}).get("error")
                check.failed.append(f"{cid}: {status} {reason}")
                continue
            data = response["body"]["data"]
            check.texts += len(data)
            if check.first_id is None and data:
                check.first_id, check.first_vector = cid, vector(data[0]["embedding"])
    wanted = set(expected)
    check.missing = [cid for cid in expected if cid not in seen]
    check.duplicates = sorted((cid for cid, n in seen.items() if n > 1), key=_id_order)
    check.unexpected = sorted((cid for cid in seen if cid not in wanted), key=_id_order)
    return check


def _id_order(cid: str) -> tuple[int, str]:
    return (int(cid), "") if cid.isdigit() else (1 << 62, cid)


def latency(latencies_s: Sequence[float], errors: int = 0) -> dict[str, Any]:
    """p50 and p99 in ms (None with no request), the count, and the failed requests."""
    if not latencies_s:
        return {"requests": 0, "errors": errors, "p50_ms": None, "p99_ms": None}
    p50, p99 = (float(p) for p in np.percentile(1000 * np.asarray(latencies_s), [50, 99]))
    return {"requests": len(latencies_s), "errors": errors, "p50_ms": p50, "p99_ms": p99}


def ratio(top: float | None, bottom: float | None) -> float | None:
    if top is None or bottom is None or not bottom or math.isnan(top) or math.isnan(bottom):
        return None
    return top / bottom


def round_ratios(row: dict[str, Any]) -> dict[str, Any]:
    """A round's comparisons: batch / blitz embed texts/s, the user's during / idle."""
    idle, during = row["user"]["idle"], row["user"]["during"]
    return {"batch_vs_embed": ratio(row["batch"]["texts_per_s"], row["embed"]["texts_per_s"]),
            "p50_during_vs_idle": ratio(during["p50_ms"], idle["p50_ms"]),
            "p99_during_vs_idle": ratio(during["p99_ms"], idle["p99_ms"])}


MEDIAN_KEYS = {
    "embed_texts_per_s": ("embed", "texts_per_s"),
    "batch_texts_per_s": ("batch", "texts_per_s"),
    "batch_vs_embed": ("ratios", "batch_vs_embed"),
    "upload_s": ("batch", "upload_s"),
    "batch_seconds": ("batch", "seconds"),
    "embed_seconds": ("embed", "seconds"),
    "idle_p50_ms": ("user", "idle", "p50_ms"),
    "idle_p99_ms": ("user", "idle", "p99_ms"),
    "during_p50_ms": ("user", "during", "p50_ms"),
    "during_p99_ms": ("user", "during", "p99_ms"),
    "p50_during_vs_idle": ("ratios", "p50_during_vs_idle"),
    "p99_during_vs_idle": ("ratios", "p99_during_vs_idle"),
}


def medians(rounds: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """The median over rounds of each figure in ``MEDIAN_KEYS`` (None where no round has
    it); the ratios are medians of the per-round ratios, each pair measured together."""
    out: dict[str, float | None] = {}
    for name, keys in MEDIAN_KEYS.items():
        values = []
        for row in rounds:
            value: Any = row
            for key in keys:
                value = value.get(key) if isinstance(value, dict) else None
            if value is not None and not math.isnan(value):
                values.append(float(value))
        out[name] = statistics.median(values) if values else None
    return out


COLUMNS = ["round", "blitz embed texts/s", "batch API texts/s", "batch / embed", "upload s",
           "one user p50 ms, idle / during", "p99 ms, idle / during", "p50 during / idle"]


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def table_rows(rounds: Sequence[dict[str, Any]],
               middle: dict[str, float | None]) -> list[list[str]]:
    """The Markdown table's rows: one a round (its order), then the medians."""
    rows = []
    for row in rounds:
        idle, during = row["user"]["idle"], row["user"]["during"]
        rows.append([f"{row['round']} ({' then '.join(row['order'])})",
                     fmt(row["embed"]["texts_per_s"], 0), fmt(row["batch"]["texts_per_s"], 0),
                     _x(row["ratios"]["batch_vs_embed"]), fmt(row["batch"]["upload_s"], 2),
                     f"{fmt(idle['p50_ms'])} / {fmt(during['p50_ms'])}",
                     f"{fmt(idle['p99_ms'])} / {fmt(during['p99_ms'])}",
                     _x(row["ratios"]["p50_during_vs_idle"])])
    m = middle
    rows.append(["median", fmt(m["embed_texts_per_s"], 0), fmt(m["batch_texts_per_s"], 0),
                 f"**{_x(m['batch_vs_embed'])}**", fmt(m["upload_s"], 2),
                 f"{fmt(m['idle_p50_ms'])} / {fmt(m['during_p50_ms'])}",
                 f"{fmt(m['idle_p99_ms'])} / {fmt(m['during_p99_ms'])}",
                 _x(m["p50_during_vs_idle"])])
    return rows


def markdown(result: dict[str, Any]) -> str:
    """The table for people: each round, the medians, and what was measured how."""
    c = result["config"]
    where = "; ".join(sorted({row["embed"]["ray"] for row in result["rounds"]}))
    notes = (f"{c['texts']:,} texts, model {c['model']}, {c['texts_per_line']} text(s) a "
             f"request line, {c['cores']} cores. blitz embed: the job's seconds, on {where}. "
             f"Batch API: {c['server']}; texts/s from create to the poll (every "
             f"{c['poll_s']:g} s) that saw it completed, the upload apart. One user: one-text "
             f"POST /v1/embeddings back to back, {c['idle_s']:g} s idle before the upload, "
             "then while the batch ran.")
    return markdown_table(result["columns"], result["rows"]) + "\n" + notes


# --- the one user --------------------------------------------------------------------------

class User:
    """One client sending one-text ``POST /v1/embeddings`` requests back to back, each a
    text not sent before (``stream(PROBE_SEED)``): in this thread for a while (``for_s``),
    or in a thread of its own between ``start()`` and ``stop()``."""

    def __init__(self, url: str, model: str, api_key: str | None):
        import httpx

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=url, headers=headers, timeout=60)
        self.model = model
        self.texts = stream(PROBE_SEED)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._samples: list[tuple[float, float]] = []  # (ended at, seconds)
        self._errors: Counter[str] = Counter()

    def one(self) -> float | None:
        """Send one text; its seconds, or None (counted by kind) when it failed."""
        import httpx

        start = time.perf_counter()
        try:
            reply = self.http.post("/v1/embeddings",
                                   json={"model": self.model, "input": next(self.texts)})
            seconds = time.perf_counter() - start
            if reply.status_code != 200:
                self._errors[str(reply.status_code)] += 1
                return None
            if len(reply.json()["data"]) != 1:
                self._errors["not one vector"] += 1
                return None
        except httpx.HTTPError as exc:
            self._errors[type(exc).__name__] += 1
            return None
        self._samples.append((time.perf_counter(), seconds))
        return seconds

    def warm_up(self, requests: int = PROBE_WARMUP) -> None:
        for _ in range(requests):
            self.one()
        self._reset()

    def for_s(self, seconds: float) -> dict[str, Any]:
        """Requests back to back for ``seconds``: their latency."""
        self._reset()
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            self.one()
        return self._summary(math.inf)

    def start(self) -> None:
        self._reset()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="one-user", daemon=True)
        self._thread.start()

    def stop(self, until: float) -> dict[str, Any]:
        """Stop the thread; the latency of the requests that ended by ``until``."""
        self._stop.set()
        if self._thread:
            self._thread.join()
        return self._summary(until)

    def close(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()
        self.http.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.one()

    def _reset(self) -> None:
        self._samples, self._errors = [], Counter()

    def _summary(self, until: float) -> dict[str, Any]:
        kept = [seconds for ended, seconds in self._samples if ended <= until]
        return {**latency(kept, sum(self._errors.values())), "error_kinds": dict(self._errors)}


# --- blitz embed ---------------------------------------------------------------------------

def _free_for_bulk(model: str) -> tuple[float, float]:
    """(CPUs free on the joined Ray, CPUs the bulk job claims there at once): a read task
    takes one, each encoder actor ``deployments.bulk._actor_cpus``."""
    import ray

    from blitz.settings.bulk import BulkSettings
    from deployments.bulk import _actor_count, _actor_cpus

    actors = _actor_count("cpu", BulkSettings(model=model))
    return ray.available_resources().get("CPU", 0.0), 1 + actors * _actor_cpus(actors)


@contextlib.contextmanager
def bulk_ray(mode: str, model: str, progress: Progress) -> Iterator[str]:
    """Ray for one embed phase, and what it is: ``shared`` joins the running server's
    (``address="auto"``; refused when the job's claims do not fit in what it has free),
    ``own`` starts one (``address="local"``, never someone else's), ``auto`` the first if
    it fits, else the second. Ray Data's cluster services start here (a stats actor, once
    per cluster, as in ``loadtest.bulk``), outside the timed job. Stopped (or, joined,
    left) after."""
    import ray

    where = "its own Ray"
    if mode in ("shared", "auto"):
        try:
            ray.init(address="auto", log_to_driver=False)
        except ConnectionError:  # no Ray on this machine: the server is elsewhere
            if mode == "shared":
                raise
        free, need = _free_for_bulk(model) if ray.is_initialized() else (0.0, math.inf)
        if free >= need:
            where = "the server's Ray"
        else:
            ray.shutdown()
            why = (f"the server's Ray has {free:g} CPUs free; blitz embed claims {need:g} "
                   "(a read task 1, its actors the rest)" if need < math.inf
                   else "no Ray found on this machine")
            if mode == "shared":
                raise RuntimeError(f"{why}: use --embed-ray own, or --serve")
            where = f"its own Ray ({why})"
    if not ray.is_initialized():
        ray.init(address="local", log_to_driver=False)
    try:
        ray.data.range(8).map_batches(lambda batch: batch).materialize()
        progress(f"blitz embed on {where}")
        yield where
    finally:
        ray.shutdown()


def embed_round(corpus_file: Path, out: Path, texts: int, settings: Any, model: str,
                progress: Progress) -> dict[str, Any]:
    """One ``blitz embed`` job over ``corpus_file`` into ``out`` (a new folder)."""
    from blitz.settings.bulk import BulkSettings
    from deployments.bulk import embed_dataset

    progress(f"blitz embed: {texts} texts")
    report = embed_dataset(str(corpus_file), str(out), settings=settings,
                           options=BulkSettings(model=model), progress=False)
    if report.rows_written != texts or report.refused:
        raise RuntimeError(f"blitz embed wrote {report.rows_written} rows and refused "
                           f"{report.refused} for {texts} texts (see {report.errors_path})")
    return {"texts_per_s": report.rows_written / report.seconds, "seconds": report.seconds}


def embedded_vector(out: Path, row_id: int) -> np.ndarray:
    """The vector blitz embed wrote for ``row_id`` under ``out``."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    for path in sorted(out.rglob("*.parquet")):
        table = pq.read_table(path, columns=["id", "embedding"])
        hits = table.filter(pc.equal(table.column("id"), row_id))
        if hits.num_rows:
            return np.asarray(hits.column("embedding")[0].as_py(), dtype=np.float32)
    raise RuntimeError(f"blitz embed's output under {out} has no id {row_id}")


# --- the batch API -------------------------------------------------------------------------

def batch_round(client: Any, user: User, lines_file: Path, ids: Sequence[str], texts: int,
                idle_s: float, work: Path, limits: tuple[float, float],
                progress: Progress) -> dict[str, Any]:
    """The one user idle, then one batch of ``lines_file`` with the user beside it; the
    output checked (``check_output``), the files deleted after. ``limits``: the batch's
    seconds in all and with no request done (``_run_batch``)."""
    progress(f"one user, idle: {idle_s:g} s")
    user.warm_up()
    idle = user.for_s(idle_s)
    progress(f"batch API: uploading {lines_file.stat().st_size / 1e6:.1f} MB ({len(ids)} "
             "request lines)")
    made: list[str] = []
    try:
        start = time.perf_counter()
        with open(lines_file, "rb") as f:
            upload = client.files.create(file=f, purpose="batch")
        made.append(upload.id)
        upload_s = time.perf_counter() - start
        batch, seconds, seen, until = _run_batch(client, user, upload.id, limits, made,
                                                 progress)
        during = user.stop(until)
        made += [i for i in (batch.output_file_id, batch.error_file_id) if i]
        if batch.status != "completed" or not batch.output_file_id:
            raise RuntimeError(f"batch {batch.id} ended {batch.status} (request counts "
                               f"{batch.request_counts}, output {batch.output_file_id}): "
                               f"{batch.errors}")
        progress(f"batch API: {texts} texts in {seconds:.1f} s; downloading the output")
        output = work / "batch-output.jsonl"
        start = time.perf_counter()
        with client.files.with_streaming_response.content(batch.output_file_id) as reply:
            reply.stream_to_file(output)
        download_s = time.perf_counter() - start
        check = check_output(output, ids, texts)
        output_bytes = output.stat().st_size
        output.unlink()
        problems = check.problems()
        if batch.error_file_id:
            problems.append(f"an error file ({batch.request_counts}), its first line: "
                            f"{_first_line(client, batch.error_file_id)}")
        if problems:
            raise RuntimeError(f"batch {batch.id}'s output: " + "; ".join(problems))
    finally:
        for file_id in made:
            with contextlib.suppress(Exception):
                client.files.delete(file_id)
    counts = batch.request_counts.model_dump() if batch.request_counts else None
    server_s = (batch.completed_at - batch.created_at
                if batch.completed_at and batch.created_at else None)
    return {
        "idle": idle, "during": during, "first_id": check.first_id,
        "first_vector": check.first_vector,
        "batch": {"id": batch.id, "upload_s": upload_s, "seconds": seconds,
                  "texts_per_s": texts / seconds, "server_seconds": server_s,
                  "statuses_at_s": seen, "download_s": download_s,
                  "output_bytes": output_bytes, "lines": check.lines,
                  "request_counts": counts}}


def _first_line(client: Any, file_id: str) -> str:
    try:
        with client.files.with_streaming_response.content(file_id) as reply:
            return next(reply.iter_lines(), "")[:500]
    except Exception as exc:  # only to say why the run failed
        return f"(not read: {exc})"


def _run_batch(client: Any, user: User, file_id: str, limits: tuple[float, float],
               made: list[str], progress: Progress) -> tuple[Any, float, dict[str, float], float]:
    """Create the batch, start the one user, poll every ``POLL_S`` until it ends: (the
    batch, seconds from create to the poll that saw it end, when each status was first
    seen, the perf_counter of that poll). ``limits``: the seconds the batch may take, and
    those it may run with no request done (a stuck runner fails the run, not hangs it).
    Anything wrong on the way cancels the batch; its files (once it ends) join ``made``."""
    timeout_s, stall_s = limits
    start = time.perf_counter()
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings",
                                  completion_window="24h")
    user.start()
    seen = {batch.status: 0.0}
    now = last_report = last_change = time.perf_counter()
    done = -1
    try:
        tick = start
        while batch.status not in TERMINAL:
            tick += POLL_S
            time.sleep(max(0.0, tick - time.perf_counter()))
            batch = client.batches.retrieve(batch.id)
            now = time.perf_counter()
            counts = batch.request_counts
            lines = f" ({counts.completed}/{counts.total} lines)" if counts else ""
            if batch.status not in seen or now - last_report >= REPORT_S:
                seen.setdefault(batch.status, round(now - start, 3))
                progress(f"batch {batch.id}: {batch.status} at {now - start:.0f} s{lines}")
                last_report = now
            if counts and counts.completed + counts.failed != done:
                done, last_change = counts.completed + counts.failed, now
            if batch.status == "in_progress" and now - last_change > stall_s:
                raise TimeoutError(f"batch {batch.id}: no request done in {stall_s:g} s "
                                   f"({done} of {counts.total if counts else '?'}); see the "
                                   "server's BatchRunner log")
            if now - start > timeout_s:
                raise TimeoutError(f"batch {batch.id} not done in {timeout_s:g} s")
    except BaseException:
        user.stop(0)
        ended = _cancelled(client, batch.id)
        made += [i for i in (ended.output_file_id, ended.error_file_id) if ended and i]
        raise
    return batch, now - start, seen, now


def _cancelled(client: Any, batch_id: str, wait_s: float = 30.0) -> Any:
    """Cancel the batch and wait (``wait_s`` at most) for it to end: the batch, or None."""
    batch = None
    with contextlib.suppress(Exception):
        batch = client.batches.cancel(batch_id)
        deadline = time.monotonic() + wait_s
        while batch.status not in TERMINAL and time.monotonic() < deadline:
            time.sleep(POLL_S)
            batch = client.batches.retrieve(batch_id)
    return batch if batch is not None and batch.status in TERMINAL else None


# --- the run -------------------------------------------------------------------------------

def settings_of(config: Path) -> Any:
    """BlitzSettings from the first application's args of a serve config (as ``blitz
    embed`` reads ./serve_config.yaml)."""
    from blitz.cli import load_settings

    return load_settings(config)


def measure(*, texts: int, rounds: int, model: str, per_line: int, url: str, serve: bool,
            embed_ray: str, api_key: str | None, idle_s: float, config: Path,
            timeout_s: float, stall_s: float = 300.0,
            progress: Progress = print) -> dict[str, Any]:
    """Every round (see the module docstring); the result as ``--out`` holds it."""
    from openai import OpenAI

    from loadtest.bulk import served

    settings = settings_of(config)
    corpus = sentences(texts)
    ids = custom_ids(texts, per_line)
    client = OpenAI(base_url=url.rstrip("/") + "/v1", api_key=api_key or "unused",
                    max_retries=2)
    user = User(url.rstrip("/"), model, api_key)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="batch-bench-") as tmp:
        work = Path(tmp)
        corpus_file, lines_file = work / "corpus.jsonl", work / "requests.jsonl"
        write_jsonl(corpus_file, ({"id": i, "text": t} for i, t in enumerate(corpus)))
        write_jsonl(lines_file, request_lines(corpus, model, per_line))
        try:
            for r in range(1, rounds + 1):
                order = ["embed", "batch"] if r % 2 else ["batch", "embed"]
                progress(f"round {r} of {rounds}: {' then '.join(order)}")
                row: dict[str, Any] = {"round": r, "order": order}
                for side in order:
                    if side == "embed":
                        out = work / f"embedded-{r}"
                        with bulk_ray("own" if serve else embed_ray, model, progress) as where:
                            row["embed"] = {**embed_round(corpus_file, out, texts, settings,
                                                          model, progress), "ray": where}
                    else:
                        with served(url, progress) if serve else contextlib.nullcontext():
                            row["batch_run"] = batch_round(client, user, lines_file, ids,
                                                           texts, idle_s, work,
                                                           (timeout_s, stall_s), progress)
                results.append(_finish_round(row, work / f"embedded-{r}", progress))
        finally:
            user.close()
    middle = medians(results)
    return {"kind": "table", "columns": COLUMNS, "rows": table_rows(results, middle),
            "config": {"texts": texts, "model": model, "rounds": rounds,
                       "texts_per_line": per_line, "cores": os.cpu_count(), "url": url,
                       "server": "scripts/serve.sh started each round" if serve
                       else f"the running server at {url}",
                       "embed_ray": "own" if serve else embed_ray, "idle_s": idle_s,
                       "poll_s": POLL_S, "config": str(config)},
            "rounds": results, "medians": middle, "environment": environment()}


def _finish_round(row: dict[str, Any], embedded: Path, progress: Progress) -> dict[str, Any]:
    """Compare the batch's first vector with blitz embed's, drop the round's bulk output,
    and lay the round's figures out as the results file keeps them."""
    import shutil

    run = row.pop("batch_run")
    first_id = run["first_id"]
    similarity = cosine(run["first_vector"], embedded_vector(embedded, int(first_id)))
    shutil.rmtree(embedded, ignore_errors=True)
    if not similarity > MIN_COSINE:
        raise RuntimeError(f"the batch's vector for id {first_id} is not blitz embed's: "
                           f"cosine {similarity:.6f}")
    row["batch"] = {**run["batch"], "first_id": first_id, "cosine_vs_embed": similarity}
    row["user"] = {"idle": run["idle"], "during": run["during"]}
    row["ratios"] = round_ratios(row)
    progress(f"round {row['round']}: blitz embed {row['embed']['texts_per_s']:.0f} texts/s, "
             f"batch API {row['batch']['texts_per_s']:.0f} texts/s, one user's p50 "
             f"{fmt(row['user']['idle']['p50_ms'])} ms idle, "
             f"{fmt(row['user']['during']['p50_ms'])} ms during")
    return row


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.batch_bench", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", type=int, default=100_000,
                        help="corpus size (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="interleaved rounds, each both sides (default: %(default)s)")
    parser.add_argument("--model", default="minilm", help="model id (default: %(default)s)")
    parser.add_argument("--texts-per-line", type=int, default=1,
                        help="texts in one request line's input (default: %(default)s)")
    parser.add_argument("--url", default=DEFAULT_URL,
                        help="the server, without the route (default: %(default)s)")
    parser.add_argument("--serve", action="store_true",
                        help="start scripts/serve.sh for each batch phase and stop it after "
                        "(nothing may be serving on --url's port)")
    parser.add_argument("--embed-ray", choices=["auto", "shared", "own"], default="auto",
                        help="without --serve, where blitz embed runs: the server's Ray "
                        "(shared), a Ray of its own beside it (own), or shared when its "
                        "free CPUs fit the job, else own (default: %(default)s)")
    parser.add_argument("--api-key", default=os.environ.get("LOADTEST_API_KEY"),
                        help="the server's API key, if it wants one (default: "
                        "$LOADTEST_API_KEY)")
    parser.add_argument("--idle-seconds", type=float, default=10.0,
                        help="the one user's idle window before each batch (default: "
                        "%(default)s)")
    parser.add_argument("--config", type=Path, default=ROOT / "serve_config.yaml",
                        help="serve config whose first application's models blitz embed "
                        "uses: the server's (default: serve_config.yaml)")
    parser.add_argument("--batch-timeout", type=float, default=4 * 3600.0,
                        help="seconds a batch may take before it is cancelled and the run "
                        "fails (default: %(default)s)")
    parser.add_argument("--stall-seconds", type=float, default=300.0,
                        help="seconds a running batch may go with no request done before "
                        "it is cancelled and the run fails (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help="the results file, written when every round passed "
                        "(default: loadtest/results/batch-api.json)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if min(args.texts, args.rounds, args.texts_per_line) < 1:
        print("error: --texts, --rounds and --texts-per-line must be >= 1", file=sys.stderr)
        return 2
    result = measure(texts=args.texts, rounds=args.rounds, model=args.model,
                     per_line=args.texts_per_line, url=args.url, serve=args.serve,
                     embed_ray=args.embed_ray, api_key=args.api_key,
                     idle_s=args.idle_seconds, config=args.config,
                     timeout_s=args.batch_timeout, stall_s=args.stall_seconds,
                     progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(markdown(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, result)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
