"""``python -m loadtest.priority --url URL``: interactive queries beside a bulk job.

Against a running server (``bash scripts/serve.sh``), in one run:

1. ``idle``: a loop of single-text ``POST /embed`` queries (``--query-concurrency`` in
   flight, no priority sent: normal) for ``--idle-seconds``; its p50 and p99 are the
   reference.
2. ``bulk low``: a bulk job, as a reindexing client sends it, in a process of its own:
   ``--bulk-texts`` passages in ``--bulk-batch``-text requests, ``--bulk-concurrency`` in
   flight, at priority low (``blitz.client.Client(priority="low")``), a 503 retried
   after a pause; the same query loop runs until the job ends. The queries' p50 and p99
   while the job ran, and their ratio to idle's p99 (the target: at most 2x), and whether
   the job finished (every text embedded, one row each) and how fast.
3. ``bulk normal`` (``--compare``): the same job at priority normal, as a server without
   priorities would treat it, to see what the priority changed.
4. ``bulk alone`` (``--bulk-alone``): the low job without queries: its texts/s with the
   whole server (the cost of keeping a slot for interactive work shows as the
   difference to phase 2).
5. ``idle again``: the query loop alone, to see how much this machine's speed moved.

Writes ``--out`` (JSON) when given and prints a markdown table. Every figure is measured
in this run, on this server; compare only rows of one run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np

from blitz import codecs
from loadtest.corpus import sentences
from loadtest.report import environment, markdown_table

TARGET_RATIO = 2.0  # the target: loaded p99 within 2x idle p99
RETRY_PAUSE_S = 0.5  # a bulk request answered 503 is sent again after this


# ---- the bulk job (run in a process of its own) ------------------------------------------

def passages(n: int, sentences_each: int, seed: int = 7) -> list[str]:
    """``n`` passages of ``sentences_each`` corpus sentences: documents, not queries."""
    pool = sentences(n * sentences_each, seed=seed)
    return [" ".join(pool[i:i + sentences_each]) for i in range(0, len(pool), sentences_each)]


def run_bulk(client: Any, model: str | None, texts: list[str], batch: int, concurrency: int,
             max_seconds: float) -> dict[str, Any]:
    """``texts`` through ``client`` (a ``blitz.client.Client``, which carries the job's
    priority) in ``batch``-text requests, ``concurrency`` at once; a 503 is retried until
    ``max_seconds`` have passed. Whether every text got its row, and how long it took."""
    from blitz.client import BlitzHTTPError

    chunks = [texts[i:i + batch] for i in range(0, len(texts), batch)]
    started = time.time()
    deadline = started + max_seconds
    counts = {"rows": 0, "retries_503": 0, "failed": 0}
    lock = threading.Lock()

    def send(chunk: list[str]) -> None:
        while time.time() < deadline:
            try:
                rows = client.embed(chunk, model=model).shape[0]
            except BlitzHTTPError as exc:
                if exc.status != 503:
                    break
                with lock:
                    counts["retries_503"] += 1
                time.sleep(RETRY_PAUSE_S)
                continue
            except httpx.HTTPError:
                break
            with lock:
                counts["rows"] += rows if rows == len(chunk) else 0
                counts["failed"] += 0 if rows == len(chunk) else len(chunk)
            return
        with lock:
            counts["failed"] += len(chunk)

    with ThreadPoolExecutor(concurrency) as threads:
        list(threads.map(send, chunks))
    ended = time.time()
    return {"texts": len(texts), **counts, "started": started, "ended": ended,
            "seconds": ended - started, "texts_per_s": counts["rows"] / (ended - started),
            "finished": counts["rows"] == len(texts)}


def bulk_job(url: str, model: str | None, priority: str, n: int, sentences_each: int,
             batch: int, concurrency: int, max_seconds: float) -> dict[str, Any]:
    """The bulk job as its own process runs it: a client of its own at ``priority``."""
    from blitz.client import Client

    texts = passages(n, sentences_each)
    with Client(url, timeout=max_seconds, priority=priority) as client:  # type: ignore[arg-type]
        return {"priority": priority, **run_bulk(client, model, texts, batch, concurrency,
                                                 max_seconds)}


# ---- the interactive queries -------------------------------------------------------------

def query_loop(url: str, model: str | None, stop: Callable[[], bool], concurrency: int,
               priority: str | None = None) -> tuple[list[tuple[float, float]], dict[str, int]]:
    """Single-text queries until ``stop()``: (wall-clock start, seconds) per 200, and the
    other outcomes counted by kind."""
    queries = sentences(4096, seed=11)
    done: list[tuple[float, float]] = []
    errors: dict[str, int] = {}
    lock = threading.Lock()

    def loop(worker: int) -> None:
        headers = {"content-type": codecs.MSGPACK_TYPES[0], "accept": codecs.MSGPACK_TYPES[0]}
        if priority:
            headers["x-blitz-priority"] = priority
        with httpx.Client(base_url=url, timeout=120, headers=headers) as http:
            i = worker
            while not stop():
                body = codecs.pack({"texts": [queries[i % len(queries)]],
                                    **({"model": model} if model else {})})
                i += concurrency
                at, started = time.time(), time.perf_counter()
                try:
                    status = http.post("/embed", content=body).status_code
                    kind = f"http_{status}"
                except httpx.HTTPError as exc:
                    status, kind = 0, type(exc).__name__
                seconds = time.perf_counter() - started
                with lock:
                    if status == 200:
                        done.append((at, seconds))
                    else:
                        errors[kind] = errors.get(kind, 0) + 1

    threads = [threading.Thread(target=loop, args=(w,), daemon=True) for w in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return done, errors


def latency(done: list[tuple[float, float]], since: float = 0.0,
            until: float = float("inf")) -> dict[str, Any]:
    """p50 and p99 in ms of the queries that began in [since, until)."""
    seconds = [s for at, s in done if since <= at < until]
    if not seconds:
        return {"queries": 0, "p50_ms": None, "p99_ms": None}
    return {"queries": len(seconds), "p50_ms": float(np.percentile(seconds, 50)) * 1e3,
            "p99_ms": float(np.percentile(seconds, 99)) * 1e3}


# ---- the phases --------------------------------------------------------------------------

def idle_phase(args: argparse.Namespace, name: str) -> dict[str, Any]:
    ends = time.monotonic() + args.idle_seconds
    done, errors = query_loop(args.url, args.model, lambda: time.monotonic() > ends,
                              args.query_concurrency)
    return {"phase": name, **latency(done), "errors": errors}


def bulk_phase(args: argparse.Namespace, name: str, priority: str,
               queries: bool = True) -> dict[str, Any]:
    """The bulk job in a process of its own, with the query loop beside it until it ends
    (queries counted from ``--settle-seconds`` after the job's start to its end)."""
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        job = pool.apply_async(bulk_job, (args.url, args.model, priority, args.bulk_texts,
                                          args.passage_sentences, args.bulk_batch,
                                          args.bulk_concurrency, args.max_bulk_seconds))
        if queries:
            done, errors = query_loop(args.url, args.model, job.ready, args.query_concurrency)
        else:
            done, errors = [], {}
        bulk = job.get()
    measured = latency(done, bulk["started"] + args.settle_seconds, bulk["ended"])
    return {"phase": name, **measured, "errors": errors, "bulk": bulk}


def run(args: argparse.Namespace, progress: Callable[[str], None] = print) -> dict[str, Any]:
    progress(f"warming up {args.url}")
    query_loop(args.url, args.model, _after(3), 1)
    phases = []
    plan: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("idle", lambda: idle_phase(args, "idle")),
        ("bulk low", lambda: bulk_phase(args, "bulk low", "low"))]
    if args.compare:
        plan.append(("bulk normal", lambda: bulk_phase(args, "bulk normal", "normal")))
    if args.bulk_alone:
        plan.append(("bulk alone", lambda: bulk_phase(args, "bulk alone", "low", False)))
    plan.append(("idle again", lambda: idle_phase(args, "idle again")))
    for name, measure in plan:
        progress(f"phase: {name}")
        phases.append(measure())
    idle_p99 = phases[0]["p99_ms"]
    for phase in phases:
        phase["p99_over_idle"] = (phase["p99_ms"] / idle_p99 if phase["p99_ms"] and idle_p99
                                  else None)
    low = phases[1]
    verdict = {"p99_within_target": bool(low["p99_over_idle"] is not None
                                         and low["p99_over_idle"] <= TARGET_RATIO),
               "bulk_finished": bool(low["bulk"]["finished"]), "target_ratio": TARGET_RATIO}
    return {"environment": environment(), "options": vars(args), "phases": phases,
            "verdict": verdict}


