"""The tiny ColBERT folders (tests.tiny_colbert): their layouts, that sentence-transformers 6
opens each (native and PyLate's legacy path), and that ST6's encoding equals PyLate's written
out, with the two places where they differ pinned (leading / trailing whitespace on a
byte-level BPE, and skiplist words that are not single tokens)."""

from __future__ import annotations

import json
import string
from pathlib import Path

import numpy as np
import pytest

from tests.tiny_colbert import (
    BERT_VOCAB,
    DIM,
    DOCUMENT_LENGTH,
    QUERY_LENGTH,
    build_plain_bert,
    build_pylate_colbert,
    build_st6_colbert,
    load_st6,
    maxsim,
    pylate_reference,
    st6_reference,
)

PUNCTUATION = list(string.punctuation)
LONG = " ".join(["the quick brown fox jumps over the lazy dog, again and again!"] * 8)
QUERIES = ["a", "what is the capital of france?", "Hello, world!",
           "late interaction (colbert): score = sum of max; dot-products...",
           ("one two three four five six seven eight nine ten " * 4).strip(), LONG]
DOCUMENTS = ["a", "Paris is the capital of France.", "Hello, world!",
             "Retrieval with token vectors: each query token finds its best match; sum them!",
             ("The river runs into the sea. " * 6).strip(), LONG, "!!! ... ???"]
EXPANSION = {"strategy": "fixed", "attend": False, "token": None, "length": QUERY_LENGTH}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny_colbert")
    return {
        "st6-bert": build_st6_colbert(root / "st6-bert", "bert"),
        "st6-modernbert": build_st6_colbert(root / "st6-modernbert", "modernbert"),
        "pylate-bert": build_pylate_colbert(root / "pylate-bert"),
        "pylate-modernbert": build_pylate_colbert(root / "pylate-modernbert", "modernbert"),
        "pylate-bert-st4": build_pylate_colbert(root / "pylate-bert-st4", model_type=None),
        "plain-bert": build_plain_bert(root / "plain-bert"),
    }


def _json(path: Path):
    return json.loads(path.read_text(encoding="utf8"))


def _assert_same(left: list[np.ndarray], right: list[np.ndarray]) -> None:
    assert len(left) == len(right)
    for index, (a, b) in enumerate(zip(left, right, strict=True)):
        assert a.shape == b.shape, (index, a.shape, b.shape)
        np.testing.assert_allclose(a, b, atol=1e-5, err_msg=f"text {index}")


