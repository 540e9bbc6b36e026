"""bge-m3 hybrid (kind ``hybrid``) on a tiny random XLM-R with FlagEmbedding's two heads:
dense, sparse and ColBERT outputs equal FlagEmbedding ``BGEM3``'s formulas, written out
here over a plain transformers forward pass of each text alone, whether a text runs alone
or in a batch of mixed lengths; the opener table loads the folder on torch and specs
refuse other backends."""

from __future__ import annotations

import numpy as np
import pytest

from blitz.loading.load import load_encoder
from blitz.settings.registry import ModelSpec
from tests.tiny_hybrid import build_tiny_hybrid

TEXTS = ["the quick brown fox jumps over the lazy dog", "a", "paris is the capital of france",
         "hello world hello world zzz", "one two three four five six seven eight nine ten"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_hybrid(tmp_path_factory.mktemp("bge-m3") / "m", seed=45)


@pytest.fixture(scope="module")
def encoder(tiny):
    return load_encoder(ModelSpec(id="m3", source=str(tiny), kind="hybrid"))


def reference(folder, text: str) -> tuple[np.ndarray, dict[int, float], np.ndarray]:
    """FlagEmbedding's BGEM3 on one text: H = XLM-R's last hidden state; dense =
    normalize(H[:, 0]); sparse: w = relu(sparse_linear(H)).squeeze(-1), per token id the
    max of its weights, cls/eos/pad/unk dropped, zeros left out; colbert =
    normalize(colbert_linear(H[:, 1:]) * attention_mask[:, 1:, None])."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModel.from_pretrained(str(folder)).eval()
    hidden = model.config.hidden_size
    sparse_linear, colbert_linear = torch.nn.Linear(hidden, 1), torch.nn.Linear(hidden, hidden)
    sparse_linear.load_state_dict(torch.load(folder / "sparse_linear.pt"))
    colbert_linear.load_state_dict(torch.load(folder / "colbert_linear.pt"))
    batch = tokenizer([text], return_tensors="pt")
    with torch.inference_mode():
        h = model(**batch).last_hidden_state
        dense = torch.nn.functional.normalize(h[:, 0], dim=-1)[0].numpy()
        w = torch.relu(sparse_linear(h)).squeeze(-1)[0].numpy()
        colbert = colbert_linear(h[:, 1:]) * batch["attention_mask"][:, 1:][:, :, None]
        colbert = torch.nn.functional.normalize(colbert, dim=-1)[0].numpy()
    unused = {tokenizer.cls_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id,
              tokenizer.unk_token_id}
    lexical: dict[int, float] = {}
    for token, weight in zip(batch["input_ids"][0].tolist(), w.tolist(), strict=True):
        if token not in unused and weight > 0:
            lexical[token] = max(lexical.get(token, 0.0), weight)
    return dense, lexical, colbert


@pytest.fixture(scope="module")
def references(tiny):
    return [reference(tiny, text) for text in TEXTS]


def split(part, counts):
    return np.split(part, np.cumsum(counts)[:-1])


def check(result, references) -> None:
    sparse_rows = list(zip(split(result.sparse.indices, result.sparse.rows),
                           split(result.sparse.values, result.sparse.rows), strict=True))
    colbert_rows = split(result.colbert.values, result.colbert.token_counts)
    for k, (dense, lexical, colbert) in enumerate(references):
        np.testing.assert_allclose(result.dense.values[k], dense, atol=1e-5)
        indices, values = sparse_rows[k]
        assert indices.tolist() == sorted(lexical)
        np.testing.assert_allclose(values, [lexical[i] for i in sorted(lexical)], atol=1e-5)
        np.testing.assert_allclose(colbert_rows[k], colbert, atol=1e-5)


def test_all_three_outputs_equal_the_reference_formulas_in_a_mixed_length_batch(
        encoder, references):
    result = encoder.hybrid(TEXTS)
    assert result.dense.values.shape == (len(TEXTS), 32)
    assert result.sparse.rows.sum() > 0  # the random head leaves some weights above zero
    check(result, references)


def test_each_text_alone_gets_what_it_gets_in_a_batch(encoder, references):
    for text, ref in zip(TEXTS, references, strict=True):
        check(encoder.hybrid([text]), [ref])


def test_the_existing_outputs_are_dense_sparse_and_colbert(encoder, references):
    dense = encoder.embed(TEXTS, normalize=True)
    np.testing.assert_allclose(dense.values, np.stack([r[0] for r in references]), atol=1e-5)
    sparse = encoder.embed_sparse(TEXTS)
    hybrid = encoder.hybrid(TEXTS)
    assert np.array_equal(sparse.indices, hybrid.sparse.indices)
    assert np.array_equal(sparse.rows, hybrid.sparse.rows)
    colbert = encoder.embed_all(TEXTS)
    assert colbert.token_counts.tolist() == [len(r[2]) for r in references]
    np.testing.assert_allclose(colbert.values, np.concatenate([r[2] for r in references]),
                               atol=1e-5)


def test_a_hybrid_model_refuses_other_cpu_backends():
    with pytest.raises(ValueError, match="hybrid models run on torch"):
        ModelSpec(id="m3", source="/x", kind="hybrid", cpu_backend="onnx")


def test_a_folder_without_the_heads_fails_to_load_naming_the_missing_file(tmp_path):
    from blitz.errors import ModelLoadFailed

    folder = build_tiny_hybrid(tmp_path / "m")
    (folder / "colbert_linear.pt").unlink()
    with pytest.raises(ModelLoadFailed, match="colbert_linear.pt"):
        load_encoder(ModelSpec(id="m3", source=str(folder), kind="hybrid"))


def test_rerank_scores_are_maxsim_over_the_colbert_vectors(encoder, references):
    """FlagEmbedding's colbert_score: sum over the query's vectors of their max dot product
    with the document's, over the number of query vectors."""
    query, documents = TEXTS[0], TEXTS[1:]
    q = references[0][2]
    want = [float((q @ ref[2].T).max(axis=1).sum() / len(q)) for ref in references[1:]]
    scores = encoder.score(query, documents)
    np.testing.assert_allclose(scores.values, want, atol=1e-5)
    assert scores.token_counts.tolist() == [
        len(r[2]) + len(q) + 2 for r in references[1:]]  # each text's tokens, CLS included
