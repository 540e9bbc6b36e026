"""Images/s in process: Blitz's dual encoder against sentence-transformers on one CLIP.

One random CLIP-ViT-B/32-sized model (``loadtest.clip_model``, built once under
``~/.cache/blitz-bench``) and one fixed set of synthetic JPEGs (640 x 480 by default:
noise under shapes, encoded once), embedded by each leg in every round, every leg from
the same encoded bytes in batches of ``--batch`` (decoding included: a server must decode
too), on the same number of torch threads. The legs are interleaved at the batch (each
batch goes to every leg in turn, the first leg rotating), so load that comes and goes on a
shared machine falls on every leg alike:

- ``st``: ``SentenceTransformer(modules=[CLIPModel(path)]).encode(pil_images,
  batch_size=batch, normalize_embeddings=True)``, each image opened with Pillow first;
- ``blitz``: ``DualEncoder.embed_image_bytes(chunk, normalize=True)`` per chunk of
  ``batch`` (decoding within the image limits, the model's image processor,
  ``get_image_features``);
- ``blitz-pool``: the same encoder through the pool's ``run_jobs`` with one
  ``ImageEmbedJob`` per chunk, what a pool worker runs.

The report: images/s per leg per round (its images over the seconds of its own calls),
Blitz / ST per round and their median, the machine's CPU other processes used meanwhile,
and the cosine between each image's ST and Blitz vectors (the least of them; 1.0 means the same
preprocessing and the same model call).

    python -m loadtest.images_bench --rounds 3 --out images.json
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.clip_model import build_clip, default_cache
from loadtest.cpu import machine_cpu_s
from loadtest.report import environment, fmt, markdown_table

LEGS = ("st", "blitz", "blitz-pool")
EmbedBytes = Callable[[list[bytes]], np.ndarray]


def synthetic_jpegs(count: int, size: tuple[int, int] = (640, 480), seed: int = 0,
                    quality: int = 90) -> list[bytes]:
    """``count`` JPEGs of ``size`` (width, height): a smooth colour gradient with noise,
    under a few random rectangles and ellipses, so the encoder meets photo-like entropy."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    width, height = size
    ys, xs = np.mgrid[0:height, 0:width]
    out = []
    for _ in range(count):
        base = rng.integers(0, 256, 3)
        slope = rng.uniform(-0.3, 0.3, (2, 3))
        pixels = (base + xs[..., None] * slope[0] + ys[..., None] * slope[1]
                  + rng.normal(0, 12, (height, width, 3)))
        image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
        draw = ImageDraw.Draw(image)
        for _ in range(int(rng.integers(3, 9))):
            x0, x1 = sorted(rng.integers(0, width, 2))
            y0, y1 = sorted(rng.integers(0, height, 2))
            colour = tuple(int(c) for c in rng.integers(0, 256, 3))
            shape = draw.rectangle if rng.random() < 0.5 else draw.ellipse
            shape((int(x0), int(y0), int(x1), int(y1)), fill=colour)
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=quality)
        out.append(buffer.getvalue())
    return out


