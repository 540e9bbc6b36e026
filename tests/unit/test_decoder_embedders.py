"""Decoder embedders (Qwen3, Gemma3, Llama, Mistral) through Blitz's loader, against
sentence-transformers' ``encode`` on the same folder: tiny random-weight models
(``tests/tiny_decoders.py``), each as a sentence-transformers folder and as a plain
checkpoint served with ``pooling: lasttoken``, with left and right padding."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from blitz.encoders.onnx_native import OnnxEncoder, pool
from blitz.errors import InvalidValue
from blitz.loading import opening
from blitz.loading.load import load_encoder
from blitz.settings.registry import ModelSpec, apply_prompt
from tests.tiny_decoders import FAMILIES, INSTRUCTION_TEMPLATE, PROMPTS, build_decoder
from tests.tiny_tokenizer import VOCAB

AGREE = 0.9999  # cosine to the reference, CPU fp32
TEXTS = ["hello", "the quick brown fox jumps over the lazy dog " * 8,
         "paris is the capital of france", "cat",
         "what is the red tree by the river? " * 3, "one two three four five six seven",
         "b", "a long text about a bird and a blue sea, " * 5]
# torch's exporter warns of advanced indexing in the decoders' masks; the vectors are checked
EXPORT_WARNING = "ignore:Exporting aten:UserWarning"
CASES = [(family, side) for family in FAMILIES for side in ("left", "right")]


def cosines(got: np.ndarray, expected: np.ndarray) -> np.ndarray:
    got = got / np.linalg.norm(got, axis=1, keepdims=True)
    expected = expected / np.linalg.norm(expected, axis=1, keepdims=True)
    return (got * expected).sum(axis=1)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("decoders")
    return {(family, side): build_decoder(root / f"{family}-{side}", family, seed=seed,
                                          padding_side=side)
            for seed, (family, side) in enumerate(CASES)}


@pytest.fixture(scope="module")
def references(built):
    from sentence_transformers import SentenceTransformer

    return {case: SentenceTransformer(str(model.st), device="cpu")
            for case, model in built.items()}


def spec_for(model, form: str, **extra) -> ModelSpec:
    if form == "st":
        return ModelSpec(id="decoder", source=str(model.st), **extra)
    return ModelSpec(id="decoder", source=str(model.plain), pooling="lasttoken", **extra)


@pytest.mark.parametrize("form", ["st", "plain"])
@pytest.mark.parametrize(("family", "side"), CASES)
def test_each_family_matches_sentence_transformers_alone_and_in_any_batch(
        built, references, family, side, form, tmp_path):
    reference = references[family, side]
    assert reference.tokenizer.padding_side == side
    expected = reference.encode(TEXTS, batch_size=len(TEXTS))
    encoder = load_encoder(spec_for(built[family, side], form), cache_dir=tmp_path)
    together = encoder.embed(TEXTS, normalize=True).values
    alone = np.concatenate([encoder.embed([t], normalize=True).values for t in TEXTS])
    order = [5, 1, 6, 3]
    mixed = encoder.embed_many([([TEXTS[i] for i in order], True, True),
                                ([TEXTS[0], TEXTS[7]], True, True)])
    assert cosines(together, expected).min() >= AGREE
    assert cosines(alone, expected).min() >= AGREE
    assert cosines(mixed[0].values, expected[order]).min() >= AGREE
    assert cosines(mixed[1].values, expected[[0, 7]]).min() >= AGREE
    # the model tells texts apart, so agreeing with the reference says something
    assert (expected @ expected.T).min() < 0.9


@pytest.mark.parametrize(("family", "side"), CASES)
def test_prompts_and_a_free_form_instruction_match_the_references_prompt(
        built, references, family, side, tmp_path):
    reference = references[family, side]
    spec = spec_for(built[family, side], "st", prompts=PROMPTS,
                    instruction_template=INSTRUCTION_TEMPLATE)
    encoder = load_encoder(spec, cache_dir=tmp_path)
    prompted = encoder.embed(apply_prompt(spec, TEXTS, "query"), normalize=True).values
    assert cosines(prompted, reference.encode(TEXTS, prompt_name="query")).min() >= AGREE
    task = "Given a question, retrieve passages that answer it"
    instructed = encoder.embed(apply_prompt(spec, TEXTS, None, task), normalize=True).values
    expected = reference.encode(TEXTS, prompt=f"Instruct: {task}\nQuery:")
    assert cosines(instructed, expected).min() >= AGREE
    plain = encoder.embed(TEXTS, normalize=True).values
    assert cosines(instructed, plain).min() < 0.9999  # the instruction changed the vectors


def test_the_tokenizers_own_special_tokens_are_what_the_model_reads(built, tmp_path):
    eos, bos, hello = VOCAB["<|endoftext|>"], VOCAB["<bos>"], VOCAB["hello"]
    expected = {"qwen3": [hello, eos], "gemma3": [bos, hello], "llama": [bos, hello, eos],
                "mistral": [bos, hello, eos]}
    for family, ids in expected.items():
        encoder = load_encoder(spec_for(built[family, "left"], "st"), cache_dir=tmp_path)
        assert encoder.tokens.ids(["hello"], 32) == [ids]
        cut = encoder.tokens.ids([TEXTS[1]], 16)[0]  # truncation keeps the EOS it reads
        assert len(cut) == 16 and (cut[-1] == eos) == (ids[-1] == eos)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_token_id_inputs_get_the_special_tokens_text_gets(built, family, tmp_path):
    encoder = load_encoder(spec_for(built[family, "left"], "plain"), cache_dir=tmp_path)
    texts = TEXTS[:4]
    with_specials = encoder.tokens.ids(texts, None)
    bare = encoder.tokens.tokenizer(texts, add_special_tokens=False)["input_ids"]
    assert encoder.tokens.with_specials(bare) == with_specials
    got = encoder.embed_tokens(bare, normalize=True).values
    assert cosines(got, encoder.embed(texts, normalize=True).values).min() >= AGREE


@pytest.mark.parametrize("form", ["st", "plain"])
def test_truncated_texts_match_the_reference_truncated_alike(built, form, tmp_path):
    from sentence_transformers import SentenceTransformer

    model = built["qwen3", "left"]
    reference = SentenceTransformer(str(model.st), device="cpu")
    reference.max_seq_length = 12
    encoder = load_encoder(spec_for(model, form, max_seq_length=12), cache_dir=tmp_path)
    got = encoder.embed(TEXTS, normalize=True)
    assert got.token_counts.max() == 12
    assert cosines(got.values, reference.encode(TEXTS)).min() >= AGREE


def test_matryoshka_dimensions_keep_the_references_first_components(built, references, tmp_path):
    from blitz.encoders.postprocess import truncate_dimensions

    model, reference = built["qwen3", "left"], references["qwen3", "left"]
    encoder = load_encoder(spec_for(model, "st"), cache_dir=tmp_path)
    got = truncate_dimensions(encoder.embed(TEXTS, normalize=True).values, 16, True)
    expected = reference.encode(TEXTS, truncate_dim=16)
    assert got.shape == (len(TEXTS), 16)
    assert cosines(got, expected).min() >= AGREE


@pytest.mark.parametrize("side", ["left", "right"])
def test_native_last_token_pooling_is_sentence_transformers(side):
    import torch
    from sentence_transformers.sentence_transformer.modules import Pooling

    rng = np.random.default_rng(0)
    hidden = rng.normal(size=(4, 7, 8)).astype(np.float32)
    lengths = [7, 3, 1, 0]
    mask = np.zeros((4, 7), dtype=np.int64)
    for row, length in enumerate(lengths):
        if length:
            mask[row, :length] = 1
            if side == "left":
                mask[row] = mask[row, ::-1]
    expected = Pooling(8, "lasttoken")({"token_embeddings": torch.from_numpy(hidden),
                                        "attention_mask": torch.from_numpy(mask)})
    got = pool(hidden, mask, "lasttoken", normalize=False)
    assert np.allclose(got, expected["sentence_embedding"].numpy(), atol=1e-6)
    assert not got[3].any()  # a row with no token pools to zeros, as the reference's


@pytest.mark.slow  # an ONNX export per family: ~10 s each on a 2-core machine
@pytest.mark.filterwarnings(EXPORT_WARNING)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_on_onnx_runs_natively_and_matches_sentence_transformers(
        built, references, family, tmp_path, monkeypatch):
    monkeypatch.setattr(opening, "BUILD_IN_CHILD", False)
    side = FAMILIES[family].padding_side
    expected = references[family, side].encode(TEXTS, batch_size=len(TEXTS))
    for form in ("st", "plain"):
        spec = spec_for(built[family, side], form, cpu_backend="onnx")
        encoder = load_encoder(spec, cache_dir=tmp_path)
        assert isinstance(encoder, OnnxEncoder)  # onnxruntime alone: verified when built
        assert cosines(encoder.embed(TEXTS, normalize=True).values, expected).min() >= AGREE
        alone = np.concatenate([encoder.embed([t], normalize=True).values for t in TEXTS])
        assert cosines(alone, expected).min() >= AGREE


@pytest.mark.slow  # an ONNX export and its int8 quantization: ~15 s
@pytest.mark.filterwarnings(EXPORT_WARNING)
def test_int8_passes_the_accuracy_guard_for_a_decoder(built, references, tmp_path,
                                                      monkeypatch):
    monkeypatch.setattr(opening, "BUILD_IN_CHILD", False)
    expected = references["qwen3", "left"].encode(TEXTS)
    encoder = load_encoder(spec_for(built["qwen3", "left"], "st", cpu_backend="onnx-int8"),
                           cache_dir=tmp_path)
    assert cosines(encoder.embed(TEXTS, normalize=True).values, expected).min() >= 0.99


def test_an_instruction_needs_a_template_and_excludes_a_prompt_name():
    spec = ModelSpec(id="d", source="fake:8", prompts={"query": "q: "},
                     instruction_template="Instruct: {instruction}\nQuery:")
    assert apply_prompt(spec, ["x"], None, "find {it}") == ["Instruct: find {it}\nQuery:x"]
    with pytest.raises(InvalidValue, match="not both"):
        apply_prompt(spec, ["x"], "query", "find")
    with pytest.raises(InvalidValue, match="no instruction_template"):
        apply_prompt(ModelSpec(id="d", source="fake:8"), ["x"], None, "find")
    with pytest.raises(ValidationError, match="once"):
        ModelSpec(id="d", source="fake:8", instruction_template="Instruct: {task}")


def test_gpu_loading_options_name_the_dtype_and_flash_attention_only_where_installed():
    import torch

    assert opening.gpu_model_kwargs("cpu", torch.float32) == {}
    assert opening.gpu_model_kwargs("cuda:0", torch.float16, flash_installed=False) == {
        "dtype": torch.float16}
    assert opening.gpu_model_kwargs("cuda:0", torch.bfloat16, flash_installed=True) == {
        "dtype": torch.bfloat16, "attn_implementation": "flash_attention_2"}
    # FlashAttention 2 has no fp32 kernels
    assert "attn_implementation" not in opening.gpu_model_kwargs(
        "cuda:0", torch.float32, flash_installed=True)


def test_a_decoder_loads_in_its_serving_dtype_on_sdpa_and_survives_flash_refused(
        built, references, tmp_path, monkeypatch):
    """The GPU load path, run on a CPU: weights arrive in the serving dtype (no fp32 copy
    first), a family transformers refuses FlashAttention 2 for (here: flash_attn is not
    installed) falls back to SDPA, and the vectors still agree with fp32's."""
    import torch

    from blitz.encoders.st_models import open_torch_bi_encoder

    model = built["qwen3", "left"]
    for form in ("st", "plain"):
        opened = open_torch_bi_encoder(spec_for(model, form), model.st if form == "st"
                                       else model.plain, "cpu", {"dtype": torch.bfloat16})
        transformer = opened[0].auto_model
        assert {p.dtype for p in transformer.parameters()} == {torch.bfloat16}
        assert transformer.config._attn_implementation == "sdpa"
    monkeypatch.setattr(opening, "_torch_dtype", lambda spec, device: torch.bfloat16)
    monkeypatch.setattr(opening, "gpu_model_kwargs", lambda device, dtype: {
        "dtype": dtype, "attn_implementation": "flash_attention_2"})
    encoder = load_encoder(spec_for(model, "st"), cache_dir=tmp_path)
    assert next(encoder.model[0].auto_model.parameters()).dtype == torch.bfloat16
    expected = references["qwen3", "left"].encode(TEXTS)
    got = encoder.embed(TEXTS, normalize=True).values
    assert cosines(got, expected).min() >= 0.99
