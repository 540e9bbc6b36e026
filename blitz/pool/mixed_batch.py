"""What one pool batch runs on one worker thread: any mix of one model's jobs.

Every kind of job (texts to embed, token ids to embed, a query and documents to score)
enters a pool replica's one queue per model (``blitz.pool.batching.Batcher``) and leaves it in
batches; this runs one such batch on the model. Text jobs share one padded model call
(``Encoder.embed_many``); token-id, per-token (``embed_all``) and rerank jobs run one
call each, in the same worker
turn. Each job gets its own result or exception, so one bad job fails alone.
"""

from __future__ import annotations

from typing import cast

from blitz.encoders.base import Encoded, Encoder
from blitz.encoders.bi_encoder import BiEncoder, TextJob
from blitz.errors import InvalidValue
from blitz.hop_messages import (
    ClassifyJob,
    EmbedJob,
    HybridEmbedJob,
    ImageEmbedJob,
    RerankJob,
    SparseEmbedJob,
    TokenEmbedJob,
)
from blitz.pool.image_prep import PreparedImages

Job = (EmbedJob | RerankJob | TokenEmbedJob | ClassifyJob | SparseEmbedJob | HybridEmbedJob
       | ImageEmbedJob | PreparedImages)


def run_jobs(encoder: Encoder, jobs: list[Job]) -> list[Encoded | Exception]:
    """One result or exception per job, in order."""
    results: list[Encoded | Exception | None] = [None] * len(jobs)
    texts = [(k, job) for k, job in enumerate(jobs)
             if isinstance(job, EmbedJob) and job.texts is not None]
    if texts:
        if isinstance(encoder, BiEncoder):
            merged = encoder.embed_many_sided([TextJob(
                job.texts or [], job.normalize, job.truncate, job.truncation_side,
                job.long_inputs, job.return_chunks) for _, job in texts])
        else:
            merged = [_plain_only(job) or result for (_, job), result in zip(
                texts, encoder.embed_many([(job.texts or [], job.normalize,
                                            job.truncate and job.long_inputs != "error")
                                           for _, job in texts]), strict=True)]
        for (k, _), result in zip(texts, merged, strict=True):
            results[k] = result
    for k, job in enumerate(jobs):
        if results[k] is not None:
            continue
        try:
            if isinstance(job, RerankJob):
                results[k] = encoder.score(job.query, job.documents, truncate=job.truncate)
            elif isinstance(job, TokenEmbedJob):
                results[k] = encoder.embed_all(job.texts, truncate=job.truncate,
                                               **_long(encoder, job.long_inputs))
            elif isinstance(job, ClassifyJob):
                results[k] = encoder.classify(job.inputs, truncate=job.truncate)
            elif isinstance(job, SparseEmbedJob):
                results[k] = encoder.embed_sparse(job.texts, truncate=job.truncate,
                                                  **_long(encoder, job.long_inputs))
            elif isinstance(job, HybridEmbedJob):
                results[k] = encoder.embed_hybrid(job.texts, job.outputs, truncate=job.truncate)
            elif isinstance(job, PreparedImages):  # decoded before the queue (image_prep)
                results[k] = encoder.embed_prepared(job.prepared, normalize=job.normalize)
            elif isinstance(job, ImageEmbedJob):
                results[k] = encoder.embed_image_bytes(job.images, normalize=job.normalize)
            else:
                assert job.token_ids is not None
                results[k] = encoder.embed_tokens(job.token_ids, normalize=job.normalize,
                                                  truncate=job.truncate)
        except Exception as exc:  # handed back to that job alone
            results[k] = exc
    return cast(list[Encoded | Exception], results)  # every job has its result now


def _long(encoder: Encoder, long_inputs: str | None) -> dict[str, str]:
    """A request's ``long_inputs`` for an encoder that takes it (a bi-encoder's)."""
    return {"long_inputs": long_inputs} if long_inputs and isinstance(encoder, BiEncoder) else {}


def _plain_only(job: EmbedJob) -> Exception | None:
    """The refusal of a chunking request by an encoder that cannot chunk (not a bi-encoder:
    the fake models), else None."""
    if job.return_chunks or job.long_inputs == "chunk":
        return InvalidValue("this model cannot chunk its inputs (it is not a bi-encoder); "
                            "leave long_inputs chunk and return_chunks out",
                            param="long_inputs")
    return None
