"""ONNX bi-encoders on onnxruntime and ``tokenizers`` alone (blitz.encoders.onnx_native):
the same ids and vectors as sentence-transformers, no torch in the process, and the
fallback for what it cannot run."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from blitz.encoders.onnx_native import (
    OnnxEncoder,
    UnsupportedLayout,
    pool,
    pooling_mode,
    read_layout,
)
from blitz.encoders.probes import PROBE_TEXTS
from blitz.encoders.sentence_transformer import SentenceTransformerEncoder
from blitz.encoders.st_models import open_onnx_file, wrap
from blitz.encoders.token_ids import FastTokenIds, HfTokenIds, UnsupportedTokenizer
from blitz.errors import InvalidValue
from blitz.loading import onnx_export, opening
from blitz.loading.load import load_encoder
from blitz.settings.registry import ModelSpec
from blitz.sources import model_cache
from tests.tiny_models import minilm_dir

REPO = Path(__file__).resolve().parents[2]
HARD_TEXTS = ["", "  ", "Ünïcödé façade", "日本語 中文", "🙂🚀 ©®™\t\n", "MiXeD CaSe",
              "word " * 400, "a" * 3000, "x" * 5 + " y" * 300]

pytestmark = pytest.mark.usefixtures("no_home_cache")


@pytest.fixture(autouse=True)
def build_in_process(monkeypatch):
    monkeypatch.setattr(opening, "BUILD_IN_CHILD", False)


def _entry(cache: Path) -> tuple[Path, dict]:
    [entry] = sorted((cache / onnx_export.AREA).iterdir())
    return entry, json.loads((entry / model_cache.ENTRY_FILE).read_text())


# --- tokenizing ----------------------------------------------------------------------------

@pytest.mark.parametrize("limit", [256, 16])
def test_fast_tokenizer_gives_transformers_ids(limit):
    from transformers import AutoTokenizer

    hf = HfTokenIds(AutoTokenizer.from_pretrained(str(minilm_dir())))
    fast = FastTokenIds(minilm_dir(), limit, type_ids=True)
    texts = [*PROBE_TEXTS, *HARD_TEXTS]
    assert fast.ids(texts, limit) == hf.ids(texts, limit)
    assert fast.ids(texts, None) == hf.ids(texts, None)
    assert (fast.vocab_size, fast.pad_id, fast.specials) == (hf.vocab_size, hf.pad_id, hf.specials)
    assert fast.with_specials([[5, 6], []]) == hf.with_specials([[5, 6], []])


def test_transformers_ids_get_their_specials_from_the_post_processor():
    """transformers 5's fast tokenizers have no ``build_inputs_with_special_tokens``: token-id
    rows get the prefix and suffix the tokenizer's own call puts around a text."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(minilm_dir()))
    hf = HfTokenIds(tokenizer)
    text_ids = tokenizer(["hello world"], add_special_tokens=False)["input_ids"][0]
    assert hf.with_specials([text_ids]) == tokenizer(["hello world"])["input_ids"]


class _OddSpecials:
    """A tokenizer whose special tokens are not one prefix and suffix (the empty text gets
    another), with no method to place them around ids: transformers 5's fast tokenizers."""

    vocab_size, pad_token_id, model_input_names = 100, 0, ("input_ids", "attention_mask")

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        return 2

    def __call__(self, text, add_special_tokens=True, **_):
        bare = [7] if text else []
        return {"input_ids": ([1, *bare, 2] if text else [3]) if add_special_tokens else bare}


def test_ids_a_tokenizer_cannot_place_specials_around_are_refused_with_a_fix():
    with pytest.raises(InvalidValue, match="send the text instead") as caught:
        HfTokenIds(_OddSpecials()).with_specials([[7, 8]])
    assert caught.value.status == 422


def test_fast_tokenizer_needs_tokenizer_json(tmp_path):
    with pytest.raises(UnsupportedTokenizer, match="tokenizer.json"):
        FastTokenIds(tmp_path, 16, type_ids=False)


# --- pooling and layouts --------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["mean", "cls", "max", "mean_sqrt_len_tokens", "lasttoken"])
@pytest.mark.parametrize("normalize", [False, True])
def test_pooling_matches_sentence_transformers(mode, normalize):
    import torch
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling

    rng = np.random.default_rng(0)
    hidden = rng.standard_normal((3, 7, 8)).astype(np.float32)
    mask = np.array([[1] * 7, [1] * 3 + [0] * 4, [1] + [0] * 6], dtype=np.int64)
    features = {"token_embeddings": torch.from_numpy(hidden),
                "attention_mask": torch.from_numpy(mask)}
    theirs = Pooling(8, mode)(features)
    if normalize:
        theirs = Normalize()(theirs)
    np.testing.assert_allclose(pool(hidden, mask, mode, normalize),
                               theirs["sentence_embedding"].numpy(), atol=1e-6)


