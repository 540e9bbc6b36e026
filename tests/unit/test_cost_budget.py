"""The request cost budget (``blitz.ingress.limits``), no Ray: every limit counted before
any work, on tiny models. Each test names a finding of issue 54 it closes: per-request
chunking only where the model opts in and bounded in windows (H1), instructions counted
before they are copied before every text (H3), ColBERT and /embed_all token vectors counted
before the pool computes them (H4), and queues that count a chunked job's windows. The
property test checks that the windows the ingress counts are the windows the pool runs."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from pydantic import ValidationError

from blitz.errors import Overloaded
from blitz.hop_messages import EmbedJob, ImageEmbedJob, image_units, units_of
from blitz.ingress.limits import BUDGET, Window, count_windows, in_jobs, windows_of
from blitz.ingress.service import EmbeddingService
from blitz.ingress.tokenizers import open_tokenizer
from blitz.loading.load import load_encoder
from blitz.pool.batching import Batcher
from blitz.pool.dispatcher import ReplicaDispatcher
from blitz.settings.config import BlitzSettings, Limits
from blitz.settings.registry import ModelSpec
from tests.api_client import api_client
from tests.error_body import error_body
from tests.tiny_hybrid import build_tiny_hybrid
from tests.tiny_models import build_tiny_bi_encoder

MAX = 16
WORDS = ("the cat sat on the mat and the dog ran to the park while seven birds sang in "
         "the old tree near the river").split()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_bi_encoder(tmp_path_factory.mktemp("tiny") / "m", hidden=16,
                                 max_seq_length=MAX, seed=3)


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    return build_tiny_hybrid(tmp_path_factory.mktemp("hybrid") / "m", seed=2)


def text(words: int, seed: int = 0) -> str:
    pick = random.Random(seed)
    return " ".join(pick.choice(WORDS) for _ in range(words))


class Served:
    """The HTTP API over a service whose dispatcher records every job it is given."""

    def __init__(self, settings: BlitzSettings):
        self.dispatcher = ReplicaDispatcher(settings)
        self.jobs: list = []
        submit = self.dispatcher.submit

        async def recorded(pool, model_id, job):
            self.jobs.append(job)
            return await submit(pool, model_id, job)

        self.dispatcher.submit = recorded  # type: ignore[method-assign]
        self.service = EmbeddingService(settings, self.dispatcher)
        self.http = api_client(self.service)


def served(models: list[dict], **limits) -> Served:
    return Served(BlitzSettings.from_args({"models": models, "limits": limits,
                                           "cpu_pool": {"max_batch_size": 8}}))


def tiny_spec(tiny, **more) -> dict:
    return {"id": "tiny", "source": str(tiny), "cpu_backend": "torch", **more}


# ---- H1: chunking per request --------------------------------------------------------

@pytest.mark.parametrize("body, param", [({"long_inputs": "chunk"}, "long_inputs"),
                                         ({"return_chunks": True}, "return_chunks")])
async def test_a_request_chunks_only_a_model_that_opts_in(tiny, body, param):
    app = served([tiny_spec(tiny)])
    r = await app.http.post("/embed", json={"texts": [text(60)], **body},
                            headers={"accept": "application/json"})
    assert r.status_code == 422, r.text
    assert error_body(r)["param"] == param and "request_chunking" in error_body(r)["message"]
    assert app.jobs == []


async def test_chunked_windows_past_the_limit_are_a_413_before_any_work(tiny):
    app = served([tiny_spec(tiny, request_chunking=True)], max_windows_per_request=20)
    texts = [text(30, seed=k) for k in range(4)] + [text(200, seed=9)]
    r = await app.http.post("/embed", json={"texts": texts, "long_inputs": "chunk"},
                            headers={"accept": "application/json"})
    assert r.status_code == 413, r.text
    body = error_body(r)
    assert "max_windows_per_request is 20" in body["message"]
    assert "texts[4]" in body["message"] and body["param"] == "texts"
    assert app.jobs == []


async def test_a_model_that_chunks_itself_is_held_to_the_window_budget_too(tiny):
    app = served([tiny_spec(tiny, long_inputs="chunk")], max_windows_per_request=10)
    r = await app.http.post("/v1/embeddings", json={"input": [text(400)], "model": "tiny"})
    assert r.status_code == 413, r.text
    assert "max_windows_per_request" in r.json()["error"]["message"]  # OpenAI's error shape
    assert app.jobs == []


async def test_chunked_jobs_carry_their_windows_and_fit_the_batch_limit(tiny):
    app = served([tiny_spec(tiny, request_chunking=True)])
    texts = [text(n, seed=n) for n in (3, 50, 4, 90, 5, 6)]
    r = await app.http.post("/embed", json={"texts": texts, "long_inputs": "chunk"},
                            headers={"accept": "application/json"})
    assert r.status_code == 200, r.text
    enc = load_encoder(ModelSpec(**tiny_spec(tiny)))
    spans = enc.chunks(texts).spans
    assert sum(units_of(job) for job in app.jobs) == sum(spans)
    for job in app.jobs:  # at most the batch limit in windows, unless one text is more
        assert units_of(job) <= 8 or len(job) == 1
    assert [t for job in app.jobs for t in job.texts] == texts


def test_chunk_overlap_must_leave_a_window_room(tiny):
    with pytest.raises(ValidationError, match="chunk_overlap"):
        ModelSpec(**tiny_spec(tiny, max_seq_length=16, chunk_overlap=16))


async def test_an_overlap_past_the_models_window_is_refused_before_any_work(tiny):
    app = served([tiny_spec(tiny, request_chunking=True, chunk_overlap=14)])  # room: 14
    r = await app.http.post("/embed", json={"texts": [text(40)], "long_inputs": "chunk"},
                            headers={"accept": "application/json"})
    assert r.status_code == 424, r.text
    assert app.jobs == []


@hsettings(max_examples=40, deadline=None,
           suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.integers(1, 120), min_size=1, max_size=6),
       overlap=st.integers(0, 13), seed=st.integers(0, 1000))
def test_the_windows_counted_on_the_ingress_are_the_windows_the_pool_runs(
        tiny, lengths, overlap, seed):
    enc = load_encoder(ModelSpec(**tiny_spec(tiny, chunk_overlap=overlap)))
    tokenizer = open_tokenizer(tiny)
    texts = [text(n, seed=seed + k) for k, n in enumerate(lengths)]
    room = MAX - len(tokenizer.encode("", add_special_tokens=True).ids)

    def own(group):
        return [len(e.ids) for e in tokenizer.encode_batch_fast(group, add_special_tokens=False)]

    counted = count_windows(texts, Window(room, room - overlap), Limits(), own)
    assert counted == enc.chunks(texts).spans
    unbounded = count_windows(texts, Window(room, room - overlap),
                              Limits(max_windows_per_request=10**6), None)
    assert all(b >= c for b, c in zip(unbounded, counted, strict=True))  # an upper bound


def test_in_jobs_keeps_order_and_the_size():
    units = [1, 5, 2, 9, 1, 1, 3]
    jobs = in_jobs(units, 6)
    assert [i for a, b, _ in jobs for i in range(a, b)] == list(range(len(units)))
    assert all(n <= 6 or b - a == 1 for a, b, n in jobs)
    assert windows_of(0, Window(10, 7)) == 1 and windows_of(11, Window(10, 7)) == 2


async def test_a_queue_counts_a_chunked_jobs_windows():
    release = asyncio.Event()

    async def run(jobs):
        await release.wait()
        return [None] * len(jobs)

    batcher = Batcher(run, max_batch=8, max_waiting=16, size=units_of, name="q")
    running = asyncio.ensure_future(batcher.submit(EmbedJob(texts=["a"])))
    await asyncio.sleep(0)
    waiting = asyncio.ensure_future(batcher.submit(EmbedJob(texts=["b"], units=10)))
    await asyncio.sleep(0)
    with pytest.raises(Overloaded):  # two texts, but 10 + 10 windows past 16
        await batcher.submit(EmbedJob(texts=["c"], units=10))
    release.set()
    await asyncio.gather(running, waiting)


# ---- H3: instructions ------------------------------------------------------------------

async def test_an_instruction_past_its_limit_is_a_413_naming_it(tiny):
    app = served([tiny_spec(tiny, instruction_template="Instruct: {instruction}\nQuery:")],
                 max_instruction_chars=64)
    r = await app.http.post("/embed", json={"texts": ["a"] * 256, "instruction": "x" * 65},
                            headers={"accept": "application/json"})
    assert r.status_code == 413, r.text
    assert error_body(r)["param"] == "instruction"
    assert "max_instruction_chars is 64" in error_body(r)["message"]
    assert app.jobs == []


async def test_a_text_with_its_instruction_is_held_to_the_text_limit(tiny):
    app = served([tiny_spec(tiny, instruction_template="Instruct: {instruction}\nQuery:")],
                 max_chars_per_text=100)
    r = await app.http.post("/embed", json={"texts": ["short", "y" * 90],
                                            "instruction": "z" * 20},
                            headers={"accept": "application/json"})
    assert r.status_code == 413, r.text
    assert "texts[1]" in error_body(r)["message"]
    assert "max_chars_per_text is 100" in error_body(r)["message"]
    assert app.jobs == []
    ok = await app.http.post("/embed", json={"texts": ["short"], "instruction": "z" * 20},
                             headers={"accept": "application/json"})
    assert ok.status_code == 200, ok.text


# ---- H4: token vectors ------------------------------------------------------------------

@pytest.mark.parametrize("route, body", [
    ("/embed_hybrid", {"outputs": ["colbert"]}),
    ("/embed_hybrid", {"outputs": ["dense", "colbert"]}),
    ("/embed_all", {}),
])
async def test_a_hybrid_models_token_vectors_are_counted_before_any_work(hybrid, route, body):
    app = served([{"id": "m3", "source": str(hybrid), "kind": "hybrid"}],
                 max_token_vectors_per_request=64)
    r = await app.http.post(route, json={"inputs": [text(30, seed=k) for k in range(8)],
                                         "model": "m3", **body},
                            headers={"accept": "application/json"})
    assert r.status_code == 413, r.text
    assert "max_token_vectors_per_request" in error_body(r)["message"]
    assert app.jobs == []


async def test_dense_and_sparse_outputs_of_a_hybrid_model_are_not_held_to_it(hybrid):
    app = served([{"id": "m3", "source": str(hybrid), "kind": "hybrid"}],
                 max_token_vectors_per_request=64)
    r = await app.http.post("/embed_hybrid", json={
        "inputs": [text(30, seed=k) for k in range(8)], "model": "m3",
        "outputs": ["dense", "sparse"]}, headers={"accept": "application/json"})
    assert r.status_code == 200, r.text


def test_every_model_kind_declares_its_cost():
    from typing import get_args

    from blitz.ingress.limits import KIND_COSTS
    from blitz.settings.registry import Kind

    assert set(KIND_COSTS) == set(get_args(Kind))


def test_every_limit_is_a_setting_and_in_the_table():
    from blitz.settings.images import ImageSettings

    assert {n for n in BUDGET if "." not in n} <= set(Limits.model_fields)
    assert {n.split(".")[1] for n in BUDGET if n.startswith("images.")} <= set(
        ImageSettings.model_fields)
    assert {"images.max_request_pixels", "images.max_job_pixels"} <= set(BUDGET)
    assert {"max_windows_per_request", "max_instruction_chars"} <= set(BUDGET)


@hsettings(max_examples=15, deadline=None,
           suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.integers(1, 60), min_size=1, max_size=8),
       limit=st.integers(8, 400), seed=st.integers(0, 1000),
       route=st.sampled_from(["/embed_all", "/embed_hybrid"]))
def test_the_token_vectors_counted_bound_the_vectors_answered(hybrid, lengths, limit, seed,
                                                              route):
    """Whatever the texts and the limit: a 413 before any job, or an answer of at most
    ``limit`` token vectors."""
    async def run() -> httpx.Response:
        app = served([{"id": "m3", "source": str(hybrid), "kind": "hybrid"}],
                     max_token_vectors_per_request=limit)
        body = {"inputs": [text(n, seed=seed + k) for k, n in enumerate(lengths)],
                "model": "m3"}
        if route == "/embed_hybrid":
            body["outputs"] = ["colbert"]
        r = await app.http.post(route, json=body, headers={"accept": "application/json"})
        assert r.status_code in (200, 413), r.text
        assert (r.status_code == 413) == (app.jobs == [])
        return r

    r = asyncio.run(run())
    if r.status_code == 200:
        rows = r.json() if route == "/embed_all" else r.json()["colbert"]
        assert sum(len(row) for row in rows) <= limit


def test_an_image_job_counts_its_megapixels_in_the_queue():
    small = ImageEmbedJob([b"a", b"b"], pixels=2 * 224 * 224)
    assert units_of(small) == 2  # one an image
    big = ImageEmbedJob([b"a"], pixels=40_000_000, units=image_units(1, 40_000_000))
    assert units_of(big) == 40 and image_units(3, 2_000_001) == 3


def test_the_reliability_docs_print_every_limit_of_the_budget():
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "reliability.md").read_text()
    section = docs.split("## The cost budget", 1)[1].split("\n## ", 1)[0]
    for name in BUDGET:
        assert f"`{name if '.' in name else 'limits.' + name}`" in section, name
