"""Tiny random causal LMs for the LLM reranker tests, built offline from configs: a
``Qwen3ForCausalLM`` (the qwen3 style), a ``GemmaForCausalLM`` (the bge-gemma style) and
a ``GPT2LMHeadModel`` (absolute positions),
each with ``tests/tiny_tokenizer.py``'s word-level tokenizer, where "yes" and "no" are one
token each (it lower-cases, so "Yes" is "yes" too).

``reference_scores`` is the model cards' formula in plain transformers, written out
independently of Blitz: the prompt as the card builds it, one forward pass on the model,
the logits at the last position.
"""

from __future__ import annotations

from pathlib import Path

from tests.tiny_tokenizer import VOCAB_SIZE, save_tiny_tokenizer

QWEN3_PREFIX = ("<|im_start|>system\nJudge whether the Document meets the requirements based "
                "on the Query and the Instruct provided. Note that the answer can only be "
                "\"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n")
QWEN3_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
QWEN3_TASK = "Given a web search query, retrieve relevant passages that answer the query"
GEMMA_PROMPT = ("Given a query A and a passage B, determine whether the passage contains an "
                "answer to the query by providing a prediction of either 'Yes' or 'No'.")
_SMALL = {"vocab_size": VOCAB_SIZE, "hidden_size": 48, "intermediate_size": 96,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 12, "max_position_embeddings": 512, "initializer_range": 0.2,
          "pad_token_id": 1, "eos_token_id": 1, "bos_token_id": 2}


def _save(model, directory: Path, *, add_bos: bool) -> Path:
    model.save_pretrained(str(directory))
    save_tiny_tokenizer(directory, padding_side="left", add_bos=add_bos)
    return directory


def build_tiny_qwen3_reranker(directory: str | Path, seed: int = 0) -> Path:
    """A random two-layer Qwen3 causal LM and its tokenizer (no BOS) in ``directory``."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(Qwen3Config(**_SMALL, tie_word_embeddings=False)).eval()
    return _save(model, Path(directory), add_bos=False)


def build_tiny_gemma_reranker(directory: str | Path, seed: int = 0) -> Path:
    """A random two-layer Gemma causal LM and its tokenizer (with BOS) in ``directory``."""
    import torch
    from transformers import GemmaConfig, GemmaForCausalLM

    torch.manual_seed(seed)
    model = GemmaForCausalLM(GemmaConfig(**_SMALL)).eval()
    return _save(model, Path(directory), add_bos=True)


def build_tiny_gpt2_reranker(directory: str | Path, seed: int = 0) -> Path:
    """A random two-layer GPT-2 (learned absolute positions, where left padding would move
    every token unless the position ids follow the mask) and its tokenizer."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=VOCAB_SIZE, n_embd=48, n_layer=2, n_head=4, n_positions=512,
                        initializer_range=0.2, pad_token_id=1, eos_token_id=1, bos_token_id=2)
    return _save(GPT2LMHeadModel(config).eval(), Path(directory), add_bos=False)


def reference_scores(directory: Path, style: str, query: str, documents: list[str], *,
                     instruction: str | None = None) -> list[float]:
    """Each document's score by the model card, one forward pass per document (qwen3:
    softmax over the [no, yes] logits, then yes; bge-gemma: sigmoid of the yes logit)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    model = AutoModelForCausalLM.from_pretrained(str(directory)).eval()

    def ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    scores = []
    for document in documents:
        if style == "qwen3":
            body = (f"<Instruct>: {instruction or QWEN3_TASK}\n<Query>: {query}\n"
                    f"<Document>: {document}")
            sequence = ids(QWEN3_PREFIX) + ids(body) + ids(QWEN3_SUFFIX)
        else:
            sequence = ([tokenizer.bos_token_id] + ids(f"A: {query}") + ids("\n")
                        + ids(f"B: {document}") + ids("\n") + ids(instruction or GEMMA_PROMPT))
        with torch.inference_mode():
            last = model(input_ids=torch.tensor([sequence])).logits[0, -1, :]
        yes = last[tokenizer.convert_tokens_to_ids("yes")]
        if style == "qwen3":
            no = last[tokenizer.convert_tokens_to_ids("no")]
            scores.append(float(torch.softmax(torch.stack([no, yes]), dim=0)[1]))
        else:
            scores.append(float(torch.sigmoid(yes)))
    return scores
