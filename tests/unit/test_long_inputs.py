"""Over-long inputs on a tiny BERT bi-encoder (max_seq_length 16): ``truncation_side``
cuts the start (left) or the end (right) of the text's own tokens, the special tokens kept,
and the vector equals one computed directly from ids cut by hand."""

from __future__ import annotations

import numpy as np
import pytest

from blitz.loading.load import load_encoder
from blitz.settings.config import BlitzSettings
from blitz.settings.registry import ModelSpec
from tests.api_client import api_client, api_for
from tests.tiny_models import build_tiny_bi_encoder

MAX = 16
LONG = ("the quick brown fox jumps over the lazy dog while seven wizards quietly "
        "judge the boxing match between two sleepy kittens")
SHORT = "a short text"
TWICE = LONG + " and then " + LONG


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_bi_encoder(tmp_path_factory.mktemp("tiny") / "m", hidden=16,
                                 max_seq_length=MAX, seed=5)


_opened: dict = {}


def encoder(tiny, side):
    """The tiny model loaded once per side, on torch."""
    if (tiny, side) not in _opened:
        spec = ModelSpec(id="tiny", source=str(tiny), cpu_backend="torch",
                         truncation_side=side)
        _opened[tiny, side] = load_encoder(spec)
    return _opened[tiny, side]


def content_ids(enc, text):
    """The text's own token ids, without special tokens."""
    return enc.tokens.tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("side", ["left", "right"])
def test_an_over_long_text_equals_its_ids_cut_by_hand_at_the_chosen_side(tiny, side):
    enc = encoder(tiny, side)
    ids = content_ids(enc, LONG)
    room = MAX - enc.tokens.specials
    assert len(ids) > room
    kept = ids[-room:] if side == "left" else ids[:room]
    got = enc.embed([LONG, SHORT], normalize=True)
    direct = enc.embed_tokens([kept, content_ids(enc, SHORT)], normalize=True)
    assert np.allclose(got.values, direct.values, atol=1e-6)
    assert got.token_counts.tolist() == [MAX, len(content_ids(enc, SHORT)) + enc.tokens.specials]


def test_left_and_right_truncation_give_different_vectors_and_right_matches_the_default(tiny):
    left = encoder(tiny, "left").embed([LONG], normalize=True).values
    right = encoder(tiny, "right").embed([LONG], normalize=True).values
    default = encoder(tiny, None).embed([LONG], normalize=True).values
    assert not np.allclose(left, right, atol=1e-3)
    assert np.allclose(right, default, atol=1e-6)


def test_a_text_within_the_limit_is_not_cut_on_either_side(tiny):
    left = encoder(tiny, "left").embed([SHORT], normalize=False).values
    right = encoder(tiny, "right").embed([SHORT], normalize=False).values
    assert np.allclose(left, right, atol=1e-6)


def test_truncate_false_still_refuses_an_over_long_text_with_a_side_set(tiny):
    with pytest.raises(Exception, match=str(MAX)):
        encoder(tiny, "left").embed([LONG], normalize=True, truncate=False)


async def test_the_http_api_cuts_at_the_models_side(tiny):
    settings = BlitzSettings.from_args({"models": [
        {"id": "tiny", "source": str(tiny), "cpu_backend": "torch", "truncation_side": "left"}]})
    api = api_for(settings)
    enc = encoder(tiny, None)
    room = MAX - enc.tokens.specials
    direct = enc.embed_tokens([content_ids(enc, LONG)[-room:]], normalize=True).values
    async with api_client(api) as client:
        r = await client.post("/embed", json={"inputs": [LONG], "model": "tiny"})
    assert r.status_code == 200, r.text
    assert np.allclose(np.array(r.json(), dtype=np.float32), direct, atol=1e-5)


@pytest.fixture
async def right_client(tiny):
    """The tiny model cutting at the right by default, over HTTP in process."""
    settings = BlitzSettings.from_args({"models": [
        {"id": "tiny", "source": str(tiny), "cpu_backend": "torch", "truncation_side": "right"}]})
    async with api_client(settings) as client:
        yield client


