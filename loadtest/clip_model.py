"""A randomly initialised CLIP folder built from a config, offline, for the image benchmark
(``loadtest.images_bench``): no weights are downloaded, only the shape matters for speed.

``build_clip(directory, size)`` writes what transformers' ``AutoModel``,
``AutoTokenizer``, ``AutoImageProcessor`` and ``AutoProcessor`` open (so Blitz's
``DualEncoder`` and sentence-transformers' ``CLIPModel`` both load it): the model, a
``CLIPImageProcessor`` (shortest edge then centre crop, as OpenAI's) and a
``CLIPTokenizerFast`` over a byte-level BPE with CLIP's 512 byte symbols and a few merges
(texts barely matter for image throughput; the real vocabulary cannot be downloaded here).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SIZES: dict[str, dict[str, Any]] = {
    # openai/clip-vit-base-patch32's shape
    "b32": {"vision": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                       "num_attention_heads": 12, "image_size": 224, "patch_size": 32},
            "text": {"hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 12,
                     "num_attention_heads": 8, "vocab_size": 49408,
                     "max_position_embeddings": 77},
            "projection_dim": 512},
    # for tests: seconds to build and run
    "tiny": {"vision": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                        "num_attention_heads": 4, "image_size": 32, "patch_size": 8},
             "text": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                      "num_attention_heads": 4, "vocab_size": 600,
                      "max_position_embeddings": 77},
             "projection_dim": 24},
}
MERGES = [("t", "h"), ("th", "e</w>"), ("a", "n</w>"), ("o", "f</w>"), ("i", "n</w>")]
DONE = ".blitz-bench-complete"


def default_cache() -> Path:
    return Path.home() / ".cache" / "blitz-bench"


def build_clip(directory: str | Path, size: str = "b32", seed: int = 0) -> Path:
    """The folder ``directory`` holding a random CLIP of ``size`` (``SIZES``); built once,
    reused while its completion marker is there."""
    target = Path(directory)
    if (target / DONE).exists():
        return target
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor

    shape = SIZES[size]
    target.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer(target)
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
           "pad_token_id": tokenizer.pad_token_id}
    vision = shape["vision"]
    torch.manual_seed(seed)
    model = CLIPModel(CLIPConfig(text_config={**shape["text"], **ids}, vision_config=vision,
                                 projection_dim=shape["projection_dim"])).eval()
    model.save_pretrained(str(target))
    side = vision["image_size"]
    processor = CLIPImageProcessor(size={"shortest_edge": side},
                                   crop_size={"height": side, "width": side})
    CLIPProcessor(image_processor=processor, tokenizer=tokenizer).save_pretrained(str(target))
    (target / DONE).write_text(json.dumps({"size": size, "seed": seed}))
    return target


def _tokenizer(target: Path) -> Any:
    """A CLIPTokenizerFast over CLIP's byte symbols (each alone and word-final), a few
    merges, and CLIP's two special tokens."""
    from transformers import CLIPTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    symbols = list(bytes_to_unicode().values())
    vocab = symbols + [s + "</w>" for s in symbols] + [a + b for a, b in MERGES]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    (target / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(vocab)}))
    (target / "merges.txt").write_text(
        "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in MERGES))
    return CLIPTokenizerFast(vocab_file=str(target / "vocab.json"),
                             merges_file=str(target / "merges.txt"))
