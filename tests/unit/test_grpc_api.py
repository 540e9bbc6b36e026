"""TEI's gRPC API (``tei.v1``) over a real gRPC server and client in this process (no Ray):
``TeiServicer`` behind ``grpc.aio``, registered with the same ``add_*Servicer_to_server``
functions Serve's proxy gets, answered by the same services as HTTP."""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace

import grpc
import numpy as np
import pytest

from blitz.errors import (
    InvalidValue,
    Overloaded,
    PayloadTooLarge,
    Unavailable,
    UnknownModel,
    as_blitz_error,
)
from blitz.grpc_api import rpc_table
from blitz.grpc_api import tei_pb2 as pb
from blitz.grpc_api.servicer import TeiServicer, status_code
from blitz.ingress.service import EmbeddingService
from blitz.pool.dispatcher import ReplicaDispatcher
from blitz.settings.config import BlitzSettings
from tests.api_client import tei_servicer
from tests.tiny_models import minilm_dir

TEXT = "naïve café — 東京 tokens"
KEY = "s3cret-key"


def make_servicer(auth: dict | None = None, observed: list | None = None,
                  limits: dict | None = None) -> TeiServicer:
    settings = BlitzSettings.from_args({
        "models": [{"id": "emb", "source": "fake:16"},
                   {"id": "minilm", "source": str(minilm_dir())},
                   {"id": "ce", "source": "fake:4", "kind": "cross-encoder"},
                   {"id": "cls", "source": "fake:3", "kind": "classifier"}],
        "limits": {"max_texts_per_request": 4, "max_chars_per_text": 200, **(limits or {})},
        **({"auth": auth} if auth else {})})
    observer = None if observed is None else (
        lambda record, status, seconds: observed.append((record.route, record.model, status)))
    service = EmbeddingService(settings, ReplicaDispatcher(settings),
                               observer=observer)
    return tei_servicer(service)


def bridge(tei: TeiServicer) -> SimpleNamespace:
    """grpc.aio's servicer: each method one call into ``tei``, as the ingress's are."""
    methods = {}
    for rpc in rpc_table.RPCS:
        if rpc.streaming:
            async def stream(requests, context, method=rpc.method):
                async for reply in tei.stream(method, requests, context):
                    yield reply
            methods[rpc.method] = stream
        else:
            async def unary(request, context, method=rpc.method):
                return await tei.unary(method, request, context)
            methods[rpc.method] = unary
    return SimpleNamespace(**methods)


