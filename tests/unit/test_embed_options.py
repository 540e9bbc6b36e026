"""An embedding request's options travel as one value (``EmbedOptions``): the body builds
it, the service's handle face takes exactly its fields, and the vector cache keys by it."""

from __future__ import annotations

import dataclasses
import inspect

from blitz.hop_messages import EmbedOptions
from blitz.http.bodies import EmbedRequest
from blitz.ingress.service import EmbeddingService

FIELDS = [f.name for f in dataclasses.fields(EmbedOptions)]


def test_the_service_s_keywords_are_the_options_fields():
    parameters = inspect.signature(EmbeddingService.embed).parameters
    assert set(parameters) - {"self", "texts", "model", "token_ids", "record"} == set(FIELDS)
    for name in FIELDS:  # the same defaults: a handle call means what a body means
        assert parameters[name].default == getattr(EmbedOptions(), name), name


def test_the_embed_body_carries_every_option():
    body = EmbedRequest.parse({
        "texts": ["a"], "normalize": False, "truncate": False, "truncation_side": "left",
        "long_inputs": "chunk", "return_chunks": True, "dimensions": 4, "dtype": "int8",
        "prompt_name": "query", "instruction": "find"})
    assert body.options() == EmbedOptions(False, False, "left", "chunk", True, 4, "int8",
                                          "query", "find")
    assert EmbedRequest.parse({"inputs": "a"}).options() == EmbedOptions()
    tei = EmbedRequest.parse({"inputs": "a", "truncation_direction": "Left"}).options()
    assert tei.truncation_side == "left"
    assert EmbedOptions(**EmbedOptions(dimensions=3).keywords()) == EmbedOptions(dimensions=3)


def test_the_job_takes_the_options_and_the_model_s_default():
    job = EmbedOptions(truncation_side="left", long_inputs="chunk").job(["a"], True)
    assert (job.texts, job.normalize, job.truncate, job.truncation_side, job.long_inputs,
            job.return_chunks) == (["a"], True, True, "left", "chunk", False)
    assert not EmbedOptions(normalize=False).job(["a"], True).normalize
