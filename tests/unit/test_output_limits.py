"""Every output bounded like the inputs, in process (no Ray):
``limits.max_tokens_per_request`` (``/tokenize``, gRPC ``Tokenize``),
``limits.max_token_vectors_per_request`` (``/embed_all``, gRPC ``EmbedAll``), gRPC's
bytes in flight held to ``limits.max_buffered_bytes``, a sparse model's
``sparse_token_budget`` and its max taken before ``log1p(relu(.))``, and large replies
built off the event loop. Each limit: just under answers, just over is refused, naming
it."""

from __future__ import annotations

import asyncio
import threading
import time
import tracemalloc

import grpc
import httpx
import numpy as np
import pytest

from blitz.encoders.base import Encoded
from blitz.errors import PayloadTooLarge
from blitz.grpc_api import tei_pb2 as pb
from blitz.grpc_api.servicer import TeiServicer
from blitz.http import reply_bodies, responses
from blitz.ingress import tokenizing
from blitz.ingress.service import EmbeddingService
from blitz.ingress.services import Services
from blitz.ingress.tokenizing import TokenService
from blitz.pool.dispatcher import ReplicaDispatcher
from blitz.settings.config import BlitzSettings, PoolSettings
from tests.api_client import api_client, tei_servicer
from tests.tiny_models import build_tiny_bi_encoder, build_tiny_splade, minilm_dir

WORDS = "the quick brown fox jumps over the lazy dog "


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_bi_encoder(tmp_path_factory.mktemp("tiny") / "m", hidden=16,
                                 max_seq_length=32, seed=5)