def _after(seconds: float) -> Callable[[], bool]:
    ends = time.monotonic() + seconds
    return lambda: time.monotonic() > ends


def markdown(result: dict[str, Any]) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    rows = []
    for p in result["phases"]:
        bulk = p.get("bulk")
        rows.append([
            p["phase"], str(p["queries"]), ms(p["p50_ms"]), ms(p["p99_ms"]),
            "-" if p["p99_over_idle"] is None else f"{p['p99_over_idle']:.2f}x",
            f"{bulk['rows']}/{bulk['texts']}" if bulk else "-",
            f"{bulk['seconds']:.1f}" if bulk else "-",
            f"{bulk['texts_per_s']:.0f}" if bulk else "-",
            str(bulk["retries_503"]) if bulk else "-",
            ", ".join(f"{k} {v}" for k, v in p["errors"].items()) or "-"])
    table = markdown_table(["phase", "queries", "p50 ms", "p99 ms", "p99 / idle p99",
                            "bulk rows", "bulk s", "bulk texts/s", "bulk 503s",
                            "query errors"], rows)
    v = result["verdict"]
    return (f"{table}\n\nQueries' p99 while the low-priority job ran: within "
            f"{v['target_ratio']:g}x of idle p99: {'yes' if v['p99_within_target'] else 'NO'}; "
            f"the job finished: {'yes' if v['bulk_finished'] else 'NO'}.\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.priority", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the server")
    parser.add_argument("--model", default=None, help="model id (default: the server's)")
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    parser.add_argument("--query-concurrency", type=int, default=1,
                        help="single-text queries in flight")
    parser.add_argument("--bulk-texts", type=int, default=8192, help="passages in the job")
    parser.add_argument("--passage-sentences", type=int, default=2,
                        help="corpus sentences per passage (~25 tokens each)")
    parser.add_argument("--bulk-batch", type=int, default=128, help="texts per bulk request")
    parser.add_argument("--bulk-concurrency", type=int, default=8,
                        help="bulk requests in flight (enough to fill the server's queues)")
    parser.add_argument("--max-bulk-seconds", type=float, default=900.0,
                        help="the job gives up after this long (then it did not finish)")
    parser.add_argument("--settle-seconds", type=float, default=2.0,
                        help="queries in the job's first seconds are not counted")
    parser.add_argument("--compare", action="store_true",
                        help="also run the job at priority normal (no priority)")
    parser.add_argument("--bulk-alone", action="store_true",
                        help="also run the low job without queries (its full speed)")
    parser.add_argument("--out", help="write the result as JSON here")
    args = parser.parse_args(argv)
    result = run(args, progress=lambda line: print(line, file=sys.stderr))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    print(markdown(result))
    v = result["verdict"]
    return 0 if v["p99_within_target"] and v["bulk_finished"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