@contextlib.asynccontextmanager
async def served(tei: TeiServicer | None = None):
    """A gRPC channel to ``tei`` on a real server on loopback (made on the test's loop:
    grpc.aio keeps to the loop it was made on)."""
    server = grpc.aio.server()
    for service in rpc_table.SERVICES:
        getattr(rpc_table, f"add_{service}Servicer_to_server")(bridge(tei or make_servicer()),
                                                                server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield channel
    finally:
        await server.stop(None)


def call(channel, method: str):
    return rpc_table.client_method(channel, method)


async def test_embed_is_the_services_vector():
    async with served() as channel:
        tei = make_servicer()
        expected = (await tei.service.embed([TEXT], model="emb")).embeddings[0]
        reply = await call(channel, "Embed")(pb.EmbedRequest(inputs=TEXT),
                                             metadata=(("model", "emb"),))
        assert np.array_equal(np.array(reply.embeddings, dtype=np.float32), expected)
        assert reply.metadata.compute_chars == len(TEXT)
        assert reply.metadata.total_time_ns > 0
        shorter = await call(channel, "Embed")(pb.EmbedRequest(inputs=TEXT, dimensions=4),
                                               metadata=(("model", "emb"),))
        assert len(shorter.embeddings) == 4


async def test_the_default_model_answers_without_metadata():
    async with served() as channel:
        reply = await call(channel, "Embed")(pb.EmbedRequest(inputs="hello"))
        assert len(reply.embeddings) == 16  # "emb", the first model


async def test_a_stream_answers_each_message_in_order():
    async with served() as channel:
        texts = [f"text number {i}" for i in range(40)]
        service = make_servicer().service
        expected = np.concatenate([(await service.embed(texts[i:i + 4], model="emb"))
                                   .embeddings for i in range(0, len(texts), 4)])

        async def requests():
            for text in texts:
                yield pb.EmbedRequest(inputs=text)

        replies = [r async for r in call(channel, "EmbedStream")(requests(),
                                                                 metadata=(("model", "emb"),))]
        got = np.array([r.embeddings for r in replies], dtype=np.float32)
        assert np.array_equal(got, expected)


async def test_a_failing_message_ends_the_stream_with_its_status():
    async with served() as channel:
        async def requests():
            yield pb.EmbedRequest(inputs="fine")
            yield pb.EmbedRequest(inputs="x" * 201)  # over max_chars_per_text
            yield pb.EmbedRequest(inputs="never answered")

        replies = []
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for reply in call(channel, "EmbedStream")(requests()):
                replies.append(reply)
        assert len(replies) == 1
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "max_chars_per_text" in info.value.details()
        assert ("x-blitz-error", PayloadTooLarge.code) in tuple(info.value.trailing_metadata())


@pytest.mark.parametrize(("method", "request_", "metadata", "code", "words"), [
    ("Embed", pb.EmbedRequest(inputs="a"), (("model", "nope"),), "NOT_FOUND", "nope"),
    ("Embed", pb.EmbedRequest(inputs="a", truncation_direction=7), (), "INVALID_ARGUMENT",
     "truncation_direction"),
    ("EmbedAll", pb.EmbedAllRequest(inputs="a", truncation_direction=1), (),
     "INVALID_ARGUMENT", "truncation_direction"),
    ("Embed", pb.EmbedRequest(inputs="a", dimensions=999), (), "INVALID_ARGUMENT",
     "dimensions"),
    ("PredictPair", pb.PredictPairRequest(inputs=["a", "b", "c"]), (("model", "cls"),),
     "INVALID_ARGUMENT", "two elements"),
    ("Rerank", pb.RerankRequest(query="q", texts=["a"] * 5), (("model", "ce"),),
     "INVALID_ARGUMENT", "max_texts_per_request"),
    ("Rerank", pb.RerankRequest(query="q", texts=["a"], raw_scores=True), (("model", "ce"),),
     "INVALID_ARGUMENT", "raw_scores"),
    ("Predict", pb.PredictRequest(inputs="a"), (("model", "emb"),), "INVALID_ARGUMENT",
     "classifier"),
    ("Decode", pb.DecodeRequest(ids=[10**9]), (("model", "minilm"),), "INVALID_ARGUMENT",
     "id"),
])
async def test_bad_input_gets_a_clear_status(method, request_, metadata, code, words):
    async with served() as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(channel, method)(request_, metadata=metadata)
        assert info.value.code() == getattr(grpc.StatusCode, code), info.value.details()
        assert words in info.value.details()


async def test_rerank_predict_and_info():
    async with served() as channel:
        tei = make_servicer()
        expected = await tei.service.rerank("query", ["a", "bb", "ccc"], model="ce",
                                            return_documents=True)
        reply = await call(channel, "Rerank")(
            pb.RerankRequest(query="query", texts=["a", "bb", "ccc"], return_text=True,
                             truncate=True), metadata=(("model", "ce"),))
        assert [(r.index, r.text) for r in reply.ranks] == [
            (hit.index, hit.document) for hit in expected.results]
        assert np.allclose([r.score for r in reply.ranks],
                           [hit.relevance_score for hit in expected.results])

        pair = await call(channel, "PredictPair")(pb.PredictPairRequest(inputs=["a", "b"]),
                                                  metadata=(("model", "cls"),))
        scores = [p.score for p in pair.predictions]
        assert len(scores) == 3 and scores == sorted(scores, reverse=True)
        assert abs(sum(scores) - 1) < 1e-5  # a softmax, unless raw_scores

        info = await call(channel, "Info")(pb.InfoRequest(), metadata=(("model", "cls"),))
        assert (info.model_id, info.model_type) == ("cls", pb.MODEL_TYPE_CLASSIFIER)
        assert info.max_client_batch_size == 4
        assert info.max_batch_tokens == 512  # the model's effective budget (a CPU pool's)


async def test_tokenize_gives_byte_offsets_and_decode_round_trips():
    async with served() as channel:
        from transformers import AutoTokenizer

        reference = AutoTokenizer.from_pretrained(str(minilm_dir()))
        metadata = (("model", "minilm"),)
        reply = await call(channel, "Tokenize")(pb.EncodeRequest(inputs=TEXT,
                                                                 add_special_tokens=True),
                                                metadata=metadata)
        assert [t.id for t in reply.tokens] == reference(TEXT)["input_ids"]
        raw = TEXT.encode()
        for token in reply.tokens:
            if not token.special:
                assert raw[token.start:token.stop].decode() == token.text
        plain = await call(channel, "Tokenize")(pb.EncodeRequest(inputs=TEXT), metadata=metadata)
        assert [t.id for t in plain.tokens] == reference(TEXT, add_special_tokens=False)[
            "input_ids"]  # proto3's default: false, as TEI
        decoded = await call(channel, "Decode")(pb.DecodeRequest(
            ids=[t.id for t in reply.tokens], skip_special_tokens=True), metadata=metadata)
        assert decoded.text == reference.decode([t.id for t in reply.tokens],
                                                skip_special_tokens=True)


async def test_api_keys_are_metadata():
    async with served(make_servicer(auth={"api_keys": [KEY]})) as channel:
        embed = call(channel, "Embed")
        for metadata in ((), (("authorization", "Bearer wrong"),)):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await embed(pb.EmbedRequest(inputs="a"), metadata=metadata)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED

        async def requests():
            yield pb.EmbedRequest(inputs="a")

        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in call(channel, "EmbedStream")(requests()):
                pass
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        reply = await embed(pb.EmbedRequest(inputs="a"),
                            metadata=(("authorization", f"Bearer {KEY}"),))
        assert len(reply.embeddings) == 16


async def test_each_call_is_observed_under_its_method():
    observed: list = []
    async with served(make_servicer(observed=observed)) as channel:
        await call(channel, "Embed")(pb.EmbedRequest(inputs="a"))
        with pytest.raises(grpc.aio.AioRpcError):
            await call(channel, "Embed")(pb.EmbedRequest(inputs="a"), metadata=(("model", "x"),))
        assert observed == [("/tei.v1.Embed/Embed", "emb", 200),
                            ("/tei.v1.Embed/Embed", "other", 404)]


def test_blitz_errors_map_to_grpc_codes():
    assert status_code(Overloaded("busy")) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert status_code(Unavailable("restarting")) == grpc.StatusCode.UNAVAILABLE
    assert status_code(UnknownModel("x")) == grpc.StatusCode.NOT_FOUND
    assert status_code(PayloadTooLarge("big")) == grpc.StatusCode.INVALID_ARGUMENT
    assert status_code(as_blitz_error(RuntimeError("bug"))) == grpc.StatusCode.INTERNAL


async def test_a_client_that_leaves_cancels_what_its_stream_left():
    """The client cancels mid-stream: the messages being answered are cancelled, the
    reader stops, and the servicer is left with nothing running."""
    tei = make_servicer()
    started = asyncio.Event()
    release = asyncio.Event()
    real = tei.service.embed

    async def slow_embed(*args, **kwargs):
        started.set()
        await release.wait()
        return await real(*args, **kwargs)

    tei.service.embed = slow_embed  # type: ignore[method-assign]
    async with served(tei) as channel:
        before = len(asyncio.all_tasks())

        async def requests():
            for i in range(10):
                yield pb.EmbedRequest(inputs=f"t{i}")
            await asyncio.Event().wait()  # the client never half-closes

        stream = call(channel, "EmbedStream")(requests())
        reader = asyncio.ensure_future(stream.read())
        await asyncio.wait_for(started.wait(), 10)
        stream.cancel()
        reader.cancel()
        for _ in range(100):
            if len(asyncio.all_tasks()) <= before:
                break
            await asyncio.sleep(0.05)
        assert len(asyncio.all_tasks()) <= before


def test_messages_pickle_as_serves_proxy_sends_them():
    """Serve's proxy pickles each request to the ingress replica (and the reply back): the
    classes must import by their module's full name."""
    import pickle

    for rpc in rpc_table.RPCS:
        for message in (rpc.request(), rpc.response()):
            assert type(message).__module__ == pb.__name__
            assert pickle.loads(pickle.dumps(message)) == message


ALLOWED = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
           grpc.StatusCode.FAILED_PRECONDITION}
