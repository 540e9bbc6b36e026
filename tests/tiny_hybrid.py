"""A tiny random bge-m3 folder: an XLM-R model (``XLMRobertaModel``, random weights), a
word-level tokenizer with XLM-R's special tokens (``<s>`` 0, ``<pad>`` 1, ``</s>`` 2,
``<unk>`` 3; texts become ``<s> ... </s>``) and the two heads FlagEmbedding's ``BGEM3``
keeps beside the model, ``sparse_linear.pt`` (hidden -> 1) and ``colbert_linear.pt``
(hidden -> hidden). Built offline: bge-m3's own files cannot be downloaded here."""

from __future__ import annotations

import json
from pathlib import Path

from tests.tiny_tokenizer import PUNCTUATION, WORDS

SPECIAL = ["<s>", "<pad>", "</s>", "<unk>"]
VOCAB = {token: i for i, token in enumerate(SPECIAL + sorted(set(WORDS)) + PUNCTUATION)}


def save_xlmr_tokenizer(directory: Path) -> None:
    from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers, processors

    tokenizer = Tokenizer(models.WordLevel(vocab=VOCAB, unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t in SPECIAL])
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)])
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 64,
        "padding_side": "right", "bos_token": "<s>", "cls_token": "<s>", "eos_token": "</s>",
        "sep_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>",
        "model_input_names": ["input_ids", "attention_mask"]}))


def build_tiny_hybrid(directory: str | Path, *, seed: int = 0, hidden: int = 32) -> Path:
    """The folder, made if missing; returns it."""
    import torch
    from transformers import XLMRobertaConfig, XLMRobertaModel

    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = XLMRobertaConfig(vocab_size=len(VOCAB), hidden_size=hidden, num_hidden_layers=2,
                              num_attention_heads=2, intermediate_size=48,
                              max_position_embeddings=66, pad_token_id=1, bos_token_id=0,
                              eos_token_id=2)
    XLMRobertaModel(config, add_pooling_layer=False).eval().save_pretrained(str(target))
    save_xlmr_tokenizer(target)
    torch.save(torch.nn.Linear(hidden, 1).state_dict(), target / "sparse_linear.pt")
    torch.save(torch.nn.Linear(hidden, hidden).state_dict(), target / "colbert_linear.pt")
    return target
