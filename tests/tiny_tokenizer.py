"""A tiny word-level tokenizer for the decoder-family test models (Qwen3, Gemma3, Llama,
Mistral...): their real tokenizers cannot be downloaded here, and the models only need one
that is deterministic, covers the test texts and knows the special tokens the families use.

``save_tiny_tokenizer(directory, padding_side=...)`` writes ``tokenizer.json`` and
``tokenizer_config.json`` that ``AutoTokenizer.from_pretrained`` opens as a
``PreTrainedTokenizerFast``: lower-cased words and punctuation, an unknown token for the
rest, ``<|endoftext|>`` as pad and EOS, ``<bos>`` as BOS, and words such as "yes" and "no"
each one token (an LLM reranker reads their logits). ``VOCAB_SIZE`` sizes the model's
embedding table.
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIAL = ["<unk>", "<|endoftext|>", "<bos>", "<|im_start|>", "<|im_end|>"]
WORDS = ("yes no the a an of to and in is it that for on with as at by from this be are "
         "was were fox dog quick brown lazy jumps over query document instruct given web "
         "search retrieve relevant passages answer judge whether meets requirements note "
         "can only system user assistant think hello world embedding model text long short "
         "paris france capital city river sea cat bird tree red green blue one two three "
         "four five six seven eight nine ten what which who how why when where b").split()
PUNCTUATION = list(".,:;!?'\"()[]{}<>-_/\\|@#$%^&*+=~`\n")
VOCAB = {token: i for i, token in enumerate(SPECIAL + sorted(set(WORDS)) + PUNCTUATION)}
VOCAB_SIZE = len(VOCAB)


def save_tiny_tokenizer(directory: str | Path, *, padding_side: str = "right",
                        add_bos: bool = False) -> Path:
    """The tokenizer's files in ``directory`` (made if missing); returns the directory."""
    from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers, processors

    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.WordLevel(vocab=VOCAB, unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t in SPECIAL])
    if add_bos:
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", VOCAB["<bos>"])])
    tokenizer.save(str(target / "tokenizer.json"))
    (target / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 512,
        "padding_side": padding_side, "pad_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>", "bos_token": "<bos>", "unk_token": "<unk>",
        "add_bos_token": add_bos, "model_input_names": ["input_ids", "attention_mask"]}))
    return target