"""What a stranger's bytes may get: an answer or a client error, never INTERNAL/UNKNOWN."""


async def test_strangers_bytes_get_an_answer_or_invalid_argument():
    import random

    rng = random.Random(35)
    payloads = [b"\xff\xff\xff", b"\x0a\x05\xff\xfe\xfd\xfc\xfb",  # a truncated varint;
                b"\x0a\x02\xc3\x28"]  # a string field that is not UTF-8
    payloads += [rng.randbytes(rng.randrange(0, 64)) for _ in range(40)]
    payloads += [bytes([0x0a, n]) + rng.randbytes(n) for n in range(1, 40)]  # field 1, len n
    async with served() as channel:
        for rpc in rpc_table.RPCS:
            raw = (channel.stream_stream if rpc.streaming else channel.unary_unary)(rpc.path)
            for payload in payloads:
                metadata = (("model", "minilm" if rpc.service == "Tokenize" else
                             "ce" if rpc.service == "Rerank" else
                             "cls" if rpc.service == "Predict" else "emb"),)
                try:
                    if rpc.streaming:
                        async for _ in raw(iter([payload]), metadata=metadata):
                            pass
                    else:
                        await raw(payload, metadata=metadata)
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() in ALLOWED, (rpc.method, payload, exc.details())
                    if payload[:3] in (b"\xff\xff\xff", b"\x0a\x02\xc3"):
                        assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
                        assert "not a valid tei.v1." in exc.details()