def _chunks(items: list[bytes], size: int) -> list[list[bytes]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def st_leg(path: Path, batch: int) -> EmbedBytes:
    """sentence-transformers' CLIP module on Pillow-opened images."""
    from PIL import Image
    from sentence_transformers import SentenceTransformer

    try:  # sentence-transformers 5.4+: the legacy module, as saved CLIP models load it
        from sentence_transformers.sentence_transformer.modules import CLIPModel
        clip = CLIPModel(str(path), _from_auto_load=True)  # without the deprecation log
    except ImportError:
        from sentence_transformers.models import CLIPModel
        clip = CLIPModel(str(path))
    model = SentenceTransformer(modules=[clip], device="cpu")

    def embed(images: list[bytes]) -> np.ndarray:
        pictures = [Image.open(io.BytesIO(data)).convert("RGB") for data in images]
        return model.encode(pictures, batch_size=batch, normalize_embeddings=True,
                            convert_to_numpy=True, show_progress_bar=False)
    return embed


def blitz_legs(path: Path) -> dict[str, EmbedBytes]:
    """Blitz's dual encoder called directly, and through the pool's ``run_jobs``."""
    from blitz.hop_messages import ImageEmbedJob
    from blitz.images.dual_encoder import DualEncoder
    from blitz.pool.mixed_batch import run_jobs

    encoder = DualEncoder("clip-bench", path)

    def direct(images: list[bytes]) -> np.ndarray:
        return encoder.embed_image_bytes(images, normalize=True).values

    def pooled(images: list[bytes]) -> np.ndarray:
        result = run_jobs(encoder, [ImageEmbedJob(images=images)])[0]
        if isinstance(result, Exception):
            raise result
        return result.values
    return {"blitz": direct, "blitz-pool": pooled}


def run_bench(path: Path, images: list[bytes], *, rounds: int = 3, batch: int = 32,
              legs: Sequence[str] = LEGS, threads: int | None = None) -> dict[str, Any]:
    """``rounds`` rounds in which every leg embeds all ``images``; the report."""
    import torch

    unknown = set(legs) - set(LEGS)
    if unknown or not legs:
        raise ValueError(f"legs: some of {', '.join(LEGS)}, not {sorted(unknown)}")
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        return _rounds(path, images, rounds, batch, legs)
    finally:
        torch.set_num_threads(before)


def _rounds(path: Path, images: list[bytes], rounds: int, batch: int,
            legs: Sequence[str]) -> dict[str, Any]:
    """Interleaved at the batch: each batch of images goes to every leg in turn (the
    first leg rotating), so a load that comes and goes on a shared machine falls on every
    leg alike; a leg's images/s is its images over the seconds of its own calls."""
    import torch

    engines: dict[str, EmbedBytes] = {}
    if "st" in legs:
        engines["st"] = st_leg(path, batch)
    if {"blitz", "blitz-pool"} & set(legs):
        engines.update({k: v for k, v in blitz_legs(path).items() if k in legs})
    order = [leg for leg in LEGS if leg in legs]
    chunks = _chunks(images, batch)
    for leg in order:  # warm-up: one batch each
        engines[leg](chunks[0])
    vectors: dict[str, list[np.ndarray]] = {leg: [] for leg in order}
    per_round: list[dict[str, float]] = []
    others: list[float | None] = []
    for k in range(rounds):
        seconds = dict.fromkeys(order, 0.0)
        machine0, own0 = machine_cpu_s(), time.process_time()
        for i, chunk in enumerate(chunks):
            turn = (k + i) % len(order)
            for leg in order[turn:] + order[:turn]:
                start = time.perf_counter()
                out = engines[leg](chunk)
                seconds[leg] += time.perf_counter() - start
                if k == 0:
                    vectors[leg].append(out)
        machine1, own1 = machine_cpu_s(), time.process_time()
        others.append(None if machine1[1] <= machine0[1] else max(0.0, 100 * (
            machine1[0] - machine0[0] - (own1 - own0)) / (machine1[1] - machine0[1])))
        per_round.append({leg: len(images) / seconds[leg] for leg in order})
    return report(per_round, {leg: np.concatenate(v) for leg, v in vectors.items()},
                  images=len(images), batch=batch, threads=torch.get_num_threads(),
                  others_busy_pct=others)


def report(per_round: list[dict[str, float]], vectors: dict[str, np.ndarray], *,
           images: int, batch: int, threads: int,
           others_busy_pct: Sequence[float | None] = ()) -> dict[str, Any]:
    ratios: dict[str, list[float]] = {}
    if "st" in vectors:
        for leg in vectors:
            if leg != "st":
                ratios[f"{leg}/st"] = [r[leg] / r["st"] for r in per_round]
    cosines = {}
    if "st" in vectors:
        for leg, values in vectors.items():
            if leg != "st":
                cos = np.sum(values * vectors["st"], axis=1) / (
                    np.linalg.norm(values, axis=1) * np.linalg.norm(vectors["st"], axis=1))
                cosines[f"{leg}~st"] = float(cos.min())
    return {"kind": "images_bench", "environment": environment(), "images": images,
            "batch": batch, "threads": threads, "rounds": per_round,
            "others_busy_pct": list(others_busy_pct),
            "images_per_s_median": {leg: statistics.median(r[leg] for r in per_round)
                                    for leg in per_round[0]} if per_round else {},
            "ratios": ratios,
            "ratio_median": {k: statistics.median(v) for k, v in ratios.items()},
            "cosine_min": cosines,
            "dimension": int(next(iter(vectors.values())).shape[1]) if vectors else None}


def markdown(doc: dict[str, Any]) -> str:
    legs = list(doc["rounds"][0]) if doc["rounds"] else []
    ratio_names = list(doc["ratios"])
    others = doc.get("others_busy_pct") or [None] * len(doc["rounds"])
    rows = [[str(k + 1), *(fmt(r[leg]) for leg in legs),
             *(f"{doc['ratios'][name][k]:.2f}x" for name in ratio_names), fmt(others[k], 0)]
            for k, r in enumerate(doc["rounds"])]
    rows.append(["median", *(fmt(doc["images_per_s_median"][leg]) for leg in legs),
                 *(f"{doc['ratio_median'][name]:.2f}x" for name in ratio_names), ""])
    text = markdown_table(["round", *(f"{leg} images/s" for leg in legs), *ratio_names,
                           "others' CPU %"], rows)
    text += (f"\n{doc['images']} images, batch {doc['batch']}, {doc['threads']} torch "
             f"threads; least cosine between the vectors of one image: "
             + (", ".join(f"{k} {v:.6f}" for k, v in doc["cosine_min"].items()) or "-") + "\n")
    return text


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.images_bench",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=int(os.environ.get("ROUNDS", "3")))
    parser.add_argument("--images", type=int, default=256, help="how many synthetic JPEGs")
    parser.add_argument("--image-size", default="640x480", help="WIDTHxHEIGHT")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads for every leg (default: torch's)")
    parser.add_argument("--legs", default=",".join(LEGS))
    parser.add_argument("--size", default="b32", help="the model's shape: b32 or tiny")
    parser.add_argument("--model-dir", default=None,
                        help="where the random CLIP is built once "
                             "(default ~/.cache/blitz-bench/clip-SIZE)")
    parser.add_argument("--out", default=None, help="the report as JSON")
    args = parser.parse_args(argv)
    width, height = (int(v) for v in args.image_size.lower().split("x"))
    path = build_clip(args.model_dir or default_cache() / f"clip-{args.size}", args.size)
    images = synthetic_jpegs(args.images, (width, height))
    doc = run_bench(path, images, rounds=args.rounds, batch=args.batch,
                    legs=[leg for leg in args.legs.split(",") if leg], threads=args.threads)
    doc["model"] = {"size": args.size, "path": str(path)}
    doc["image_size"] = [width, height]
    print(markdown(doc))
    if args.out:
        import json

        Path(args.out).write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
