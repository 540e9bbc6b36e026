"""A model's facts read from its files, no weights loaded (``blitz.loading.facts``): one
reader of ``config.json`` for the memory budget's shape, the ONNX export's model type and
/info's dimension, max input length, pooling and labels; a dual encoder's text tower read
the same way by each."""

from __future__ import annotations

import json
from pathlib import Path

from blitz.loading.facts import (
    ModelShape,
    model_shape,
    model_type,
    read_config,
    read_dimension,
    read_facts,
    text_tower,
)
from blitz.settings.registry import ModelSpec

BERT = {"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 4, "intermediate_size": 64, "vocab_size": 100,
        "max_position_embeddings": 128}
CLIP = {"model_type": "clip", "projection_dim": 16,
        "text_config": {**BERT, "model_type": "clip_text_model"}, "vision_config": {}}


def folder(path: Path, config: dict | None, **files: object) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (path / "config.json").write_text(json.dumps(config))
    for name, content in files.items():
        (path / f"{name}.json").write_text(json.dumps(content))
    return path


def test_a_dual_encoders_text_tower_is_its_text_config():
    assert text_tower(CLIP) == CLIP["text_config"]
    assert text_tower(BERT) is BERT
    assert ModelShape.from_config(CLIP) == ModelShape.from_config(BERT)
    assert ModelShape.from_config({"hidden_size": 8}) is None  # not enough to say


def test_the_config_and_model_type_are_read_where_a_folder_has_them(tmp_path):
    bert = folder(tmp_path / "bert", BERT)
    bare = folder(tmp_path / "bare", None)
    assert read_config(bert) == BERT and read_config(bare) == {}
    assert model_type(bert) == "bert" and model_type(bare) is None


def test_shape_dimension_and_facts_of_a_local_model(tmp_path):
    path = folder(tmp_path / "st", BERT, sentence_bert_config={"max_seq_length": 64},
                  modules=[{"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}])
    folder(path / "1_Pooling", {"pooling_mode_mean_tokens": True})
    spec = ModelSpec(id="st", source=str(path))
    assert model_shape(spec) == ModelShape(hidden=32, layers=2, intermediate=64, vocab=100,
                                           max_positions=128, query_width=32, kv_width=32)
    assert read_dimension(spec) == 32
    assert read_facts(spec) == {"max_input_length": 64, "pooling": "mean"}


def test_a_dual_encoders_and_a_sparse_models_dimensions(tmp_path):
    clip = ModelSpec(id="clip", source=str(folder(tmp_path / "clip", CLIP)),
                     kind="dual-encoder")
    splade = ModelSpec(id="splade", source=str(folder(tmp_path / "splade", BERT)),
                       kind="sparse")
    assert read_dimension(clip) == 16 and read_dimension(splade) == 100
    assert model_shape(clip) == model_shape(splade)  # the budget reads the text tower


def test_no_files_no_facts():
    fake = ModelSpec(id="f", source="fake:8")
    assert read_dimension(fake) == 8 and model_shape(fake) is None
    assert read_facts(fake) == {"max_input_length": None, "pooling": None}
