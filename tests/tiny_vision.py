"""Tiny randomly initialised dual encoders (CLIP and SigLIP) built from configs, with the
word-level test tokenizer (``tests.tiny_tokenizer``) and each family's image processor:
``build_tiny_dual_encoder(directory, family)`` writes a folder transformers'
``AutoModel``, ``AutoTokenizer`` and ``AutoImageProcessor`` open."""

from __future__ import annotations

from pathlib import Path

from tests.tiny_tokenizer import VOCAB, VOCAB_SIZE, save_tiny_tokenizer

IMAGE_SIZE = 32


def build_tiny_dual_encoder(directory: str | Path, family: str = "clip", seed: int = 0) -> Path:
    import torch
    from transformers import (
        CLIPConfig,
        CLIPImageProcessor,
        CLIPModel,
        SiglipConfig,
        SiglipImageProcessor,
        SiglipModel,
    )

    target = Path(directory)
    text = {"vocab_size": VOCAB_SIZE, "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 64,
            "pad_token_id": VOCAB["<|endoftext|>"], "eos_token_id": VOCAB["<|endoftext|>"]}
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "image_size": IMAGE_SIZE, "patch_size": 8}
    torch.manual_seed(seed)
    if family == "clip":
        model = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=24))
        processor = CLIPImageProcessor(size={"shortest_edge": IMAGE_SIZE},
                                       crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    elif family == "siglip":
        model = SiglipModel(SiglipConfig(text_config=text, vision_config=vision))
        processor = SiglipImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    else:
        raise ValueError(f"no tiny {family!r}: clip or siglip")
    model.eval()
    model.save_pretrained(str(target))
    processor.save_pretrained(str(target))
    save_tiny_tokenizer(target, padding_side="right")
    _end_each_text(target)
    return target


def _end_each_text(target: Path) -> None:
    """Each text as CLIP's and SigLIP's tokenizers make it: ended by the EOS (CLIP's text
    tower pools the first EOS), with the BOS in front."""
    from tokenizers import Tokenizer, processors

    tokenizer = Tokenizer.from_file(str(target / "tokenizer.json"))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A <|endoftext|>", pair="<bos> $A <|endoftext|> $B <|endoftext|>",
        special_tokens=[("<bos>", VOCAB["<bos>"]), ("<|endoftext|>", VOCAB["<|endoftext|>"])])
    tokenizer.save(str(target / "tokenizer.json"))


def random_images(seed: int, sizes: list[tuple[int, int]]) -> list:
    """Noise images of the given (width, height) sizes, the same for the same seed."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8))
            for w, h in sizes]
