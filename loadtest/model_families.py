"""Throughput of each model family at its real size, Blitz against the reference library,
on random weights built offline from configs (docs/models-throughput.md).

Four shapes, each written to a temporary folder as the real model's repository lays it
out (no download; the weights are random, so the figures say how fast, not how good):

- ``qwen3-embedding``: Qwen3-Embedding-0.6B (Qwen3, 28 layers, hidden 1024), a
  sentence-transformers folder with last-token pooling and the EOS the tokenizer appends;
- ``embeddinggemma``: EmbeddingGemma-300m (Gemma3 text, bidirectional, 24 layers, hidden
  768), mean pooling and its two Dense layers (768 -> 3072 -> 768);
- ``bge-m3``: XLM-R large (24 layers, hidden 1024) with CLS pooling and FlagEmbedding's
  ``sparse_linear.pt`` and ``colbert_linear.pt`` (Blitz ``kind: hybrid``);
- ``qwen3-reranker``: Qwen3-Reranker-0.6B, the same Qwen3 as a causal LM.

The tokenizer is word-level with the model's real vocabulary size (the corpus's words,
then filler entries): tokenizing costs next to nothing beside a forward pass here.

Engines, in interleaved rounds (A, B, A, B...): ``blitz`` is
``load_encoder(spec).embed`` / ``embed_hybrid`` / ``score``, what a pool replica runs;
``reference`` is ``SentenceTransformer.encode`` on the same folder (embedders) or the
Qwen3-Reranker model card's code (prompt, left padding, ``logits[:, -1]``, softmax over
no/yes) for the reranker. Each measurement runs whole calls for at least ``--seconds``;
the report gives each round's items/s and the median of the per-round ratios
blitz / reference, the figure to trust on a shared machine, with the agreement of the
outputs (cosine, or the largest score difference) as a check that both did the same work.

    python -m loadtest.model_families --rounds 3 --out results/model-families
    python -m loadtest.model_families --families qwen3-embedding --backends onnx,onnx-int8
    python -m loadtest.model_families --device cuda --dtype float16 --batch 256  # a GPU pool
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.corpus import sentences
from loadtest.report import environment, fmt, markdown_table

QWEN3 = dict(vocab_size=151669, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
             num_attention_heads=16, num_key_value_heads=8, head_dim=128,
             max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
             tie_word_embeddings=True)
GEMMA = dict(vocab_size=262144, hidden_size=768, intermediate_size=1152, num_hidden_layers=24,
             num_attention_heads=3, num_key_value_heads=1, head_dim=256,
             max_position_embeddings=2048, query_pre_attn_scalar=256, sliding_window=512,
             rope_theta=1000000.0, rope_local_base_freq=10000.0, rms_norm_eps=1e-6,
             use_bidirectional_attention=True, layer_types=None)
XLMR = dict(vocab_size=250002, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
            intermediate_size=4096, max_position_embeddings=8194, type_vocab_size=1,
            layer_norm_eps=1e-5)
FAMILIES = ("qwen3-embedding", "embeddinggemma", "bge-m3", "qwen3-reranker")
QWEN3_PREFIX = ("<|im_start|>system\nJudge whether the Document meets the requirements based "
                "on the Query and the Instruct provided. Note that the answer can only be "
                "\"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n")
QWEN3_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
QWEN3_TASK = "Given a web search query, retrieve relevant passages that answer the query"
SPECIALS = {"qwen3": ["<|endoftext|>", "<unk>", "<|im_start|>", "<|im_end|>"],
            "gemma": ["<pad>", "<eos>", "<bos>", "<unk>"],
            "xlmr": ["<s>", "<pad>", "</s>", "<unk>"]}
_WORD = re.compile(r"\w+|[^\w\s]")


def corpus(count: int, words: int, seed: int = 0) -> list[str]:
    """``count`` texts of about ``words`` words and punctuation marks (about that many
    tokens with the word-level tokenizer), from ``loadtest.corpus`` sentences."""
    stream, texts = iter(sentences(count * (words // 8 + 8), seed)), []
    for _ in range(count):
        parts: list[str] = []
        while sum(len(_WORD.findall(p)) for p in parts) < words:
            parts.append(next(stream))
        texts.append(" ".join(parts))
    return texts


def save_tokenizer(directory: Path, style: str, vocab_size: int, texts: list[str]) -> None:
    """A word-level tokenizer of ``vocab_size`` entries in ``directory``, with the family's
    special tokens and habits: Qwen3 pads left and appends ``<|endoftext|>`` (Qwen3-Embedding's
    pooled token; ``qwen3-lm``, the reranker's, adds none); Gemma puts ``<bos>`` in front and ``<eos>`` after; XLM-R writes
    ``<s> ... </s>``."""
    from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers, processors

    specials = SPECIALS[style.split("-")[0]]
    words = sorted({w for t in texts + [QWEN3_PREFIX, QWEN3_SUFFIX, QWEN3_TASK, "yes no"]
                    for w in _WORD.findall(t.lower())})
    vocab = {token: i for i, token in enumerate(specials + words)}
    vocab.update({f"<filler{i}>": i for i in range(len(vocab), vocab_size)})
    unk = "<unk>"
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token=unk))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t in specials])
    first, last = {"qwen3": (None, "<|endoftext|>"), "qwen3-lm": (None, None),
                   "gemma": ("<bos>", "<eos>"), "xlmr": ("<s>", "</s>")}[style]
    single = " ".join(t for t in (first, "$A", last) if t)
    pair = " ".join(t for t in (first, "$A", last, "$B:1", last and f"{last}:1") if t)
    used = [t for t in (first, last) if t]
    if used:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=single, pair=pair, special_tokens=[(t, vocab[t]) for t in used])
    tokenizer.save(str(directory / "tokenizer.json"))
    pad = {"gemma": "<pad>", "xlmr": "<pad>"}.get(style, "<|endoftext|>")
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 8192,
        "padding_side": "left" if style.startswith("qwen3") else "right", "pad_token": pad,
        "eos_token": last or pad, "bos_token": first, "unk_token": unk,
        "model_input_names": ["input_ids", "attention_mask"]}))


def build(family: str, root: Path, texts: list[str]) -> Path:
    """``family``'s folder under ``root`` (random weights, seeded); returns it."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import (
        Dense,
        Normalize,
        Pooling,
        Transformer,
    )
    from transformers import (
        AutoModel,
        Gemma3TextConfig,
        Qwen3Config,
        Qwen3ForCausalLM,
        XLMRobertaConfig,
    )

    torch.manual_seed(0)
    plain, st = root / "plain", root / "st"
    config: Any
    ids = {"pad_token_id": 0, "eos_token_id": 0}  # Qwen3's <|endoftext|>, XLM-R's <s>
    if family == "qwen3-reranker":
        Qwen3ForCausalLM(Qwen3Config(**QWEN3, **ids)).eval().save_pretrained(str(plain))
        save_tokenizer(plain, "qwen3-lm", int(QWEN3["vocab_size"]), texts)
        return plain
    if family == "qwen3-embedding":
        config, style, pooling = Qwen3Config(**QWEN3, **ids), "qwen3", "lasttoken"
    elif family == "embeddinggemma":
        config = Gemma3TextConfig(**GEMMA, pad_token_id=0, eos_token_id=1, bos_token_id=2)
        style, pooling = "gemma", "mean"
    else:
        config = XLMRobertaConfig(**XLMR, pad_token_id=1, bos_token_id=0, eos_token_id=2)
        style, pooling = "xlmr", "cls"
    kwargs = {"add_pooling_layer": False} if style == "xlmr" else {}
    AutoModel.from_config(config, **kwargs).eval().save_pretrained(str(plain))
    save_tokenizer(plain, style, config.vocab_size, texts)
    word = Transformer(str(plain), max_seq_length=8192 if style == "xlmr" else 2048)
    hidden = word.get_embedding_dimension()
    modules: list[Any] = [word, Pooling(hidden, pooling)]
    if style == "gemma":  # EmbeddingGemma's 768 -> 3072 -> 768 projections
        modules += [Dense(hidden, 4 * hidden, bias=False, activation_function=torch.nn.Identity()),
                    Dense(4 * hidden, hidden, bias=False, activation_function=torch.nn.Identity())]
    SentenceTransformer(modules=[*modules, Normalize()], device="cpu").save(str(st))
    if style == "xlmr":  # FlagEmbedding's heads beside the model
        torch.save(torch.nn.Linear(hidden, 1).state_dict(), st / "sparse_linear.pt")
        torch.save(torch.nn.Linear(hidden, hidden).state_dict(), st / "colbert_linear.pt")
    return st


