"""What one pool batch runs on one worker thread: any mix of one model's jobs.

Every kind of job (``blitz.hop_messages``: texts or token ids to embed, a query and
documents to score, texts for per-token, sparse or hybrid vectors, inputs to classify,
images, documents of text and image parts) enters a pool replica's one queue per model (``blitz.pool.batching.Batcher``) and
leaves it in batches; this runs one such batch on the model. Text jobs share one padded
model call (``Encoder.embed_many_sided``: each job's texts as its ``text_job``); every
other job runs itself (``run(encoder)``), one call each, in the same worker turn. Each job
gets its own result or exception, so one bad job fails alone.
"""

from __future__ import annotations

from typing import cast

from blitz.encoders.base import Encoded, Encoder, TextJob
from blitz.hop_messages import (
    ClassifyJob,
    EmbedJob,
    HybridEmbedJob,
    ImageEmbedJob,
    LateChunkJob,
    MultiVectorJob,
    PartsJob,
    RerankJob,
    SparseEmbedJob,
    TokenEmbedJob,
)
from blitz.pool.image_prep import PreparedImages

Job = (EmbedJob | RerankJob | TokenEmbedJob | ClassifyJob | SparseEmbedJob | HybridEmbedJob
       | ImageEmbedJob | PreparedImages | PartsJob | MultiVectorJob | LateChunkJob)


def run_jobs(encoder: Encoder, jobs: list[Job]) -> list[Encoded | Exception]:
    """One result or exception per job, in order."""
    results: list[Encoded | Exception | None] = [None] * len(jobs)
    texts: list[tuple[int, TextJob]] = [
        (k, text) for k, job in enumerate(jobs) if (text := job.text_job()) is not None]
    if texts:
        merged = encoder.embed_many_sided([text for _, text in texts])
        for (k, _), result in zip(texts, merged, strict=True):
            results[k] = result
    for k, job in enumerate(jobs):
        if results[k] is None:
            try:
                results[k] = job.run(encoder)
            except Exception as exc:  # handed back to that job alone
                results[k] = exc
    return cast(list[Encoded | Exception], results)  # every job has its result now
