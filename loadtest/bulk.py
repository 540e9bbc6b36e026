"""``blitz embed`` against its ceilings (``python -m loadtest bulk``), in one run:

- ``in-process``: the same model and backend in this process, ``load_encoder(...).embed``
  over the corpus in ``batch``-text calls, torch using every core (the ceiling);
- ``blitz embed``: ``deployments.bulk.embed_dataset`` on a local Ray (started first, not
  timed), the corpus written as ``files`` Parquet files;
- ``server`` (with ``--url``, or ``--serve`` to start ``scripts/serve.sh`` once the
  bulk job's Ray is gone, and stop it after): the same corpus through the server in
  128-text ``POST /embed`` requests, ``concurrency`` in flight.

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


def measure(*, texts: int, files: int, model: str, source: str, backend: str,
            batch: int, actors: int | None, url: str | None, concurrency: int,
            serve: bool = False, progress: Callable[[str], None] = print) -> dict[str, Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq
    import ray

    from blitz.config import BlitzSettings, BulkSettings
    from blitz.encoders.loading import load_encoder
    from blitz.registry import ModelSpec
    from deployments.bulk import embed_dataset

    corpus = sentences(texts)
    spec = ModelSpec(id=model, source=source, cpu_backend=backend)
    rows: list[dict[str, Any]] = []

    progress(f"in-process ceiling: {texts} texts in {batch}-text calls")
    encoder = load_encoder(spec, "cpu")
    encoder.embed(corpus[:batch], normalize=True)  # warm up
    start = time.perf_counter()
    reference = np.concatenate([encoder.embed(corpus[i:i + batch], normalize=True).values
                                for i in range(0, texts, batch)])
    ceiling = texts / (time.perf_counter() - start)
    rows.append({"path": "in-process", "rows_per_s": ceiling})
    encoder.close()

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "corpus"
        root.mkdir()
        per_file = -(-texts // files)
        for k in range(files):
            chunk = range(k * per_file, min(texts, (k + 1) * per_file))
            pq.write_table(pa.table({"id": list(chunk), "text": [corpus[i] for i in chunk]}),
                           root / f"part-{k:03d}.parquet")
        ray.init(log_to_driver=False)
        try:
            progress(f"blitz embed: {files} Parquet files on a local Ray")
            report = embed_dataset(
                str(root), f"{tmp}/out", settings=BlitzSettings(models=[spec]),
                options=BulkSettings(batch_size=batch, actors=actors, device="cpu"))
        finally:
            ray.shutdown()
        table = pa.concat_tables(pq.read_table(f) for f in sorted(Path(tmp, "out").glob(
            "*/*.parquet"))).sort_by("id")  # OUTPUT/<unit>/*.parquet; units end .parquet too
        if table.num_rows != texts:
            raise RuntimeError(f"blitz embed wrote {table.num_rows} rows for {texts} texts")
        got = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
    ids = np.asarray(table.column("id"))
    want = reference[ids]
    cosines = np.sum(got * want, axis=1) / (
        np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    rows.append({"path": "blitz embed", "rows_per_s": report.rows_written / report.seconds})

    if serve:
        url = url or "http://127.0.0.1:8000"
        with served(url, progress):
            rows.append(_server_row(url, corpus, model, concurrency, progress))
    elif url:
        rows.append(_server_row(url, corpus, model, concurrency, progress))
    for row in rows:
        row["vs_ceiling"] = row["rows_per_s"] / ceiling
    return {"texts": texts, "files": files, "model": model, "backend": backend,
            "batch": batch, "rows_written": report.rows_written, "rows": rows,
            "min_cosine": float(cosines.min()), "compared": int(len(ids))}


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
    client = Client(url, timeout=300)
    chunks = [corpus[i:i + 128] for i in range(0, texts, 128)]
    client.embed(chunks[0], model=model)  # warm up
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(lambda chunk: client.embed(chunk, model=model), chunks))
    return {"path": "server, 128-text requests",
            "rows_per_s": texts / (time.perf_counter() - start)}


def markdown(result: dict[str, Any]) -> str:
    table = markdown_table(
        ["path", "rows/s", "x ceiling"],
        [[r["path"], f"{r['rows_per_s']:.0f}", f"{r['vs_ceiling']:.2f}"]
         for r in result["rows"]])
    return (f"{table}\n\n{result['texts']} texts, {result['files']} files, model "
            f"{result['model']} ({result['backend']}); min cosine bulk vs in-process over "
            f"{result['compared']} rows: {result['min_cosine']:.6f}")