def blitz_engine(family: str, folder: Path, backend: str, cache: Path, device: str = "cpu",
                 dtype: str = "float16") -> Callable[..., Any]:
    """What a pool replica runs: ``load_encoder`` for ``device`` (a GPU: in ``dtype``)."""
    from blitz.loading.load import load_encoder
    from blitz.settings.registry import ModelSpec

    on = {"gpu_dtype": dtype}
    if family == "qwen3-reranker":
        encoder = load_encoder(ModelSpec(id=family, source=str(folder), kind="llm-reranker",
                                         **on), device)
        return lambda query, docs: encoder.score(query, docs).values
    if family == "bge-m3":
        encoder = load_encoder(ModelSpec(id=family, source=str(folder), kind="hybrid", **on),
                               device)
        outputs = ("dense", "sparse", "colbert")
        return lambda texts: encoder.embed_hybrid(texts, outputs).outputs["dense"].values  # type: ignore[index]
    encoder = load_encoder(ModelSpec(id=family, source=str(folder), cpu_backend=backend,
                                     accuracy_threshold=0.9, **on), device, cache_dir=cache)
    return lambda texts: encoder.embed(texts, normalize=True).values


def reference_engine(family: str, folder: Path, device: str = "cpu", dtype: str = "float16",
                     batch: int = 32) -> Callable[..., Any]:
    """The reference library on ``device`` (a GPU: weights in ``dtype``, as Blitz's)."""
    import torch

    weights = getattr(torch, dtype) if device != "cpu" else torch.float32
    if family != "qwen3-reranker":
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(str(folder), device=device,
                                    model_kwargs={"dtype": weights})
        return lambda texts: model.encode(texts, batch_size=batch, normalize_embeddings=True,
                                          convert_to_numpy=True, show_progress_bar=False)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder), padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=weights).to(device).eval()
    yes, no = tokenizer.convert_tokens_to_ids("yes"), tokenizer.convert_tokens_to_ids("no")
    prefix = tokenizer.encode(QWEN3_PREFIX, add_special_tokens=False)
    suffix = tokenizer.encode(QWEN3_SUFFIX, add_special_tokens=False)

    def score(query: str, docs: list[str]) -> np.ndarray:  # the model card's code
        pairs = [f"<Instruct>: {QWEN3_TASK}\n<Query>: {query}\n<Document>: {d}" for d in docs]
        inputs = tokenizer(pairs, padding=False, truncation="longest_first",
                           return_attention_mask=False,
                           max_length=8192 - len(prefix) - len(suffix))
        inputs["input_ids"] = [prefix + ids + suffix for ids in inputs["input_ids"]]
        inputs = tokenizer.pad(inputs, padding=True, return_tensors="pt").to(device)
        with torch.inference_mode():
            last = model(**inputs).logits[:, -1, :].float()
        pair = torch.nn.functional.log_softmax(torch.stack([last[:, no], last[:, yes]], 1), 1)
        return pair[:, 1].exp().cpu().numpy()
    return score