def cut_by_hand(tiny, side):
    enc = encoder(tiny, None)
    room = MAX - enc.tokens.specials
    ids = content_ids(enc, LONG)
    return enc.embed_tokens([ids[-room:] if side == "left" else ids[:room]],
                            normalize=True).values


@pytest.mark.parametrize("body", [{"truncation_side": "left"}, {"truncation_direction": "Left"}])
async def test_a_request_can_cut_at_the_left_of_a_model_that_cuts_at_the_right(
        tiny, right_client, body):
    r = await right_client.post("/embed", json={"inputs": [LONG], "model": "tiny", **body})
    assert r.status_code == 200, r.text
    assert np.allclose(np.array(r.json(), dtype=np.float32), cut_by_hand(tiny, "left"),
                       atol=1e-5)
    r = await right_client.post("/embed", json={"inputs": [LONG], "model": "tiny"})
    assert np.allclose(np.array(r.json(), dtype=np.float32), cut_by_hand(tiny, "right"),
                       atol=1e-5)


async def test_an_unknown_truncation_direction_is_a_422_naming_the_sides(right_client):
    r = await right_client.post("/embed", json={"inputs": [LONG], "truncation_direction": "up"})
    assert r.status_code == 422 and "left or right" in r.text


def chunker(tiny, long_inputs, overlap=0):
    key = (tiny, long_inputs, overlap)
    if key not in _opened:
        spec = ModelSpec(id="tiny", source=str(tiny), cpu_backend="torch",
                         long_inputs=long_inputs, chunk_overlap=overlap)
        _opened[key] = load_encoder(spec)
    return _opened[key]


def chunks_by_hand(ids, room, overlap):
    """Windows of ``room`` content ids, each starting ``room - overlap`` after the last,
    until one reaches the end."""
    out, start = [], 0
    while True:
        out.append(ids[start:start + room])
        if start + room >= len(ids):
            return out
        start += room - overlap


@pytest.mark.parametrize("overlap", [0, 3])
def test_a_chunked_text_is_the_token_weighted_mean_of_its_chunks_computed_directly(
        tiny, overlap):
    enc = chunker(tiny, "chunk", overlap)
    specials = enc.tokens.specials
    room = MAX - specials
    windows = chunks_by_hand(content_ids(enc, TWICE), room, overlap)
    assert len(windows) >= 3
    rows = enc.embed_tokens(windows, normalize=False).values
    weights = np.array([len(w) + specials for w in windows], dtype=np.float32)
    mean = (rows * weights[:, None]).sum(axis=0) / weights.sum()
    short = enc.embed_tokens([content_ids(enc, SHORT)], normalize=False).values[0]
    for normalize in (False, True):
        got = enc.embed([TWICE, SHORT], normalize=normalize)
        want = np.stack([mean, short])
        if normalize:
            want = want / np.linalg.norm(want, axis=1, keepdims=True)
        assert np.allclose(got.values, want, atol=1e-5)
        assert got.token_counts.tolist() == [int(weights.sum()),
                                             len(content_ids(enc, SHORT)) + specials]


def test_long_inputs_error_refuses_an_over_long_text_even_when_the_request_truncates(tiny):
    enc = chunker(tiny, "error")
    with pytest.raises(Exception, match=str(MAX)):
        enc.embed([LONG], normalize=True, truncate=True)
    assert enc.embed([SHORT], normalize=True).values.shape == (1, 16)


async def test_the_http_api_answers_a_chunked_text_with_its_chunks_mean_and_counts_them_all(
        tiny):
    settings = BlitzSettings.from_args({"models": [
        {"id": "tiny", "source": str(tiny), "cpu_backend": "torch", "long_inputs": "chunk",
         "chunk_overlap": 2}],
        "cpu_pool": {"max_batch_size": 2}})
    direct = chunker(tiny, "chunk", 2).embed([LONG, SHORT, LONG + " more"], normalize=True)
    async with api_client(settings) as client:
        r = await client.post("/v1/embeddings", json={
            "input": [LONG, SHORT, LONG + " more"], "model": "tiny"})
    assert r.status_code == 200, r.text
    got = np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)
    assert np.allclose(got, direct.values, atol=1e-5)
    assert r.json()["usage"]["prompt_tokens"] == int(direct.token_counts.sum())
