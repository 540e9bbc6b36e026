"""A vision-language embedder's images/s, mixed documents/s and texts/s in process, and
where an image's time goes: decoding, the image processor, the model call.

One randomly initialised Qwen3-VL model of a real shape (``2b``: Qwen3-VL-2B's text and
vision towers, the shape of Qwen3-VL-Embedding-2B; ``tiny`` for a smoke run), built in
memory from a config (no weights are downloaded: only the shape matters for speed), with a
word-level tokenizer carrying Qwen's specials and chat template and transformers' PIL
image processor (patch 16, merge 2) written to a scratch folder. Blitz's ``VlEmbedder``
runs it as a pool worker does, on ``--threads`` torch threads:

- ``images``: documents of one synthetic JPEG each (``loadtest.images_bench``; 640 x 480:
  300 visual tokens), ``--batch`` a call;
- ``mixed``: a caption of about twenty words and the image, ``--batch`` a call;
- ``texts``: the caption alone, ``--batch`` a call.

The legs are interleaved by round. The images leg runs as a pool does, each step timed:
decoding (``blitz.images.decode``), the processor (``VlEmbedder.prepare_part``), then the
model call (``embed_parts`` on the prepared images); the mixed leg decodes in the call.

    python -m loadtest.vl_bench --size 2b --rounds 2 --out loadtest/results/vl-throughput.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from loadtest.images_bench import synthetic_jpegs
from loadtest.report import environment

CAPTION = ("a red cat sits on the blue sofa by the window while the quick brown fox jumps "
           "over the lazy dog in the garden")
SIZES: dict[str, dict[str, Any]] = {
    # Qwen/Qwen3-VL-2B-Instruct's shape (Qwen3-VL-Embedding-2B is built on it)
    "2b": {"text": {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
                    "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
                    "vocab_size": 151_936, "max_position_embeddings": 32_768,
                    "rope_parameters": {"rope_type": "default", "rope_theta": 5_000_000.0,
                                        "mrope_section": [24, 20, 20],
                                        "mrope_interleaved": True}},
           "vision": {"depth": 24, "hidden_size": 1024, "intermediate_size": 4096,
                      "num_heads": 16, "patch_size": 16, "spatial_merge_size": 2,
                      "temporal_patch_size": 2, "out_hidden_size": 2048,
                      "num_position_embeddings": 2304, "deepstack_visual_indexes": [5, 11, 17]}},
    "tiny": {"text": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                      "vocab_size": 1024, "max_position_embeddings": 4096,
                      "rope_parameters": {"rope_type": "default", "rope_theta": 10_000.0,
                                          "mrope_section": [4, 2, 2],
                                          "mrope_interleaved": True}},
             "vision": {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 4,
                        "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
                        "out_hidden_size": 64, "num_position_embeddings": 2304,
                        "deepstack_visual_indexes": [0]}},
}
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
            "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def write_folder(target: Path) -> Path:
    """A tokenizer (lower-cased words, Qwen's specials, a chat template) and a PIL image
    processor (patch 16, merge 2, Qwen3-VL-Embedding's 4 to 1,800 tokens an image)."""
    from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    words = sorted(set((CAPTION + " represent the user's input . ' s system user assistant")
                       .replace("'", " ' ").split()))
    vocab = {token: i for i, token in enumerate(["<unk>", *SPECIALS, *words, "\n", ":"])}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                       pre_tokenizers.Punctuation()])
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t in SPECIALS])
    target.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(target / "tokenizer.json"))
    (target / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<|endoftext|>",
        "eos_token": "<|im_end|>", "unk_token": "<unk>", "model_max_length": 32_768,
        "chat_template": CHAT_TEMPLATE}))
    factor = 32
    Qwen2VLImageProcessorPil(patch_size=16, merge_size=2, temporal_patch_size=2,
                             image_mean=[0.5] * 3, image_std=[0.5] * 3,
                             min_pixels=4 * factor ** 2, max_pixels=1800 * factor ** 2,
                             ).save_pretrained(str(target))
    return target


def build(size: str, folder: Path, threads: int) -> Any:
    import torch
    from transformers import AutoTokenizer, Qwen3VLConfig, Qwen3VLModel

    from blitz.vision_language.embedder import VlEmbedder
    from blitz.vision_language.visual import read_image_shape

    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIALS}
    shape = SIZES[size]
    config = Qwen3VLConfig(text_config=shape["text"], vision_config=shape["vision"],
                           image_token_id=ids["<|image_pad|>"],
                           video_token_id=ids["<|video_pad|>"],
                           vision_start_token_id=ids["<|vision_start|>"],
                           vision_end_token_id=ids["<|vision_end|>"])
    torch.manual_seed(0)
    with torch.device("cpu"):
        model = Qwen3VLModel(config).eval()
    params = sum(p.numel() for p in model.parameters())
    encoder = VlEmbedder("vl-bench", model, tokenizer, folder,
                         read_image_shape(folder).capped(1280, None), token_budget=16_384)
    return encoder, params


def run(size: str, rounds: int, batch: int, threads: int) -> dict[str, Any]:
    from blitz.images.decode import decode
    from blitz.settings.images import ImageSettings

    with tempfile.TemporaryDirectory() as scratch:
        folder = write_folder(Path(scratch) / "vl")
        started = time.perf_counter()
        encoder, params = build(size, folder, threads)
        built_s = time.perf_counter() - started
        jpegs = synthetic_jpegs(batch, (640, 480), seed=3)
        limits = ImageSettings()
        encoder.warmup()  # as a pool does after a load: a text, and a text with an image
        legs: dict[str, list[float]] = {"images": [], "mixed": [], "texts": []}
        parts: dict[str, list[float]] = {"decode": [], "processor": [], "model": []}
        tokens: dict[str, int] = {}
        for _ in range(rounds):
            # images: decoded, processed and embedded, each step timed (what a pool does:
            # image_prep before the queue, then the worker's model call)
            t0 = time.perf_counter()
            pictures = [decode(j, limits) for j in jpegs]
            t1 = time.perf_counter()
            prepared = [encoder.prepare_part(p) for p in pictures]
            t2 = time.perf_counter()
            out = encoder.embed_parts([(v,) for v in prepared], normalize=True)
            t3 = time.perf_counter()
            for name, seconds in (("decode", t1 - t0), ("processor", t2 - t1),
                                  ("model", t3 - t2)):
                parts[name].append(seconds / batch)
            legs["images"].append(batch / (t3 - t0))
            tokens["images"] = int(out.token_counts.mean())
            for leg, documents in (("mixed", [(CAPTION, j) for j in jpegs]),
                                   ("texts", [(CAPTION,)] * batch)):
                t0 = time.perf_counter()
                out = encoder.embed_parts(documents, normalize=True)
                legs[leg].append(len(documents) / (time.perf_counter() - t0))
                tokens[leg] = int(out.token_counts.mean())
        per_image = {k: statistics.median(v) for k, v in parts.items()}
        whole = sum(per_image.values())
        return {
            "environment": environment(), "size": size, "parameters": params,
            "build_s": round(built_s, 1), "threads": threads, "batch": batch,
            "rounds": rounds, "image": "640x480 JPEG",
            "tokens_per_document": tokens,
            "per_second": {k: [round(x, 3) for x in v] for k, v in legs.items()},
            "median_per_second": {k: round(statistics.median(v), 3) for k, v in legs.items()},
            "image_seconds": {k: round(v, 4) for k, v in per_image.items()},
            "image_share": {k: round(v / whole, 4) for k, v in per_image.items()},
        }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="2b")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    report = run(args.size, args.rounds, args.batch, args.threads)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