def timed(call: Callable[[], Any], seconds: float) -> tuple[float, int, Any]:
    """Seconds per call over whole calls lasting at least ``seconds`` (one at least)."""
    calls, start, out = 0, time.perf_counter(), None
    while calls == 0 or time.perf_counter() - start < seconds:
        out = call()
        calls += 1
    return (time.perf_counter() - start) / calls, calls, out


def agreement(family: str, a: Any, b: Any) -> float:
    """Cosine's minimum over rows (embedders) or the largest score difference (reranker)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if family == "qwen3-reranker":
        return float(np.abs(a - b).max())
    a, b = a / np.linalg.norm(a, axis=1, keepdims=True), b / np.linalg.norm(b, axis=1, keepdims=True)
    return float((a * b).sum(axis=1).min())


def measure_family(family: str, backends: list[str], args: argparse.Namespace,
                   root: Path) -> list[dict[str, Any]]:
    texts = corpus(args.batch + 1, args.tokens)
    query = "what is the capital of france and why is it known for its river?"
    start = time.perf_counter()
    folder = build(family, root / family, texts)
    built_s = time.perf_counter() - start
    print(f"{family}: built in {built_s:.0f}s at {folder}", flush=True)
    workloads = {"batch": texts[:args.batch], "single": texts[args.batch:]}
    rows = []
    reference = reference_engine(family, folder, args.device, args.dtype, args.batch)
    for backend in backends:
        start = time.perf_counter()
        try:
            blitz = blitz_engine(family, folder, backend, root / "cache", args.device,
                                 args.dtype)
        except Exception as exc:  # an export too slow or refused: say so, go on
            print(f"{family} {backend}: not loaded ({type(exc).__name__}: {exc})"[:400])
            rows.append({"family": family, "backend": backend, "error": str(exc)[:300]})
            continue
        load_s = time.perf_counter() - start
        print(f"{family} {backend}: loaded in {load_s:.0f}s", flush=True)
        engines: dict[str, Callable[..., Any]] = {"blitz": blitz, "reference": reference}
        for workload, items in workloads.items():
            def call(engine: str, items: list[str] = items,
                     engines: dict[str, Callable[..., Any]] = engines) -> Any:
                if family == "qwen3-reranker":
                    return engines[engine](query, items)
                return engines[engine](items)

            outputs = {name: call(name) for name in engines}  # warm-up, and the check
            agree = agreement(family, outputs["blitz"], outputs["reference"])
            print(f"  {family} {backend} {workload}: agreement {agree:.6f}", flush=True)
            rounds = []
            for r in range(args.rounds):
                per_s = {}
                for name in engines if r % 2 == 0 else reversed(list(engines)):
                    seconds, calls, _ = timed(partial(call, name), args.seconds)
                    per_s[name] = len(items) / seconds
                rounds.append({**per_s, "ratio": per_s["blitz"] / per_s["reference"]})
                print(f"  {family} {backend} {workload} round {r + 1}: blitz "
                      f"{per_s['blitz']:.2f}/s, reference {per_s['reference']:.2f}/s", flush=True)
            row: dict[str, Any] = {
                "family": family, "backend": backend, "workload": workload,
                "items_per_call": len(items), "built_s": built_s, "load_s": load_s,
                "agreement": agree,
                "rounds": rounds,
                "blitz_per_s": statistics.median(x["blitz"] for x in rounds),
                "reference_per_s": statistics.median(x["reference"] for x in rounds),
                "ratio": statistics.median(x["ratio"] for x in rounds),
                "ratio_min": min(x["ratio"] for x in rounds),
                "ratio_max": max(x["ratio"] for x in rounds)}
            rows.append(row)
        engines.clear()
        del blitz
        gc.collect()
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    headers = ["family", "backend", "texts/call", "Blitz /s", "reference /s",
               "Blitz / reference (min-max)", "agreement", "load s"]
    body = []
    for r in rows:
        if "error" in r:
            body.append([r["family"], r["backend"], "-", "-", "-", r["error"][:80], "-", "-"])
            continue
        body.append([r["family"], r["backend"], str(r["items_per_call"]), fmt(r["blitz_per_s"], 2),
                     fmt(r["reference_per_s"], 2),
                     f"{r['ratio']:.2f}x ({r['ratio_min']:.2f}-{r['ratio_max']:.2f})",
                     f"{r['agreement']:.5f}", fmt(r["load_s"], 0)])
    return markdown_table(headers, body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--backends", default="torch",
                        help="Blitz CPU backends for the two decoder embedders (bge-m3 and "
                             "the reranker run torch only)")
    parser.add_argument("--batch", type=int, default=32, help="texts (or documents) per call")
    parser.add_argument("--tokens", type=int, default=100, help="about this many per text")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="at least, per figure")
    parser.add_argument("--out", type=Path, default=None, help="folder for the JSON report")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda: a GPU pool's load")
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"],
                        help="on a GPU: Blitz's gpu_dtype and the reference's weights")
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="blitz-families-") as tmp:
        for family in args.families.split(","):
            backends = (args.backends.split(",")
                        if family in ("qwen3-embedding", "embeddinggemma") else ["torch"])
            rows += measure_family(family, backends, args, Path(tmp))
            gc.collect()
    table = markdown(rows)
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "model_families.json").write_text(json.dumps(
            {"kind": "model_families", "environment": environment(), "args": {
                k: str(v) for k, v in vars(args).items()}, "results": rows}, indent=1))
        (args.out / "model_families.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