# --- layouts -------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_st6_folder_layout(folders, arch):
    folder = folders[f"st6-{arch}"]
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) == [
        "1_Dense/config.json", "1_Dense/model.safetensors", "2_MultiVectorMask/config.json",
        "3_Normalize/config.json", "config.json", "config_sentence_transformers.json",
        "model.safetensors", "modules.json", "sentence_bert_config.json", "tokenizer.json",
        "tokenizer_config.json"]
    assert [m["type"] for m in _json(folder / "modules.json")] == [
        "sentence_transformers.base.modules.transformer.Transformer",
        "sentence_transformers.base.modules.dense.Dense",
        "sentence_transformers.multi_vector_encoder.modules.multi_vector_mask.MultiVectorMask",
        "sentence_transformers.base.modules.normalize.Normalize"]
    config = _json(folder / "config_sentence_transformers.json")
    assert config["model_type"] == "MultiVectorEncoder"
    assert config["similarity_fn_name"] == "maxsim"
    assert config["prompts"] == ({"query": "[unused0] ", "document": "[unused1] "}
                                 if arch == "bert" else {"query": "[Q] ", "document": "[D] "})
    transformer = _json(folder / "sentence_bert_config.json")
    assert (transformer["query_length"], transformer["document_length"]) == (32, 64)
    assert transformer["query_expansion"] == EXPANSION
    assert _json(folder / "2_MultiVectorMask/config.json")["skiplist_words"] == PUNCTUATION


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_pylate_folder_layout(folders, arch):
    from safetensors.torch import load_file

    folder = folders[f"pylate-{arch}"]
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert files == sorted(
        ["1_Dense/config.json", "1_Dense/model.safetensors", "config.json",
         "config_sentence_transformers.json", "model.safetensors", "modules.json",
         "sentence_bert_config.json", "tokenizer.json", "tokenizer_config.json"]
        + (["special_tokens_map.json", "vocab.txt"] if arch == "bert" else []))
    assert _json(folder / "modules.json") == [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"}]
    assert _json(folder / "1_Dense/config.json") == {
        "in_features": 32, "out_features": DIM, "bias": False,
        "activation_function": "torch.nn.modules.linear.Identity", "use_residual": False}
    weights = load_file(str(folder / "1_Dense/model.safetensors"))
    assert {k: tuple(v.shape) for k, v in weights.items()} == {"linear.weight": (DIM, 32)}
    config = _json(folder / "config_sentence_transformers.json")
    prefixes = ("[unused0]", "[unused1]") if arch == "bert" else ("[Q] ", "[D] ")
    assert (config["query_prefix"], config["document_prefix"]) == prefixes
    assert config["model_type"] == "ColBERT"
    assert config["similarity_fn_name"] == "MaxSim"
    assert (config["query_length"], config["document_length"]) == (32, 64)
    assert config["do_query_expansion"] is True
    assert config["attend_to_expansion_tokens"] is False
    assert config["skiplist_words"] == PUNCTUATION
    assert _json(folder / "sentence_bert_config.json") == {"max_seq_length": 63,
                                                           "do_lower_case": False}
    tokenizer_config = _json(folder / "tokenizer_config.json")
    assert tokenizer_config["pad_token"] == "[MASK]"  # PyLate pads with [MASK]
    if arch == "bert":
        assert (folder / "vocab.txt").read_text().splitlines() == list(BERT_VOCAB)


def test_plain_bert_has_no_colbert_files(folders):
    folder = folders["plain-bert"]
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    # ST6 would still open it, with a freshly initialised 128-dim projection: not a ColBERT.
    assert load_st6(folder).get_embedding_dimension() == 128


# --- ST6 opens every format ----------------------------------------------------------------


@pytest.mark.parametrize("name", ["st6-bert", "st6-modernbert", "pylate-bert",
                                  "pylate-modernbert", "pylate-bert-st4"])
def test_multi_vector_encoder_opens(folders, name):
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    model = load_st6(folders[name])
    modules = list(model)
    assert [type(m) for m in modules] == [Transformer, Dense, MultiVectorMask, Normalize]
    assert modules[0].query_expansion == EXPANSION
    assert modules[0].document_length == DOCUMENT_LENGTH
    assert (modules[1].in_features, modules[1].out_features) == (32, DIM)
    assert modules[1].module_input_name == "token_embeddings"
    assert modules[2].skiplist_words == PUNCTUATION
    assert modules[2].skiplist_tasks == ["document"]
    assert model.get_embedding_dimension() == DIM
    assert model.similarity_fn_name == "maxsim"
    if name.startswith("pylate"):
        # Legacy path: the top-level knobs were translated, the prefixes became text prompts.
        prefixes = ("[Q] ", "[D] ") if "modern" in name else ("[unused0]", "[unused1]")
        assert (model.prompts["query"], model.prompts["document"]) == prefixes
        assert model._legacy.is_pylate_v3 is (name != "pylate-bert-st4")
    # The prefix is one token right after the first one, as PyLate inserts it.
    for task in ("query", "document"):
        features = model.preprocess(["hello world"], prompt=model.prompts[task], task=task)
        tokens = model.tokenizer.convert_ids_to_tokens(features["input_ids"][0])
        assert tokens[1] == model.prompts[task] or tokens[1] == model.prompts[task].strip()
        assert tokens[0] == "[CLS]"


# --- ST6 == PyLate -------------------------------------------------------------------------


@pytest.mark.parametrize("is_query", [True, False])
@pytest.mark.parametrize("name", ["pylate-bert", "pylate-modernbert", "pylate-bert-st4"])
def test_st6_matches_pylate(folders, name, is_query):
    texts = QUERIES if is_query else DOCUMENTS
    st6 = st6_reference(folders[name], texts, is_query)
    _assert_same(st6, pylate_reference(folders[name], texts, is_query))
    if is_query:
        assert {v.shape for v in st6} == {(QUERY_LENGTH, DIM)}
    else:
        assert max(len(v) for v in st6) <= DOCUMENT_LENGTH
    # One text at a time gives the same as the batch (padding is masked out).
    _assert_same([pylate_reference(folders[name], [t], is_query)[0] for t in texts[:3]],
                 st6[:3])


@pytest.mark.parametrize("knobs", [{"do_query_expansion": False},
                                   {"attend_to_expansion_tokens": True}])
def test_st6_matches_pylate_expansion_variants(tmp_path, knobs):
    folder = build_pylate_colbert(tmp_path / "variant", **knobs)
    model = load_st6(folder)
    if knobs.get("do_query_expansion") is False:
        assert model[0].query_expansion is None
        assert model[0].query_length == QUERY_LENGTH
    else:
        assert model[0].query_expansion == {**EXPANSION, "attend": True}
    for is_query, texts in ((True, QUERIES), (False, DOCUMENTS)):
        _assert_same(st6_reference(folder, texts, is_query),
                     pylate_reference(folder, texts, is_query))
    lengths = [len(v) for v in st6_reference(folder, QUERIES, True)]
    if knobs.get("do_query_expansion") is False:
        assert lengths[0] == 4 and max(lengths) == QUERY_LENGTH  # [CLS] [unused0] a [SEP]
    else:
        assert set(lengths) == {QUERY_LENGTH}


def test_whitespace_differs_on_byte_level_bpe(folders):
    """PyLate tokenizes through sentence-transformers 5's Transformer.tokenize, which strips
    each text; ST6 prepends the prompt and tokenizes the text as given. On a byte-level BPE
    (ModernBERT) a leading space is part of the next token ("ĠParis" vs "Paris") and a trailing
    one is a token of its own, so the two disagree there; WordPiece (BERT) ignores it."""
    texts = ["  Paris is the capital of France. ", "hello world "]
    modern = folders["pylate-modernbert"]
    for is_query in (True, False):
        pylate = pylate_reference(modern, texts, is_query)
        st6 = st6_reference(modern, texts, is_query)
        assert any(a.shape != b.shape or not np.allclose(a, b, atol=1e-5)
                   for a, b in zip(st6, pylate, strict=True))
        _assert_same(st6_reference(modern, [t.strip() for t in texts], is_query), pylate)
        bert = folders["pylate-bert"]
        _assert_same(st6_reference(bert, texts, is_query), pylate_reference(bert, texts, is_query))
    features = load_st6(modern).preprocess([texts[0]], prompt="[D] ", task="document")
    tokens = load_st6(modern).tokenizer.convert_ids_to_tokens(features["input_ids"][0])
    assert tokens[:3] == ["[CLS]", "[D] ", "Ġ"]


def test_skiplist_word_that_is_no_token_differs(tmp_path):
    """PyLate maps every skiplist word with ``convert_tokens_to_ids``: one that is not a single
    token becomes [UNK]'s id, so PyLate then drops every [UNK] from documents. ST6 drops such a
    word from the skiplist (with a warning) and keeps the [UNK] vectors."""
    folder = build_pylate_colbert(tmp_path / "unk", skiplist_words=PUNCTUATION + ["..."])
    documents = ["hello \u263a world", "hello world"]  # U+263A is not in the tiny vocabulary
    pylate = pylate_reference(folder, documents, False)
    st6 = st6_reference(folder, documents, False)
    assert [len(v) for v in pylate] == [5, 5]  # [CLS] [unused1] hello world [SEP]
    assert [len(v) for v in st6] == [6, 5]  # ... hello [UNK] world ...
    np.testing.assert_allclose(st6[1], pylate[1], atol=1e-5)
    # Same forward pass, only the mask differs: ST6 without the [UNK] row is PyLate.
    np.testing.assert_allclose(np.delete(st6[0], 3, axis=0), pylate[0], atol=1e-5)


# --- ST6 native folders --------------------------------------------------------------------


def _scored_tokens(model, text: str, task: str) -> list[str]:
    """The tokens ST6 should keep: prompt + text tokenized to the task's length, without
    punctuation for documents, padded with [MASK] to QUERY_LENGTH for queries."""
    length = QUERY_LENGTH if task == "query" else DOCUMENT_LENGTH
    ids = model.tokenizer(model.prompts[task] + text, truncation=True,
                          max_length=length)["input_ids"]
    tokens = model.tokenizer.convert_ids_to_tokens(ids)
    if task == "query":
        return tokens + ["[MASK]"] * (QUERY_LENGTH - len(tokens))
    return [t for t in tokens if t not in PUNCTUATION]


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_st6_expands_queries_and_skips_punctuation(folders, arch):
    folder = folders[f"st6-{arch}"]
    model = load_st6(folder)
    queries = st6_reference(folder, QUERIES, True)
    documents = st6_reference(folder, DOCUMENTS, False)
    assert {q.shape for q in queries} == {(QUERY_LENGTH, DIM)}
    assert [len(d) for d in documents] == [len(_scored_tokens(model, t, "document"))
                                           for t in DOCUMENTS]
    assert len(documents[DOCUMENTS.index(LONG)]) < DOCUMENT_LENGTH  # truncated, then skipped
    short = model.preprocess([QUERIES[0]], prompt=model.prompts["query"], task="query")
    tokens = model.tokenizer.convert_ids_to_tokens(short["input_ids"][0])
    assert tokens == _scored_tokens(model, QUERIES[0], "query")
    assert short["attention_mask"][0].tolist() == [1] * 4 + [0] * (QUERY_LENGTH - 4)
    for vectors in queries + documents:
        np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    if arch == "bert":  # punctuation only: [CLS], the marker and [SEP] remain
        assert len(documents[-1]) == 3
    else:  # byte-level: the two spaces are tokens ("Ġ") of their own, not punctuation
        assert len(documents[-1]) == 5


def test_maxsim_matches_st6_similarity(folders):
    import torch

    folder = folders["st6-bert"]
    queries = st6_reference(folder, QUERIES[:3], True)
    documents = st6_reference(folder, DOCUMENTS[:4], False)
    expected = load_st6(folder).similarity([torch.from_numpy(q) for q in queries],
                                           [torch.from_numpy(d) for d in documents])
    ours = np.array([[maxsim(q, d) for d in documents] for q in queries])
    np.testing.assert_allclose(ours, expected.numpy(), atol=1e-4)
    assert maxsim(queries[0], queries[0]) == pytest.approx(QUERY_LENGTH, abs=1e-4)


def test_builds_are_deterministic(tmp_path, folders):
    again = build_pylate_colbert(tmp_path / "again")
    for name in ("model.safetensors", "1_Dense/model.safetensors", "tokenizer.json",
                 "config_sentence_transformers.json"):
        assert (again / name).read_bytes() == (folders["pylate-bert"] / name).read_bytes()
    st6_again = build_st6_colbert(tmp_path / "st6-again", "modernbert")
    _assert_same(st6_reference(st6_again, DOCUMENTS, False),
                 st6_reference(folders["st6-modernbert"], DOCUMENTS, False))
