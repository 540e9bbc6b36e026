"""One pool batch of mixed job kinds (blitz/pool/work.run_jobs): each job gets what it
would get alone, in order, and a bad job fails alone."""

from __future__ import annotations

import numpy as np

from blitz.encoders.fake import FakeEncoder
from blitz.errors import InputTooLong
from blitz.hop_messages import EmbedJob, RerankJob
from blitz.pool.mixed_batch import run_jobs


def test_a_mixed_batch_answers_each_job_as_if_it_ran_alone():
    encoder = FakeEncoder("fake", 8, max_seq_length=6)
    jobs = [EmbedJob(texts=["a b", "c"]), RerankJob("q", ["a b", "x y z"]),
            EmbedJob(token_ids=[[1, 2], [3]], normalize=False),
            EmbedJob(texts=["one two three four five"], truncate=False),  # too long: alone
            EmbedJob(texts=["d"], normalize=False)]
    results = run_jobs(encoder, jobs)
    assert len(results) == len(jobs)
    assert isinstance(results[3], InputTooLong)
    alone = [encoder.embed(["a b", "c"], normalize=True),
             encoder.score("q", ["a b", "x y z"]),
             encoder.embed_tokens([[1, 2], [3]], normalize=False),
             None,
             encoder.embed(["d"], normalize=False)]
    for got, want in zip(results, alone, strict=True):
        if want is not None:
            assert np.array_equal(got.values, want.values)
            assert np.array_equal(got.token_counts, want.token_counts)