@pytest.fixture(scope="module")
def reference():
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(minilm_dir() / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def make_service(limits: dict, models: list | None = None) -> EmbeddingService:
    settings = BlitzSettings.from_args({
        "models": models or [{"id": "minilm", "source": str(minilm_dir())},
                             {"id": "fake", "source": "fake:8"}],
        "limits": {"max_chars_per_text": 100_000, **limits}})
    return EmbeddingService(settings, ReplicaDispatcher(settings))


def servicer(service: EmbeddingService) -> TeiServicer:
    return tei_servicer(service)


class Context:
    """What the servicer uses of a gRPC context, recording the status."""

    def __init__(self, model: str | None = None):
        self.metadata = (("model", model),) if model else ()
        self.code, self.details = grpc.StatusCode.OK, ""

    def invocation_metadata(self):
        return self.metadata

    def set_code(self, code):
        self.code = code

    def set_details(self, details):
        self.details = details

    def set_trailing_metadata(self, metadata):
        pass


async def client(service: EmbeddingService) -> httpx.AsyncClient:
    return api_client(service)


def count(reference, texts: list[str], specials: bool = True) -> int:
    return sum(len(e.ids) for e in reference.encode_batch(texts, add_special_tokens=specials))


# ---- limits.max_tokens_per_request ----------------------------------------------------


async def test_tokenize_at_the_limit_answers_one_over_is_a_413_naming_it(reference):
    texts = [WORDS * 3, "naïve café — 東京", WORDS]
    exact = count(reference, texts)
    async with await client(make_service({"max_tokens_per_request": exact})) as c:
        r = await c.post("/tokenize", json={"inputs": texts})
        assert r.status_code == 200, r.text
        assert sum(map(len, r.json())) == exact
    async with await client(make_service({"max_tokens_per_request": exact - 1})) as c:
        r = await c.post("/tokenize", json={"inputs": texts})
        assert r.status_code == 413, r.text
        assert f"the limit max_tokens_per_request is {exact - 1}" in r.text


async def test_grpc_tokenize_is_held_to_the_same_limit(reference):
    text = WORDS * 4
    exact = count(reference, [text], specials=False)  # proto3: add_special_tokens false
    for limit, code in ((exact, grpc.StatusCode.OK),
                        (exact - 1, grpc.StatusCode.INVALID_ARGUMENT)):
        tei, context = servicer(make_service({"max_tokens_per_request": limit})), Context()
        reply = await tei.unary("Tokenize", pb.EncodeRequest(inputs=text), context)
        assert context.code == code, context.details
        if code == grpc.StatusCode.OK:
            assert len(reply.tokens) == exact
        else:
            assert f"the limit max_tokens_per_request is {limit}" in context.details


async def test_tokenizing_stops_within_one_group_of_the_limit(monkeypatch):
    """A request far over the limit is not tokenized whole: tokenizing stops at the first
    group of texts (GROUP_CHARS characters) that passes it."""
    monkeypatch.setattr(tokenizing, "GROUP_CHARS", 1000)
    seen: list[int] = []
    real = tokenizing.groups

    def spied(texts, chars=None):
        for group in real(texts, tokenizing.GROUP_CHARS):
            seen.append(len(group))
            yield group

    monkeypatch.setattr(tokenizing, "groups", spied)
    service = make_service({"max_tokens_per_request": 500})
    with pytest.raises(PayloadTooLarge, match="max_tokens_per_request is 500"):
        await TokenService(service).tokenize([WORDS * 10] * 200, model="minilm")
    # each 440-character text gives ~92 tokens: the limit passes in the third group of two
    assert sum(seen) <= 6 < 200


def traced_peak() -> int:
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


async def test_memory_stays_bounded_past_the_limit(reference):
    """A request ten times over the limit is refused having held no more Python memory
    than one that fits (tokenizing stops within one group of the limit)."""
    limit = 40_000
    text = WORDS * 400  # ~3,600 tokens, 17,600 characters
    per_text = count(reference, [text])
    tokens = TokenService(make_service({"max_tokens_per_request": limit,
                                        "max_texts_per_request": 200}))
    fits, over = [text] * (limit // per_text), [text] * (10 * (limit // per_text + 1))
    await tokens.tokenize("warm the tokenizer up", model="minilm")
    tracemalloc.start()
    result = await tokens.tokenize(fits, model="minilm")
    at_limit = traced_peak()
    assert sum(map(len, result.tokens)) <= limit
    del result
    tracemalloc.start()
    with pytest.raises(PayloadTooLarge, match=f"max_tokens_per_request is {limit}"):
        await tokens.tokenize(over, model="minilm")
    refused = traced_peak()
    assert refused <= 1.25 * at_limit, (refused, at_limit)


async def test_the_event_loop_keeps_ticking_through_a_reply_at_the_limit(reference,
                                                                         monkeypatch):
    """At the limit, the request's Python memory is a bounded amount per token, and its
    tokenizing, reply building and encoding all run off the event loop's thread, so the
    loop keeps serving meanwhile (its longest stall is measured and shown; asserting a
    time would fail on a loaded machine, not on a broken server)."""
    limit = 40_000
    text = WORDS * 400
    fits = [text] * (limit // count(reference, [text]))
    spans: dict[str, tuple[float, float, bool]] = {}

    def timed(name, work):
        def run(*args, **kwargs):
            started = time.perf_counter()
            try:
                return work(*args, **kwargs)
            finally:
                spans[name] = (started, time.perf_counter(),
                               threading.current_thread() is threading.main_thread())
        return run

    monkeypatch.setattr(tokenizing, "tokenize", timed("tokenize", tokenizing.tokenize))
    monkeypatch.setattr(reply_bodies, "tokenize_reply", timed("reply", reply_bodies.tokenize_reply))
    monkeypatch.setattr(responses.JSONBytesResponse, "render",
                        timed("encode", responses.JSONBytesResponse.render))
    service = make_service({"max_tokens_per_request": limit, "max_texts_per_request": 200})
    async with await client(service) as c:
        await c.post("/tokenize", json={"inputs": "warm the tokenizer up"})
        ticks: list[float] = []
        stop = asyncio.Event()

        async def ticker() -> None:
            while not stop.is_set():
                ticks.append(time.perf_counter())
                await asyncio.sleep(0.0005)

        tick = asyncio.ensure_future(ticker())
        await asyncio.sleep(0.005)
        tracemalloc.start()
        r = await c.post("/tokenize", json={"inputs": fits})
        peak = traced_peak()
        stop.set()
        await tick
    assert r.status_code == 200
    assert peak < 2048 * limit  # ~0.6 KB a token (rows, reply, JSON) measured
    first = min(start for start, _, _ in spans.values())
    last = max(end for _, end, _ in spans.values())
    gaps = np.diff([t for t in ticks if first <= t <= last])
    stall = f"longest loop stall {gaps.max() if gaps.size else 0:.4f} s of {last - first:.4f} s"
    assert set(spans) == {"tokenize", "reply", "encode"}, stall
    on_loop = [name for name, (_, _, main) in spans.items() if main]
    assert on_loop == [], f"{on_loop} ran on the event loop's thread; {stall}"


async def test_a_large_reply_is_encoded_in_another_thread(monkeypatch):
    """``responses.built`` builds (and renders) a reply over ``INLINE_VALUES`` values in a
    thread while the loop keeps ticking; a small one stays inline."""
    where: list[bool] = []
    real = reply_bodies.tokenize_reply

    def spied(result):
        where.append(threading.current_thread() is threading.main_thread())
        return real(result)

    monkeypatch.setattr(reply_bodies, "tokenize_reply", spied)
    async with await client(make_service({"max_texts_per_request": 100})) as c:
        assert (await c.post("/tokenize", json={"inputs": "small"})).status_code == 200
        big = [WORDS * 100] * 20  # ~18,000 tokens: 90,000 values
        assert (await c.post("/tokenize", json={"inputs": big})).status_code == 200
    assert where == [True, False]

    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    def slow() -> responses.Response:
        deadline = time.perf_counter() + 0.05
        while time.perf_counter() < deadline:  # holds the GIL only as Python code does
            pass
        return responses.JSONBytesResponse([1])

    tick = asyncio.ensure_future(ticker())
    await asyncio.sleep(0)
    before = ticks
    await responses.built(slow, responses.INLINE_VALUES + 1)
    during = ticks - before
    tick.cancel()
    assert during > 1  # the loop ran while the reply was being built


# ---- limits.max_token_vectors_per_request --------------------------------------------


def embed_all_service(tiny, limit: int, **limits) -> EmbeddingService:
    return make_service({"max_token_vectors_per_request": limit, **limits},
                        [{"id": "tiny", "source": str(tiny), "cpu_backend": "torch",
                          "max_seq_length": 32},
                         {"id": "fake", "source": "fake:8"}])


def submits(service: EmbeddingService) -> list:
    calls: list = []
    real = service.dispatcher.submit

    async def spied(pool, model_id, job):
        calls.append(job)
        return await real(pool, model_id, job)

    service.dispatcher.submit = spied
    return calls


async def test_embed_all_at_the_limit_answers_one_over_is_refused_before_the_pool(tiny,
                                                                              reference):
    texts = [WORDS, "short", WORDS[:20], "naïve café"]  # under the tiny model's 32 tokens
    exact = count(reference, texts)
    service = embed_all_service(tiny, exact)
    calls = submits(service)
    async with await client(service) as c:
        r = await c.post("/embed_all", json={"inputs": texts, "model": "tiny"})
        assert r.status_code == 200, r.text
        assert sum(len(rows) for rows in r.json()) == exact
    assert calls
    service = embed_all_service(tiny, exact - 1)
    calls = submits(service)
    async with await client(service) as c:
        r = await c.post("/embed_all", json={"inputs": texts, "model": "tiny"})
        assert r.status_code == 413, r.text
        assert f"the limit max_token_vectors_per_request is {exact - 1}" in r.text
    assert calls == []  # counted on the ingress: no model work


async def test_embed_all_counts_truncated_texts_at_the_models_length(tiny):
    """Texts past the model's max length (32) count 32 each, as the pool gives them; a
    request whose texts cannot pass the limit even at that length is not counted at all."""
    texts = [WORDS * 5] * 3  # ~50 tokens each, truncated to 32
    for limit, status in ((96, 200), (95, 413)):
        service = embed_all_service(tiny, limit)
        async with await client(service) as c:
            r = await c.post("/embed_all", json={"inputs": texts, "model": "tiny"})
            assert r.status_code == status, r.text
    service = embed_all_service(tiny, 96)
    outputs = Services.of(service).outputs
    await outputs.embed_all(texts, model="tiny")
    assert outputs.tokens.tokenizers._held == {}  # 3 x 32 <= 96: nothing to count


async def test_grpc_embed_all_is_held_to_the_same_limit(tiny, reference):
    text = WORDS
    exact = count(reference, [text])
    for limit, code in ((exact, grpc.StatusCode.OK),
                        (exact - 1, grpc.StatusCode.INVALID_ARGUMENT)):
        tei, context = servicer(embed_all_service(tiny, limit)), Context("tiny")
        reply = await tei.unary("EmbedAll", pb.EmbedAllRequest(inputs=text), context)
        assert context.code == code, context.details
        if code == grpc.StatusCode.OK:
            assert len(reply.token_embeddings) == exact
        else:
            assert f"the limit max_token_vectors_per_request is {limit}" in context.details


async def test_a_model_the_ingress_cannot_count_is_held_to_it_on_the_pools_reply(tiny):
    service = embed_all_service(tiny, 10)

    async def pool(pool, model_id, job):  # a stand-in for a model with no files here
        n = 5 * len(job)
        return Encoded(np.zeros((n, 4), np.float32), np.full(len(job), 5, np.int64), n)

    service.dispatcher.submit = pool  # "fake" has no tokenizer on the ingress
    outputs = Services.of(service).outputs
    assert len((await outputs.embed_all(["a", "b"], model="fake")).embeddings) == 2
    with pytest.raises(PayloadTooLarge, match="max_token_vectors_per_request is 10"):
        await outputs.embed_all(["a", "b", "c"], model="fake")


# ---- gRPC bytes in flight: limits.max_buffered_bytes ----------------------------------


async def test_grpc_messages_in_flight_are_held_to_max_buffered_bytes():
    limit = 2048
    tei = servicer(make_service({"max_buffered_bytes": limit, "max_body_bytes": 1024}))
    # a 2-byte length and a tag: 3 bytes around the text
    fits, over = (pb.EmbedRequest(inputs="a" * (limit - 3)),
                  pb.EmbedRequest(inputs="a" * (limit - 2)))
    assert (fits.ByteSize(), over.ByteSize()) == (limit, limit + 1)
    context = Context("fake")
    reply = await tei.unary("Embed", fits, context)
    assert context.code == grpc.StatusCode.OK and len(reply.embeddings) == 8
    context = Context("fake")
    await tei.unary("Embed", over, context)
    assert context.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"the limit max_buffered_bytes ({limit})" in context.details
    assert tei.held_bytes == 0

    # across calls: what other calls hold counts, and is given back when they end
    release = asyncio.Event()
    real = tei.service.embed

    async def held(*args, **kwargs):
        await release.wait()
        return await real(*args, **kwargs)

    tei.service.embed = held
    first = asyncio.ensure_future(tei.unary("Embed", pb.EmbedRequest(inputs="a" * 1500),
                                            Context("fake")))
    await asyncio.sleep(0.01)
    assert tei.held_bytes == 1503
    context = Context("fake")
    await tei.unary("Embed", pb.EmbedRequest(inputs="b" * 600), context)
    assert context.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    release.set()
    await first
    assert tei.held_bytes == 0
    context = Context("fake")
    await tei.unary("Embed", pb.EmbedRequest(inputs="b" * 600), context)
    assert context.code == grpc.StatusCode.OK


@pytest.mark.parametrize("method", ["EmbedStream", "TokenizeStream"])
async def test_a_stream_past_the_bytes_in_flight_ends_resource_exhausted(method):
    tei = servicer(make_service({"max_buffered_bytes": 2048, "max_body_bytes": 1024}))
    message = (pb.EmbedRequest if method == "EmbedStream" else pb.EncodeRequest)

    async def requests():
        for _ in range(3):
            yield message(inputs="a" * 40)  # 42 bytes each

    for others, answered, code in ((2048 - 3 * 42, 3, grpc.StatusCode.OK),
                                   (2048 - 41, 0, grpc.StatusCode.RESOURCE_EXHAUSTED)):
        tei.held_bytes = others  # what other calls hold
        context = Context("minilm" if method == "TokenizeStream" else "fake")
        replies = [r async for r in tei.stream(method, requests(), context)]
        assert (len(replies), context.code) == (answered, code), context.details
        assert tei.held_bytes == others  # every message's bytes given back


# ---- sparse models: max before log1p, sparse_token_budget -----------------------------


def old_weights(logits, attention):
    """The reference formula: the whole (rows, tokens, vocabulary) tensor in fp32, then the max."""
    import torch

    weights = torch.log1p(torch.relu(logits.float())) * attention.unsqueeze(-1)
    return weights.amax(dim=1)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_max_before_log1p_is_the_old_formula_bit_for_bit(dtype):
    import torch

    from blitz.encoders.sparse import vocabulary_weights

    generator = torch.Generator().manual_seed(7)
    logits = (torch.randn(5, 9, 300, generator=generator) * 3).to(getattr(torch, dtype))
    lengths = torch.tensor([9, 1, 4, 7, 2])
    attention = (torch.arange(9)[None, :] < lengths[:, None]).long()
    logits[1, 0] = -1.0  # a one-token row whose every weight is zero
    want = old_weights(logits, attention)
    got = vocabulary_weights(logits.clone(), attention)
    assert got.dtype == torch.float32 and got.shape == (5, 300)
    # bit for bit (+ 0.0 makes the old -0.0 of a masked-out weight the +0.0 it equals)
    assert torch.equal((got + 0.0).view(torch.int32), (want + 0.0).view(torch.int32))


def test_a_tiny_splade_model_gives_the_old_weights_bit_for_bit(tmp_path):
    import torch
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from blitz.encoders.sentence_transformer import padded
    from blitz.encoders.sparse import SparseEncoder

    folder = build_tiny_splade(tmp_path / "splade", seed=11)
    model = AutoModelForMaskedLM.from_pretrained(str(folder)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    encoder = SparseEncoder("splade", model, tokenizer, max_seq_length=None, device="cpu",
                            token_budget=512)
    ids, _ = encoder.token_ids(["sparse retrieval", "a", WORDS * 2], truncate=True)
    width = max(map(len, ids))
    got = encoder._forward(ids, width)
    input_ids, mask = padded(ids, width, encoder.tokens.pad_id)
    with torch.inference_mode():
        logits = model(input_ids=torch.from_numpy(input_ids),
                       attention_mask=torch.from_numpy(mask),
                       token_type_ids=torch.zeros_like(torch.from_numpy(input_ids))).logits
        want = old_weights(logits, torch.from_numpy(mask)).numpy()
    assert (got + 0.0).tobytes() == (want + 0.0).tobytes()  # bit for bit


def test_sparse_token_budget_caps_a_sparse_models_calls(tmp_path):
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from blitz.encoders.sparse import SparseEncoder, cap_token_budget

    assert PoolSettings().sparse_token_budget == 8192
    folder = build_tiny_splade(tmp_path / "splade", seed=12)
    encoder = SparseEncoder("splade", AutoModelForMaskedLM.from_pretrained(str(folder)).eval(),
                            AutoTokenizer.from_pretrained(str(folder)), max_seq_length=None,
                            device="cpu", token_budget=65_536)  # a GPU pool's budget
    cap_token_budget(encoder, 64)
    assert encoder.token_budget == 64
    calls: list[tuple[int, int]] = []
    real = encoder._forward

    def spied(rows, width):
        calls.append((len(rows), width))
        return real(rows, width)

    encoder._forward = spied
    texts = [WORDS[: 5 + i] for i in range(12)]
    budgeted = encoder.embed_sparse(texts)
    assert calls and all(rows * width <= 64 for rows, width in calls)
    cap_token_budget(encoder, 10_000)  # never raised: a budget only caps
    assert encoder.token_budget == 64
    encoder.token_budget, calls[:] = 65_536, []
    whole = encoder.embed_sparse(texts)
    assert len(calls) == 1  # the GPU budget: one call of every text
    assert np.array_equal(budgeted.rows, whole.rows)
    assert np.array_equal(budgeted.indices, whole.indices)
    assert np.allclose(budgeted.values, whole.values, atol=1e-5)
