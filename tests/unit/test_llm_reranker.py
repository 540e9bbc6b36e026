"""LLM rerankers through the loader (no Ray): tiny random Qwen3 and Gemma causal LMs
score each (query, document) pair as their model cards' formulas do in plain
transformers, alone and in batches of mixed lengths, in one micro-batch or many; the
logit without ``normalize``; the instruction and answer tokens from the spec; a document
cut, never the query; the specs that are refused."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import ValidationError

from blitz.errors import InputTooLong, InvalidValue, ModelLoadFailed
from blitz.ingress.routing import choose_pool
from blitz.loading.load import load_encoder
from blitz.settings.config import RoutingSettings
from blitz.settings.registry import ModelSpec
from tests.tiny_llm_rerankers import (
    build_tiny_gemma_reranker,
    build_tiny_gpt2_reranker,
    build_tiny_qwen3_reranker,
    reference_scores,
)

QUERY = "what is the capital of france?"
DOCUMENTS = ["paris is the capital of france.",
             "the quick brown fox jumps over the lazy dog, one two three four five six",
             "yes",
             "a river and a sea and a city: paris, in france. red green blue tree bird cat"]
STYLES = ("qwen3", "bge-gemma")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("llm-rerankers")
    return {"qwen3": build_tiny_qwen3_reranker(root / "qwen3", seed=3),
            "bge-gemma": build_tiny_gemma_reranker(root / "gemma", seed=4)}


def load(folders, style: str, **fields):
    return load_encoder(ModelSpec(id=f"llm-{style}", source=str(folders[style]),
                                  kind="llm-reranker", reranker_style=style, **fields))


@pytest.mark.parametrize("style", STYLES)
def test_scores_equal_the_model_cards_formula_alone_and_in_mixed_batches(folders, style):
    encoder = load(folders, style)
    expected = reference_scores(folders[style], style, QUERY, DOCUMENTS)
    alone = [float(encoder.score(QUERY, [d]).values[0]) for d in DOCUMENTS]
    assert np.allclose(alone, expected, atol=1e-5)
    for budget in (1, 10_000):  # one pair per model call; every pair in one padded call
        encoder.token_budget = budget
        batch = encoder.score(QUERY, DOCUMENTS)
        assert batch.values.dtype == np.float32
        assert np.allclose(batch.values, expected, atol=1e-5), budget
    longest = int(batch.token_counts.max())
    assert batch.padded_tokens == longest * len(DOCUMENTS)  # left-padded to the longest


def test_left_padding_moves_no_token_of_a_model_with_absolute_positions(tmp_path):
    folder = build_tiny_gpt2_reranker(tmp_path / "gpt2", seed=6)
    encoder = load_encoder(ModelSpec(id="gpt2", source=str(folder), kind="llm-reranker"))
    encoder.token_budget = 10_000  # every pair in one left-padded call
    expected = reference_scores(folder, "qwen3", QUERY, DOCUMENTS)
    assert np.allclose(encoder.score(QUERY, DOCUMENTS).values, expected, atol=1e-5)


@pytest.mark.parametrize("style", STYLES)
def test_without_normalize_the_score_is_the_answer_logit(folders, style):
    encoder = load(folders, style, normalize=False)
    probabilities = reference_scores(folders[style], style, QUERY, DOCUMENTS)
    logits = [math.log(p / (1 - p)) for p in probabilities]  # sigmoid's inverse
    assert np.allclose(encoder.score(QUERY, DOCUMENTS).values, logits, atol=1e-4)


def test_the_instruction_comes_from_the_spec(folders):
    task = "judge whether the document answers the query"
    encoder = load(folders, "qwen3", rerank_instruction=task)
    expected = reference_scores(folders["qwen3"], "qwen3", QUERY, DOCUMENTS, instruction=task)
    assert np.allclose(encoder.score(QUERY, DOCUMENTS).values, expected, atol=1e-5)
    default = reference_scores(folders["qwen3"], "qwen3", QUERY, DOCUMENTS)
    assert not np.allclose(expected, default, atol=1e-4)


def test_the_answer_tokens_come_from_the_spec(folders):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    swapped = load(folders, "qwen3", yes_token="no", no_token="yes")
    plain = load(folders, "qwen3")
    assert np.allclose(swapped.score(QUERY, DOCUMENTS).values,
                       1 - plain.score(QUERY, DOCUMENTS).values, atol=1e-5)
    # bge-gemma has no "no": its logit is the "yes" logit alone, whatever "no" says
    gemma = load(folders, "bge-gemma", normalize=False, yes_token="paris")
    tokenizer = AutoTokenizer.from_pretrained(str(folders["bge-gemma"]))
    model = AutoModelForCausalLM.from_pretrained(str(folders["bge-gemma"])).eval()
    sequence = gemma.prompts.encode(QUERY, DOCUMENTS[:1])[2][0]
    with torch.inference_mode():
        last = model(input_ids=torch.tensor([sequence])).logits[0, -1]
    assert math.isclose(float(gemma.score(QUERY, DOCUMENTS[:1]).values[0]),
                        float(last[tokenizer.convert_tokens_to_ids("paris")]), abs_tol=1e-4)


@pytest.mark.parametrize("style", STYLES)
def test_a_long_document_loses_its_end_and_never_the_query(folders, style):
    full = load(folders, style)
    head, after, sequences = full.prompts.encode(QUERY, ["one"])
    limit = len(sequences[0]) + 3  # room for four document words
    encoder = load(folders, style, max_seq_length=limit)
    long = "one two three four five six seven eight"
    cut = encoder.score(QUERY, [long])
    assert cut.token_counts.tolist() == [limit]
    assert np.allclose(cut.values, full.score(QUERY, ["one two three four"]).values, atol=1e-5)
    with pytest.raises(InputTooLong):
        encoder.score(QUERY, ["short", long], truncate=False)
    assert encoder.score(QUERY, ["one two"], truncate=False).token_counts[0] < limit
    with pytest.raises(InvalidValue) as refused:
        encoder.score(" ".join(["paris"] * limit), ["one"])
    assert refused.value.param == "query"


def test_no_documents_score_nothing(folders):
    encoder = load(folders, "qwen3")
    empty = encoder.score(QUERY, [])
    assert empty.values.shape == (0,) and empty.padded_tokens == 0
    assert encoder.kind == "llm-reranker" and encoder.dimension is None


def test_an_llm_reranker_refuses_to_embed(folders):
    with pytest.raises(InvalidValue, match="/rerank"):
        load(folders, "qwen3").embed(["a"], normalize=True)


@pytest.mark.slow  # the probe set twice, once in bf16 (slow without native bf16)
def test_torch_bf16_is_checked_against_fp32(folders):
    encoder = load(folders, "qwen3", cpu_backend="torch-bf16", accuracy_threshold=0.0)
    assert encoder.backend == "torch-bf16"
    expected = reference_scores(folders["qwen3"], "qwen3", QUERY, DOCUMENTS)
    assert np.allclose(encoder.score(QUERY, DOCUMENTS).values, expected, atol=0.05)


@pytest.mark.parametrize("backend", ["onnx", "onnx-int8", "auto"])
def test_onnx_and_auto_backends_are_refused_for_llm_rerankers(backend):
    with pytest.raises(ValidationError, match="llm-reranker|embedding models"):
        ModelSpec(id="r", source="/models/r", kind="llm-reranker", cpu_backend=backend)


@pytest.mark.parametrize("field", ["reranker_style", "rerank_instruction", "yes_token",
                                   "no_token"])
def test_reranker_fields_are_refused_on_other_kinds(field):
    value = "bge-gemma" if field == "reranker_style" else "x"
    with pytest.raises(ValidationError, match=field):
        ModelSpec(id="c", source="/models/c", kind="cross-encoder", **{field: value})


def test_an_answer_of_several_tokens_fails_the_load_clearly(folders):
    with pytest.raises(ModelLoadFailed) as failed:
        load(folders, "qwen3", yes_token="yes no")
    assert "yes_token" in str(failed.value.__cause__ or failed.value)


def test_a_fake_llm_reranker_scores_for_api_tests():
    encoder = load_encoder(ModelSpec(id="f", source="fake:4", kind="llm-reranker",
                                     cpu_backend="onnx"))
    assert encoder.kind == "llm-reranker"
    assert encoder.score("q", ["a", "b"]).values.shape == (2,)


def test_llm_rerankers_route_like_cross_encoders():
    policy = RoutingSettings()
    assert choose_pool("llm-reranker", 1, frozenset({"cpu", "gpu"}),
                       frozenset({"cpu", "gpu"}), policy) == choose_pool(
        "cross-encoder", 1, frozenset({"cpu", "gpu"}), frozenset({"cpu", "gpu"}), policy)


def test_specs_survive_the_dump_replicas_get():
    for spec in (ModelSpec(id="e", source="fake:4"),
                 ModelSpec(id="r", source="/models/r", kind="llm-reranker",
                           reranker_style="bge-gemma", yes_token="Yes")):
        assert ModelSpec.model_validate(spec.model_dump(mode="json")) == spec
