"""The in-process ceiling: how fast the model embeds the corpus with no server at all.

Two engines on the same texts and call sizes:

- ``blitz``: ``blitz.loading.load.load_encoder(spec).embed(texts, normalize=True)``, the code
  a pool replica runs (token-budget micro-batches, the spec's CPU backend);
- ``sentence-transformers``: plain ``SentenceTransformer.encode`` in float32 with its
  default ``batch_size=32``, what a naive server calls.

Served throughput divided by this ceiling is the serving efficiency (BENCHMARKS.md).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from loadtest.corpus import batched, sentences
from loadtest.cpu import machine_cpu_s
from loadtest.progress import NoProgress, Progress
from loadtest.report import environment, fmt, markdown_table

EmbedFn = Callable[[list[str]], Any]


@dataclass(frozen=True)
class CeilingRow:
    engine: str
    backend: str
    texts_per_call: int
    calls: int
    embeddings: int
    seconds: float
    embeddings_per_s: float
    ms_per_call_p50: float
    ms_per_call_mean: float
    others_busy_pct: float | None = None  # machine CPU used by other processes meanwhile
    callers: int = 1  # threads calling at once


def measure(embed: EmbedFn, texts: list[str], texts_per_call: int, seconds: float, *,
            engine: str, backend: str, warmup_calls: int = 2, min_calls: int = 3,
            callers: int = 1) -> CeilingRow:
    """Call ``embed`` on consecutive corpus batches for ``seconds`` (and ``min_calls``);
    with ``callers`` above 1, that many threads call it at once (as a pool with several
    ``workers`` does), each on its own part of the corpus."""
    def calls(batches: Iterator[list[str]], latencies: list[float], start: float) -> None:
        while len(latencies) < min_calls or time.perf_counter() - start < seconds:
            batch = next(batches)
            t = time.perf_counter()
            embed(batch)
            latencies.append(time.perf_counter() - t)

    streams = [batched(itertools.islice(itertools.cycle(texts), k * len(texts) // callers, None),
                       texts_per_call) for k in range(callers)]
    for _ in range(warmup_calls):
        embed(next(streams[0]))
    per_caller: list[list[float]] = [[] for _ in range(callers)]
    machine0, own0 = machine_cpu_s(), time.process_time()
    start = time.perf_counter()
    if callers == 1:
        calls(streams[0], per_caller[0], start)
    else:
        threads = [threading.Thread(target=calls, args=(stream, lat, start))
                   for stream, lat in zip(streams, per_caller, strict=True)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    elapsed = time.perf_counter() - start
    machine1, own1 = machine_cpu_s(), time.process_time()
    others = None
    if machine1[1] > machine0[1]:
        busy = machine1[0] - machine0[0] - (own1 - own0)
        others = max(0.0, 100 * busy / (machine1[1] - machine0[1]))
    ms = 1000 * np.asarray([t for lat in per_caller for t in lat])
    return CeilingRow(engine, backend, texts_per_call, len(ms), len(ms) * texts_per_call,
                      elapsed, len(ms) * texts_per_call / elapsed, float(np.median(ms)),
                      float(ms.mean()), others, callers)


def blitz_embed(model_id: str, source: str, backend: str) -> EmbedFn:
    from blitz.loading.load import load_encoder
    from blitz.settings.registry import ModelSpec

    encoder = load_encoder(ModelSpec(id=model_id, source=source, cpu_backend=backend))
    return lambda texts: encoder.embed(texts, normalize=True)


def sentence_transformers_embed(model_id: str, source: str) -> EmbedFn:
    from sentence_transformers import SentenceTransformer

    from blitz.loading.fetch import resolve_source
    from blitz.settings.registry import ModelSpec

    path = resolve_source(ModelSpec(id=model_id, source=source))
    model = SentenceTransformer(str(path), device="cpu", local_files_only=True)
    return lambda texts: model.encode(texts, normalize_embeddings=True, convert_to_numpy=True,
                                      show_progress_bar=False)


def run_inprocess(*, model_id: str, source: str, backend: str, sizes: Sequence[int],
                  seconds: float, compare_raw: bool = True, seed: int = 0,
                  callers: int = 1, progress: Progress | None = None) -> list[CeilingRow]:
    progress = progress or NoProgress()
    texts = sentences(4096, seed)
    engines: list[tuple[str, str, Callable[[], EmbedFn]]] = [
        ("blitz", backend, lambda: blitz_embed(model_id, source, backend))]
    if compare_raw:
        engines.append(("sentence-transformers", "torch",
                        lambda: sentence_transformers_embed(model_id, source)))
    rows = []
    for engine, engine_backend, load in engines:
        progress.done(f"loading {engine} ({engine_backend})")
        embed = load()
        for size in sizes:
            progress.update(f"{engine} {engine_backend}: {size} texts/call for {seconds:g}s")
            row = measure(embed, texts, size, seconds, engine=engine, backend=engine_backend,
                          callers=callers)
            rows.append(row)
            progress.done(f"{engine} {engine_backend}: {size} texts/call -> "
                          f"{row.embeddings_per_s:.1f} emb/s")
    return rows


def torch_threads() -> int | None:
    """Intra-op threads of one model call (``blitz.runtime.model_threads``), torch or ONNX."""
    from blitz.runtime import model_threads

    return model_threads.count()


def document(rows: Sequence[CeilingRow]) -> dict[str, Any]:
    return {"kind": "inprocess", "environment": {**environment(),
                                                 "torch_threads": torch_threads()},
            "results": [asdict(r) for r in rows]}


def markdown(rows: Sequence[CeilingRow]) -> str:
    headers = ["engine", "backend", "texts/call", "calls", "emb/s", "ms/call p50",
               "ms/call mean", "others %", "callers"]
    return markdown_table(headers, [
        [r.engine, r.backend, str(r.texts_per_call), str(r.calls), fmt(r.embeddings_per_s),
         fmt(r.ms_per_call_p50), fmt(r.ms_per_call_mean), fmt(r.others_busy_pct, 0),
         str(r.callers)]
        for r in rows])
