"""``blitz embed`` against its ceilings (``python -m loadtest bulk``), in one run:

- ``in-process``: the same model and backend in this process, ``load_encoder(...).embed``
  over the corpus in ``batch``-text calls, torch using every core (the ceiling);
- ``blitz embed``: ``deployments.bulk.embed_dataset`` on a local Ray (started first, not
  timed), the corpus written as ``files`` Parquet files;
- ``server`` (with ``--url``, or ``--serve`` to start ``scripts/serve.sh`` once the
  bulk job's Ray is gone, and stop it after): the same corpus through the server in
  128-text ``POST /embed`` requests, ``concurrency`` in flight, at priority low as a
  bulk client should send them.

Rows/s for each, the ratios to the ceiling, and the smallest cosine between the bulk
output and the in-process vectors.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from loadtest.corpus import sentences
from loadtest.report import markdown_table


def measure(*, texts: int, files: list[int], model: str, source: str, backends: list[str],
            batch: int, actors: int | None, url: str | None, concurrency: int,
            serve: bool = False, ceiling_texts: int | None = None,
            progress: Callable[[str], None] = print) -> dict[str, Any]:
    """For each backend and each file count, in turn: the in-process ceiling, then
    ``blitz embed`` on the same corpus split into that many files (a pair measured back to
    back, so the machine's drift hits both alike). ``ceiling_texts`` measures the ceiling
    on the corpus's first texts only (a 200,000-row run need not encode it twice)."""
    import ray

    from blitz.settings.registry import ModelSpec

    corpus = sentences(texts)
    runs: list[dict[str, Any]] = []
    ray.init(log_to_driver=False)
    # Ray Data starts its cluster-wide services (a stats actor) on first use, once per
    # cluster, like Ray's own start: outside the timed jobs.
    ray.data.range(8).map_batches(lambda batch: batch).materialize()
    try:
        for backend in backends:
            spec = ModelSpec(id=model, source=source, cpu_backend=backend)
            for count in files:
                ceiling, reference = _ceiling(spec, corpus[:ceiling_texts or texts], batch,
                                              progress)
                run = _bulk(spec, corpus, count, batch, actors, reference, progress)
                runs.append({"backend": backend, "files": count, "ceiling": ceiling,
                             **run, "vs_ceiling": run["rows_per_s"] / ceiling})
    finally:
        ray.shutdown()
    server = None
    if serve or url:
        url = url or "http://127.0.0.1:8000"
        with served(url, progress) if serve else contextlib.nullcontext():
            server = _server_row(url, corpus, model, concurrency, progress)
    return {"texts": texts, "model": model, "batch": batch, "runs": runs, "server": server}


def _ceiling(spec: Any, corpus: list[str], batch: int,
             progress: Callable[[str], None]) -> tuple[float, np.ndarray]:
    from blitz.loading.load import load_encoder

    progress(f"in-process ceiling ({spec.cpu_backend}): {len(corpus)} texts in {batch}-text "
             "calls")
    encoder = load_encoder(spec, "cpu")
    encoder.embed(corpus[:batch], normalize=True)  # warm up
    start = time.perf_counter()
    reference = np.concatenate([encoder.embed(corpus[i:i + batch], normalize=True).values
                                for i in range(0, len(corpus), batch)])
    rate = len(corpus) / (time.perf_counter() - start)
    encoder.close()
    return rate, reference


def _bulk(spec: Any, corpus: list[str], files: int, batch: int, actors: int | None,
          reference: np.ndarray, progress: Callable[[str], None]) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from blitz.settings.bulk import BulkSettings
    from blitz.settings.config import BlitzSettings
    from deployments.bulk import embed_dataset

    texts = len(corpus)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "corpus"
        root.mkdir()
        per_file = -(-texts // files)
        for k in range(files):
            chunk = range(k * per_file, min(texts, (k + 1) * per_file))
            pq.write_table(pa.table({"id": list(chunk), "text": [corpus[i] for i in chunk]}),
                           root / f"part-{k:03d}.parquet")
        progress(f"blitz embed ({spec.cpu_backend}): {texts} texts in {files} Parquet files")
        report = embed_dataset(
            str(root), f"{tmp}/out", settings=BlitzSettings(models=[spec]),
            options=BulkSettings(batch_size=batch, actors=actors, device="cpu"),
            progress=False)
        table = pa.concat_tables(pq.read_table(f) for f in sorted(Path(tmp, "out").glob(
            "*/*.parquet"))).sort_by("id")
    if table.num_rows != texts:
        raise RuntimeError(f"blitz embed wrote {table.num_rows} rows for {texts} texts")
    ids = np.asarray(table.column("id"))
    compared = ids < len(reference)
    got = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))[compared]
    want = reference[ids[compared]]
    cosines = np.sum(got * want, axis=1) / (
        np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    return {"rows_per_s": report.rows_written / report.seconds, "seconds": report.seconds,
            "timeline": report.timeline, "min_cosine": float(cosines.min()),
            "compared": int(compared.sum())}


@contextlib.contextmanager
def served(url: str, progress: Callable[[str], None]) -> Iterator[None]:
    """``bash scripts/serve.sh`` (serve_config.yaml, fast path) for the duration."""
    progress("starting the server (scripts/serve.sh)")
    root = Path(__file__).resolve().parents[1]
    server = subprocess.Popen(["bash", "scripts/serve.sh"], cwd=root, start_new_session=True,
                              env={**os.environ, "BLITZ_SKIP_INSTALL": "1"},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("the server did not start (run scripts/serve.sh to see why)")
            time.sleep(1)
        yield
    finally:
        os.killpg(server.pid, signal.SIGINT)  # serve.sh stops Serve, Ray and HAProxy
        try:
            server.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def _server_row(url: str, corpus: list[str], model: str, concurrency: int,
                progress: Callable[[str], None]) -> dict[str, Any]:
    from blitz.client import Client

    texts = len(corpus)
    progress(f"server: {texts} texts in 128-text requests, {concurrency} in flight")
    client = Client(url, timeout=300, priority="low")  # bulk work: behind interactive
    chunks = [corpus[i:i + 128] for i in range(0, texts, 128)]
    client.embed(chunks[0], model=model)  # warm up
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(lambda chunk: client.embed(chunk, model=model), chunks))
    return {"path": "server, 128-text requests",
            "rows_per_s": texts / (time.perf_counter() - start)}


def markdown(result: dict[str, Any]) -> str:
    rows = [[r["backend"], str(r["files"]), f"{r['ceiling']:.0f}", f"{r['rows_per_s']:.0f}",
             f"**{r['vs_ceiling']:.2f}**", f"{r['seconds']:.0f}", f"{r['min_cosine']:.6f}"]
            for r in result["runs"]]
    table = markdown_table(["backend", "files", "in-process rows/s", "blitz embed rows/s",
                            "x ceiling", "job s", "min cosine"], rows)
    lines = [table, "", f"{result['texts']} texts, model {result['model']}, "
             f"{result['batch']} texts per call; each row's ceiling measured just before it."]
    for r in result["runs"]:
        if len(r["timeline"]) > 2:
            marks = ", ".join(f"{rows} rows at {seconds:.0f} s ({rows / seconds:.0f}/s)"
                              for seconds, rows in r["timeline"])
            lines.append(f"\nRate as the job goes ({r['backend']}, {r['files']} files): "
                         f"{marks}")
    if result.get("server"):
        lines.append(f"\nserver, 128-text requests: {result['server']['rows_per_s']:.0f} "
                     "rows/s")
    return "\n".join(lines)
