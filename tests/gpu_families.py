"""The model families on a GPU pool's load path, checked on one GPU (docs/models-throughput.md,
"On a GPU"): what the CPU suite cannot show.

1. **Agreement in fp16 and bf16**: each decoder family (Qwen3, Gemma3, Llama, Mistral; a
   sentence-transformers folder and a plain checkpoint with ``pooling: lasttoken``), a
   bge-m3 hybrid and the two LLM-reranker styles, tiny random models built from configs
   (the suite's own builders), loaded by ``load_encoder(spec, "cuda:0")`` as a GPU pool
   loads them, against sentence-transformers' ``encode`` in fp32 on the CPU (embedders;
   alone, together and mixed with another request) or Blitz's own fp32 CPU load (the
   hybrid's outputs, the rerankers' scores: both are equal to their reference formulas
   in the CPU suite).
2. **An 8B-shaped model at 32K tokens**: Qwen3-Embedding-8B's shape (36 layers, hidden 4096,
   grouped queries, 151,669 vocabulary) with random bf16 weights made on the GPU, behind a
   tiny tokenizer, sized by the pool's memory rule (``blitz.pool.memory_budget``): one
   text of 32,760 tokens, a batch of long texts and a full token budget of short ones run
   without running out of memory, and each call's measured peak is set beside the rule's.
   Then the rule's verdict on a 0.6B embedder, this 8B embedder and a 0.6B reranker in one
   GPU pool's budget.

    python -m tests.gpu_families --out results/gpu-families       # on a GPU machine
    python -m tests.gpu_families --device cpu --small            # the script's smoke run
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

TEXTS = ["hello", "the quick brown fox jumps over the lazy dog " * 8,
         "paris is the capital of france", "cat",
         "what is the red tree by the river? " * 3, "one two three four five six seven",
         "b", "a long text about a bird and a blue sea, " * 5]
QWEN3_8B = dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
                num_key_value_heads=8, head_dim=128, intermediate_size=12288,
                vocab_size=151669, max_position_embeddings=40960, rope_theta=1000000.0,
                rms_norm_eps=1e-6)
SMALL = dict(QWEN3_8B, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, intermediate_size=128, vocab_size=512)
QWEN3_06B = dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, intermediate_size=3072,
                 vocab_size=151669, max_position_embeddings=32768, model_type="qwen3")


def min_cosine(got: np.ndarray, expected: np.ndarray) -> float:
    got = got / np.linalg.norm(got, axis=1, keepdims=True)
    expected = expected / np.linalg.norm(expected, axis=1, keepdims=True)
    return float((got * expected).sum(axis=1).min())


def agreement(device: str, root: Path) -> list[dict[str, Any]]:
    """Part 1 (module docstring)."""
    from sentence_transformers import SentenceTransformer

    from blitz.loading.load import load_encoder
    from blitz.settings.registry import ModelSpec
    from tests.tiny_decoders import FAMILIES, build_decoder
    from tests.tiny_hybrid import build_tiny_hybrid
    from tests.tiny_llm_rerankers import build_tiny_gemma_reranker, build_tiny_qwen3_reranker

    rows: list[dict[str, Any]] = []
    order, other = [5, 1, 6, 3], [0, 7]
    for seed, family in enumerate(FAMILIES):
        built = build_decoder(root / family, family, seed=seed)
        expected = SentenceTransformer(str(built.st), device="cpu").encode(TEXTS)
        for form, spec in (("st", {"source": str(built.st)}),
                           ("plain", {"source": str(built.plain), "pooling": "lasttoken"})):
            for dtype in ("float16", "bfloat16"):
                encoder = load_encoder(ModelSpec(id=family, gpu_dtype=dtype, **spec), device)
                together = encoder.embed(TEXTS, normalize=True).values
                alone = np.concatenate([encoder.embed([t], normalize=True).values
                                        for t in TEXTS])
                mixed = encoder.embed_many([([TEXTS[i] for i in order], True, True),
                                            ([TEXTS[i] for i in other], True, True)])
                rows.append({"model": f"{family} ({form})", "dtype": dtype, "measure": "cosine",
                             "together": min_cosine(together, expected),
                             "alone": min_cosine(alone, expected),
                             "mixed": min(min_cosine(mixed[0].values, expected[order]),
                                          min_cosine(mixed[1].values, expected[other]))})
                print(rows[-1], flush=True)
    hybrid = build_tiny_hybrid(root / "hybrid")
    outputs = ("dense", "sparse", "colbert")
    cpu = load_encoder(ModelSpec(id="hybrid", kind="hybrid", source=str(hybrid)))
    want = cpu.embed_hybrid(TEXTS, outputs).outputs
    for dtype in ("float16", "bfloat16"):
        gpu = load_encoder(ModelSpec(id="hybrid", kind="hybrid", source=str(hybrid),
                                     gpu_dtype=dtype), device)
        got = gpu.embed_hybrid(TEXTS, outputs).outputs
        assert want is not None and got is not None
        colbert = min_cosine(got["colbert"].values, want["colbert"].values)
        rows.append({"model": "bge-m3 hybrid", "dtype": dtype, "measure": "cosine",
                     "together": min_cosine(got["dense"].values, want["dense"].values),
                     "colbert": colbert})
        print(rows[-1], flush=True)
    query, docs = TEXTS[2], TEXTS
    for style, build in (("qwen3", build_tiny_qwen3_reranker),
                         ("bge-gemma", build_tiny_gemma_reranker)):
        folder = build(root / f"reranker-{style}")
        spec = {"id": style, "kind": "llm-reranker", "source": str(folder),
                "reranker_style": style}
        want_scores = load_encoder(ModelSpec(**spec)).score(query, docs).values
        for dtype in ("float16", "bfloat16"):
            got_scores = load_encoder(ModelSpec(**spec, gpu_dtype=dtype), device).score(
                query, docs).values
            rows.append({"model": f"llm-reranker {style}", "dtype": dtype,
                         "measure": "largest score difference",
                         "together": float(np.abs(got_scores - want_scores).max())})
            print(rows[-1], flush=True)
    return rows


def long_inputs(device: str, root: Path, small: bool) -> dict[str, Any]:
    """Part 2 (module docstring)."""
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel, Qwen3Config

    from blitz.encoders.st_models import wrap
    from blitz.pool.memory_budget import (
        ModelShape,
        needed_bytes,
        pool_budget,
        size_model,
    )
    from blitz.settings.pool_settings import PoolSettings
    from blitz.settings.registry import ModelSpec
    from tests.tiny_decoders import build_decoder
    from tests.tiny_tokenizer import WORDS

    shape_config = SMALL if small else QWEN3_8B
    longest = 2048 if small else 32768
    built = build_decoder(root / "qwen3-8b", "qwen3", seed=7)
    st = SentenceTransformer(str(built.st), device=device)
    dtype = torch.bfloat16 if device != "cpu" else torch.float32
    started = time.perf_counter()
    with torch.device(device):
        big = AutoModel.from_config(Qwen3Config(**shape_config), dtype=dtype).eval()
    made_s = time.perf_counter() - started
    st[0].auto_model = big
    del big  # the encoder holds it; swapped out later, it is freed
    st.max_seq_length = longest
    spec = ModelSpec(id="qwen3-8b-shape", source=str(built.st), gpu_dtype="bfloat16",
                     max_seq_length=longest)
    encoder: Any = wrap(spec, st, device)
    encoder.backend = "torch"
    encoder.calibrate()
    pool = PoolSettings(workers=1)
    budget = pool_budget(pool, device)
    shape = ModelShape.from_config({**shape_config, "model_type": "qwen3"})
    footprint = size_model(spec, pool, device, budget, shape, weights=encoder.weight_bytes(),
                           max_seq_length=longest)
    encoder.token_budget = footprint.max_batch_tokens
    words = list(WORDS)
    rng = np.random.default_rng(0)

    def text(tokens: int) -> str:
        return " ".join(rng.choice(words, size=tokens - 1))  # + Qwen3's EOS

    calls = {"one text at max_seq_length": [text(longest - 8)],
             "8 texts of a quarter of it": [text(longest // 4) for _ in range(8)],
             "a token budget of 512-token texts, twice": [
                 text(512) for _ in range(2 * max(1, footprint.max_batch_tokens // 512))]}
    report: dict[str, Any] = {
        "shape": shape_config, "made_s": made_s, "weights": encoder.weight_bytes(),
        "budget": budget, "max_batch_tokens": footprint.max_batch_tokens,
        "rule_per_token": footprint.per_token, "rule_bytes": needed_bytes([footprint], 1),
        "calls": []}
    for name, texts in calls.items():
        if device != "cpu":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        result = encoder.embed(texts, normalize=True)
        seconds = time.perf_counter() - started
        peak = int(torch.cuda.max_memory_allocated()) if device != "cpu" else 0
        row = {"call": name, "texts": len(texts), "tokens": int(result.token_counts.sum()),
               "seconds": round(seconds, 3), "peak": peak,
               "peak_over_weights": peak - (encoder.weight_bytes() or 0),
               "finite": bool(np.isfinite(result.values).all())}
        report["calls"].append(row)
        print(row, flush=True)
    shapes = {"qwen3-embedding-0.6b": ModelShape.from_config(QWEN3_06B),
              "qwen3-embedding-8b": shape,
              "qwen3-reranker-0.6b": ModelShape.from_config(QWEN3_06B)}
    footprints = [size_model(ModelSpec(id=name, source="unused", gpu_dtype="bfloat16",
                                       max_seq_length=longest), pool, device, budget, s)
                  for name, s in shapes.items()]
    report["three_models"] = {
        "needed": needed_bytes(footprints, 1), "budget": budget,
        "each": {f.model_id: {"weights": f.weights, "max_batch_tokens": f.max_batch_tokens,
                              "call_bytes": f.activations} for f in footprints}}
    print(report["three_models"], flush=True)
    report["single_rows"] = single_rows(device, encoder, shape_config, longest, rng, words)
    return report


def single_rows(device: str, encoder: Any, shape_config: dict[str, Any], longest: int,
                rng: Any, words: list[str]) -> list[dict[str, Any]]:
    """One text per call at growing lengths, for this shape and the 0.6B one (same
    tokenizer): the peak over the weights, to fit the rule's length term."""
    import torch
    from transformers import AutoModel, Qwen3Config

    rows = []
    small = {k: v for k, v in QWEN3_06B.items() if k != "model_type"}
    for name, config in (("8b", shape_config), ("0.6b", small)):
        if name == "0.6b":
            dtype = torch.bfloat16 if device != "cpu" else torch.float32
            with torch.device(device):
                model = AutoModel.from_config(Qwen3Config(**(config if device != "cpu"
                                                             else SMALL)), dtype=dtype).eval()
            encoder.model[0].auto_model = model
            del model
            if device != "cpu":
                torch.cuda.empty_cache()
        for length in (longest // 8, longest // 4, longest // 2, longest - 8):
            text = " ".join(rng.choice(words, size=length - 1))
            base = 0
            if device != "cpu":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = int(torch.cuda.memory_allocated())
            started = time.perf_counter()
            result = encoder.embed([text], normalize=True)
            seconds = time.perf_counter() - started
            peak = int(torch.cuda.max_memory_allocated()) if device != "cpu" else 0
            rows.append({"shape": name, "heads": config["num_attention_heads"],
                         "tokens": int(result.token_counts.sum()),
                         "seconds": round(seconds, 3), "peak_over_resident": peak - base})
            print(rows[-1], flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--small", action="store_true", help="a small shape (a smoke run)")
    parser.add_argument("--skip", default="", help="agreement,long: parts to leave out")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="blitz-gpu-families-") as tmp:
        if "agreement" not in args.skip:
            report["agreement"] = agreement(args.device, Path(tmp))
        if "long" not in args.skip:
            report["long_inputs"] = long_inputs(args.device, Path(tmp), args.small)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_families.json").write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