def test_pooling_config_old_and_new():
    assert pooling_mode({"pooling_mode": "cls"}) == "cls"
    assert pooling_mode({"pooling_mode": ["max"]}) == "max"
    assert pooling_mode({"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False}) == "mean"
    assert pooling_mode({"word_embedding_dimension": 8}) == "mean"  # none named: mean
    assert pooling_mode({"pooling_mode": "lasttoken"}) == "lasttoken"
    assert pooling_mode({"pooling_mode_lasttoken": True}) == "lasttoken"
    for config in ({"pooling_mode": ["mean", "lasttoken"]}, {"pooling_mode": ["mean", "max"]},
                   {"pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": True},
                   {"pooling_mode_weightedmean_tokens": True}):
        with pytest.raises(UnsupportedLayout):
            pooling_mode(config)


def _with_modules(folder: Path, target: Path, modules: list[dict]) -> Path:
    shutil.copytree(folder, target)
    (target / "modules.json").write_text(json.dumps(modules))
    return target


def test_layout_of_the_packaged_model_and_refusals(tmp_path):
    layout = read_layout(minilm_dir())
    assert (layout.pooling, layout.normalize, layout.dimension, layout.max_seq_length) == (
        "mean", True, 384, 256)
    modules = json.loads((minilm_dir() / "modules.json").read_text())
    dense = _with_modules(minilm_dir(), tmp_path / "dense",
                          [*modules, {"idx": 3, "name": "3", "path": "3_Dense",
                                      "type": "sentence_transformers.models.Dense"}])
    with pytest.raises(UnsupportedLayout, match="Dense"):
        read_layout(dense)
    lower = _with_modules(minilm_dir(), tmp_path / "lower", modules)
    (lower / "sentence_bert_config.json").write_text('{"do_lower_case": true}')
    with pytest.raises(UnsupportedLayout, match="lowercases"):
        read_layout(lower)
    (lower / "modules.json").unlink()
    with pytest.raises(UnsupportedLayout, match="modules.json"):
        read_layout(lower)


# --- builds -----------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["onnx", "onnx-int8"])
def test_a_verified_build_runs_natively_with_sentence_transformers_vectors(
        tiny_dir, tmp_path, backend):
    spec = ModelSpec(id="tiny", source=str(tiny_dir), cpu_backend=backend)
    encoder = load_encoder(spec, cache_dir=tmp_path)
    assert isinstance(encoder, OnnxEncoder)
    entry, meta = _entry(tmp_path)
    assert meta["native"] is True and meta["native_note"] is None
    reference = wrap(spec, open_onnx_file(spec, tiny_dir, entry, meta["file_name"]), "cpu")
    assert isinstance(reference, SentenceTransformerEncoder)
    texts = [*PROBE_TEXTS, *HARD_TEXTS]
    mine, theirs = encoder.embed(texts, normalize=True), reference.embed(texts, normalize=True)
    np.testing.assert_allclose(mine.values, theirs.values, atol=1e-5)
    assert mine.token_counts.tolist() == theirs.token_counts.tolist()
    assert encoder.rows_per_call == reference.rows_per_call
    ids = [[7592, 2088], [2023]]
    np.testing.assert_allclose(encoder.embed_tokens(ids, normalize=False).values,
                               reference.embed_tokens(ids, normalize=False).values, atol=1e-5)


def test_a_build_it_cannot_run_keeps_sentence_transformers(tiny_dir, tmp_path, monkeypatch):
    from blitz.encoders import onnx_native

    def refuse(_folder):
        raise UnsupportedLayout("its modules are ['Transformer', 'Pooling', 'Dense']")

    monkeypatch.setattr(onnx_native, "read_layout", refuse)
    spec = ModelSpec(id="tiny", source=str(tiny_dir), cpu_backend="onnx")
    encoder = load_encoder(spec, cache_dir=tmp_path)
    assert isinstance(encoder, SentenceTransformerEncoder)
    _, meta = _entry(tmp_path)
    assert meta["native"] is False and "Dense" in meta["native_note"]
    monkeypatch.undo()
    monkeypatch.setattr(opening, "BUILD_IN_CHILD", False)
    # the recorded verdict stands: the cached build keeps running through sentence-transformers
    assert isinstance(load_encoder(spec, cache_dir=tmp_path), SentenceTransformerEncoder)


def test_a_build_whose_vectors_differ_is_not_run_natively(tiny_dir, tmp_path, monkeypatch):
    from blitz.encoders import onnx_native

    real = onnx_native.pool
    monkeypatch.setattr(onnx_native, "pool",
                        lambda *args: real(*args) + np.float32(1e-3))
    spec = ModelSpec(id="tiny", source=str(tiny_dir), cpu_backend="onnx")
    assert isinstance(load_encoder(spec, cache_dir=tmp_path), SentenceTransformerEncoder)
    assert "vectors differ" in _entry(tmp_path)[1]["native_note"]


_NO_TORCH = """
import sys
from blitz.runtime import model_threads
from blitz.loading.load import load_encoder
from blitz.settings.registry import ModelSpec
model_threads.configure(1)
spec = ModelSpec(id="tiny", source=sys.argv[1], cpu_backend=sys.argv[3])
encoder = load_encoder(spec, "cpu", sys.argv[2])
encoder.warmup()
vector = encoder.embed(["hello"], normalize=True).values
heavy = sorted(m for m in ("torch", "transformers", "sentence_transformers", "optimum")
               if m in sys.modules)
print(type(encoder).__name__, encoder.backend, heavy, vector.shape)
"""


@pytest.mark.parametrize("backend", [
    pytest.param("onnx-int8", marks=pytest.mark.slow),  # a build and a fresh process: ~17 s
    pytest.param("auto", marks=pytest.mark.slow)])  # every candidate built and timed: ~45 s
def test_a_process_serving_a_cached_build_never_imports_torch(tiny_dir, tmp_path, backend):
    """What a pool replica does after the first start: the build (and auto's choice) in the
    cache, the model opened on onnxruntime alone."""
    cache = tmp_path / "cache"
    args = [sys.executable, "-c", _NO_TORCH, str(tiny_dir), str(cache), backend]
    for _ in range(2):  # the first run builds (and measures); the second finds it cached
        run = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
    name, chosen, *rest = run.stdout.split(maxsplit=2)
    heavy = rest[0].rsplit("(", 1)[0].strip()
    if chosen.replace("auto(", "").startswith("onnx"):
        assert name == "OnnxEncoder"
        assert heavy == "[]", run.stdout  # none of torch, transformers, ST, optimum
    else:  # auto measured torch fastest here: torch it is
        assert backend == "auto" and "torch" in heavy