@pytest.mark.parametrize("message, build", [
    (pb.DecodeRequest, lambda n: pb.DecodeRequest(ids=list(range(n))).SerializeToString()),
    (pb.RerankRequest, lambda n: pb.RerankRequest(query="q", texts=["a b"] * n)
     .SerializeToString()),
    (pb.PredictPairRequest, lambda n: pb.PredictPairRequest(inputs=["x"] * n)
     .SerializeToString()),
])
def test_parsing_a_message_costs_linear_time(message, build):
    from tests.unit.test_fuzz_codecs import MAX_RATIO, cost_ratio

    assert cost_ratio(build, rpc_table.reader(message), 20_000) <= MAX_RATIO


async def test_a_stream_holds_at_most_one_body_of_messages():
    """Messages of a stream are taken while they fit in ``limits.max_body_bytes`` together
    (here 2,048 bytes: three of ~600), then the stream waits for the oldest answer."""
    tei = make_servicer(limits={"max_body_bytes": 2048, "max_chars_per_text": 1000})
    real, running, most = tei.tokens.tokenize, 0, 0

    async def slow_tokenize(*args, **kwargs):
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.05)
        try:
            return await real(*args, **kwargs)
        finally:
            running -= 1

    tei.tokens.tokenize = slow_tokenize  # type: ignore[method-assign]

    async def requests():
        for i in range(12):
            yield pb.EncodeRequest(inputs=f"{i:03d} " + "word " * 119)

    async with served(tei) as channel:
        replies = [r async for r in call(channel, "TokenizeStream")(
            requests(), metadata=(("model", "minilm"),))]
    assert len(replies) == 12
    assert most == 3


async def test_an_embed_stream_is_answered_in_groups_with_each_texts_own_vector():
    """Messages that queue while earlier ones are answered share one embed call; each
    still gets its own vector, and a bad one in a group fails alone, after the good ones
    before it were answered."""
    observed: list = []
    tei = make_servicer(observed=observed, limits={"max_texts_per_request": 64})
    real, calls = tei.service.embed, []

    async def slow_embed(texts, **kwargs):
        calls.append(1 if isinstance(texts, str) else len(texts))
        await asyncio.sleep(0.02)
        return await real(texts, **kwargs)

    tei.service.embed = slow_embed  # type: ignore[method-assign]
    texts = [f"text number {i}" for i in range(40)]
    expected = (await real(texts, model="emb")).embeddings
    observed.clear()  # that call's record

    async def requests(bad_at: int | None = None):
        for i, text in enumerate(texts):
            yield pb.EmbedRequest(inputs="x" * 201 if i == bad_at else text)

    metadata = (("model", "emb"),)
    async with served(tei) as channel:
        replies = [r async for r in call(channel, "EmbedStream")(requests(), metadata=metadata)]
        assert np.array_equal(np.array([r.embeddings for r in replies], np.float32), expected)
        assert sum(calls) == 40 and len(calls) < 40  # grouped
        assert all(route == "/tei.v1.Embed/EmbedStream" for route, _, _ in observed)

        got = []
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for reply in call(channel, "EmbedStream")(requests(bad_at=30),
                                                            metadata=metadata):
                got.append(reply)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert np.array_equal(np.array([r.embeddings for r in got], np.float32),
                              expected[:30])


@pytest.mark.parametrize("ending", ["the client cancels", "the client half-closes, a message fails"])
async def test_a_stream_that_ends_with_a_full_window_leaves_no_answer_running(
        monkeypatch, ending):
    """With the window full, the reader may have begun the next message's answer and be
    waiting for room to queue it; cancelled there, that answer must not run on alone."""
    from blitz.grpc_api import servicer

    monkeypatch.setattr(servicer, "STREAM_WINDOW", 2)
    tei = make_servicer()
    running: set[str] = set()
    started = asyncio.Event()
    fail = asyncio.Event()

    async def stuck_tokenize(inputs, **kwargs):
        running.add(inputs)
        try:
            if len(running) == 4:  # one awaited, two in the window, one waiting for room
                started.set()
            if inputs == "t0":
                await fail.wait()
                raise PayloadTooLarge("t0 is too long", param="inputs")
            await asyncio.Event().wait()  # answered never: only cancelled
        finally:
            running.discard(inputs)

    tei.tokens.tokenize = stuck_tokenize  # type: ignore[method-assign]

    async def requests():
        for i in range(4):
            yield pb.EncodeRequest(inputs=f"t{i}")
        if ending == "the client cancels":
            await asyncio.Event().wait()  # never half-closes

    async with served(tei) as channel:
        stream = call(channel, "TokenizeStream")(requests(), metadata=(("model", "minilm"),))
        reader = asyncio.ensure_future(stream.read())
        await asyncio.wait_for(started.wait(), 10)
        if ending == "the client cancels":
            stream.cancel()
            reader.cancel()
        else:
            fail.set()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await reader
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        for _ in range(100):
            if not running:
                break
            await asyncio.sleep(0.05)
        assert running == set()


async def test_embed_with_dimensions_0_is_refused_as_http_refuses_it():
    """proto3's ``dimensions: 0`` (its default) is refused, not answered OK with an empty
    vector."""
    from blitz.http.bodies import EmbedRequest
    from blitz.settings.config import Limits

    with pytest.raises(InvalidValue) as http:
        EmbedRequest.parse({"texts": ["a"], "dimensions": 0}, Limits())
    http_error = http.value
    async with served() as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(channel, "Embed")(pb.EmbedRequest(inputs="a", dimensions=0))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details() == http_error.public_message()

        async def requests():
            yield pb.EmbedRequest(inputs="a")
            yield pb.EmbedRequest(inputs="b", dimensions=0)

        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in call(channel, "EmbedStream")(requests()):
                pass
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details() == http_error.public_message()
