"""Tiny randomly initialised visual late-interaction retrievers (ColQwen2 and ColPali, the
transformers-native ``vidore/colqwen2-v1.0-hf`` / ``vidore/colpali-v1.3-hf`` layouts) built
offline from configs, and references computed with transformers' own classes (torch,
transformers, PIL and numpy only; no torchvision: the image processors are the PIL ones).

Builders
--------
``build_colqwen2(folder)`` writes a ``ColQwen2ForRetrieval`` (``embedding_dim`` 16) around
``tests.tiny_vl``'s tiny Qwen2-VL (text: 2 layers, hidden 64, 4 heads / 2 KV heads, mrope
sections [2, 3, 3]; vision: 2 blocks, width 32, patch 14, merge 2, temporal patch 2):

* ``config.json`` (``model_type`` "colqwen2", ``vlm_config`` a "qwen2_vl" config whose
  ``image_token_id`` is the tokenizer's ``<|image_pad|>``), ``model.safetensors`` (fp32:
  ``vlm.language_model.*``, ``vlm.visual.*``, ``embedding_proj_layer.{weight,bias}``);
* ``tokenizer.json`` / ``tokenizer_config.json``: ``tests.tiny_vl``'s word-level tokenizer
  (Qwen specials ``<|endoftext|>`` pad, ``<|im_start|>``, ``<|im_end|>`` EOS,
  ``<|vision_start|>``, ``<|vision_end|>``, ``<|image_pad|>``, ``<|video_pad|>``; a newline is a
  token; no BOS, nothing added around a text);
* ``preprocessor_config.json``: ``Qwen2VLImageProcessor`` (opened here as
  ``Qwen2VLImageProcessorPil``), patch 14, merge 2, temporal patch 2, CLIP mean/std,
  ``min_pixels`` 3136 (4 tokens) / ``max_pixels`` 50176 (64 tokens), also as ``size``
  ``shortest_edge`` / ``longest_edge``; ``processor_class`` "ColQwen2Processor";
* ``processor_config.json``: ``processor_class``, ``query_prefix``, ``visual_prompt_prefix``
  (the defaults). ColQwen2Processor needs no chat template.

``build_colpali(folder)`` writes a ``ColPaliForRetrieval`` (``embedding_dim`` 16) around a
tiny PaliGemma (Gemma text: 2 layers, hidden 32, 4 heads / 1 KV head, head_dim 8; SigLIP
vision: 2 layers, hidden 32, image 56, patch 14, no head; projector 32 -> 32):

* ``config.json`` (``model_type`` "colpali", ``vlm_config`` a "paligemma" config,
  ``image_token_index`` the tokenizer's ``<image>``), ``model.safetensors`` (fp32);
* ``tokenizer.json`` / ``tokenizer_config.json``: a word-level tokenizer with PaliGemma's
  specials (``<pad>`` 0, ``<eos>`` 1, ``<bos>`` 2, ``<unk>`` 3, ``<image>``), the 1024
  ``<locNNNN>`` and 128 ``<segNNN>`` tokens, ``add_bos_token`` true (a BOS post-processor, as
  Gemma's tokenizer; ColPaliProcessor turns it off), ``add_eos_token`` false;
* ``preprocessor_config.json``: ``SiglipImageProcessor`` (opened here as
  ``SiglipImageProcessorPil``), 56x56, bicubic, mean/std 0.5, ``image_seq_length`` 16
  (= (56/14)**2); ``processor_class`` "ColPaliProcessor";
* ``processor_config.json``: ``processor_class``, ``query_prefix``, ``visual_prompt_prefix``.

Both tokenizers pad on the right by default (``padding_side=`` changes it; with 1-D RoPE a
uniform shift of the positions changes nothing, so left padding gives the same vectors).

What the processors build (transformers 5.24; paths under
``.venv/lib/python3.11/site-packages/transformers/``)
--------------------------------------------------------------------------------------
The texts go through ``ProcessorMixin.__call__`` (``processing_utils.py`` 672-736): each
image placeholder is replaced by ``replace_image_token`` (``get_text_with_replacements``,
891-994), then ``self.tokenizer(texts, padding="longest", return_tensors="pt")`` (720;
``add_special_tokens`` left at its default True, which adds nothing for either tokenizer
once ColPaliProcessor has turned the BOS off). Special tokens spelled in the text are parsed
as specials.

ColQwen2 (``models/colqwen2/processing_colqwen2.py``):

* query: ``"Query: " + query + "<|endoftext|>" * 10 + "\\n"`` — prefix ``query_prefix``
  "Query: " (71), suffix ``query_augmentation_token * 10`` (115-116), the augmentation token
  being ``tokenizer.pad_token`` (196-203), i.e. ``<|endoftext|>`` for Qwen; the text is
  ``f"{query_prefix}{sample}{suffix}\\n"`` (118). The 10 augmentation tokens and the "\\n"
  have attention 1 and each gives a vector. No BOS.
* image: the text is ``visual_prompt_prefix`` (68-70, 138-143)
  ``"<|im_start|>user\\n<|vision_start|><|image_pad|><|vision_end|>Describe the
  image.<|im_end|><|endoftext|>"``, its one ``<|image_pad|>`` repeated
  ``grid_t*grid_h*grid_w // merge_size**2`` times (155-157). The grid is the image processor's
  (``models/qwen2_vl/image_processing_pil_qwen2_vl.py``): RGB, resized (bicubic) by
  ``smart_resize`` (58; sides multiples of ``patch*merge`` = 28, area in
  ``[min_pixels, max_pixels]``; ``blitz.vision_language.visual.smart_resize``), rescaled by
  1/255, normalised, cut into 14x14 patches with ``grid_t`` = 1, each patch flattened as
  (C, temporal 2 copies, 14, 14) = 1176 floats, patches ordered by merge block
  ``(gh/2, gw/2, 2, 2)`` (``patchify`` 164-200, transpose 187). So an image of
  ``h x w`` resized pixels takes ``(h/28)*(w/28)`` ``<|image_pad|>`` tokens.
  ``pixel_values`` comes back split per image by ``grid_h*grid_w`` and zero-padded to
  ``(batch, max_patches, 1176)`` (122-129); ``image_grid_thw`` is ``(batch, 3)``.
* Padding "longest" (46-49) on the tokenizer's side (the folder's ``padding_side``; the
  processor does not set it).

ColQwen2 forward (``models/colqwen2/modeling_colqwen2.py``): it needs ``image_grid_thw`` with
the *padded 3-D* ``pixel_values``: it unpads them itself with the mask
``arange(max_patches) < grid_h*grid_w`` (131-137) — a flattened 2-D ``pixel_values`` fails
there (IndexError). The image features are ``vlm.visual(pixel_values,
grid_thw).pooler_output`` (the merger's output, one row per ``<|image_pad|>``) scattered into
``embed_tokens(input_ids)`` at the ``image_token_id`` positions (147-154). The Qwen2-VL model
is then called with ``inputs_embeds`` only (``input_ids=None``, ``position_ids=None``, no
``image_grid_thw`` / ``mm_token_type_ids``, 156-166), so
``Qwen2VLModel.compute_3d_position_ids`` returns None
(``models/qwen2_vl/modeling_qwen2_vl.py`` 1073-1120) and the text model uses
``arange(seq_len)`` on all three M-RoPE axes (764-767): plain 1-D RoPE positions over the
padded sequence, image tokens included — NOT Qwen2-VL's 3-D M-RoPE (which changes the
vectors; colpali-engine's ColQwen2 does use M-RoPE). Attention is causal with the padding
mask. Output ``embeddings`` (170-177): ``embedding_proj_layer`` (Linear hidden -> dim, with
bias) on the last hidden state (after the final RMSNorm), L2-normalised per token, then
multiplied by ``attention_mask`` (padding rows are zero vectors). Shape
``(batch, seq_len, dim)``.

ColPali (``models/colpali/processing_colpali.py``):

* the constructor adds ``<image>`` (37) as a special token unless the tokenizer has an
  ``image_token``, adds the ``<locNNNN>`` / ``<segNNN>`` tokens (38, 84) and sets
  ``add_bos_token = add_eos_token = False`` (85-86): nothing is added around a text.
* query: ``"<bos>" + "Question: " + query + "<pad>" * 10 + "\\n"`` (127, 131-132; prefix
  ``query_prefix`` "Question: " (59), augmentation token ``tokenizer.pad_token`` (186-193)).
* image: ``"<image>" * image_seq_length + "<bos>" + "Describe the image." + "\\n"`` (141-149,
  161-162), ``image_seq_length`` from ``preprocessor_config.json`` (69-72; 1024 for the real
  448-px checkpoints, 16 here): every image takes the same number of tokens. ``pixel_values``
  is ``(batch, 3, size, size)``: RGB, resized to exactly ``size`` (bicubic, no aspect kept),
  rescaled 1/255, normalised with mean/std 0.5.
* ``return_token_type_ids=True`` (116): ``token_type_ids`` all 0 (pads too); for images also
  ``labels`` (137-138, unused by the forward). Padding "longest" (48-51) on the tokenizer's
  side; images never pad (same length).

ColPali forward (``models/colpali/modeling_colpali.py`` 117-135): ``PaliGemmaModel`` with
``input_ids``, ``attention_mask``, ``pixel_values`` and ``token_type_ids``
(``models/paligemma/modeling_paligemma.py``): text embeddings scaled by
``sqrt(hidden_size)`` inside ``embed_tokens`` (``models/gemma/modeling_gemma.py`` 55-61,
361-364); image features = ``multi_modal_projector`` (Linear) of SigLIP's
``last_hidden_state`` (after ``post_layernorm``), not scaled (123-130), scattered at the
``<image>`` positions (230); positions ``arange(seq_len) + 1`` (218); because
``token_type_ids`` are all 0, every token is in the "prefix" block and attention is fully
BIDIRECTIONAL over the non-padding tokens (243, ``masking_utils.blockwise_overlay``; without
``token_type_ids`` it would be causal and the vectors differ). Output as ColQwen2:
projection (with bias), per-token L2 norm, times ``attention_mask``.

Scoring: ``score_retrieval`` (ColQwen2 225-287; ColPali's is the same code) is MaxSim:
``sum_i max_j q_i . d_j`` over a query's rows and a passage's rows, both lists padded with
zero rows by ``pad_sequence`` in batches of 128. A zero row of a shorter passage takes part
in the max, so where all of a query token's dots with a passage are negative that passage's
max is 0 rather than the negative value; scored one passage at a time it is exact MaxSim.

References
----------
``colqwen2_reference(folder, queries, images)`` / ``colpali_reference(...)``: the processor
built explicitly from the folder's PIL image processor and tokenizer,
``process_queries(queries)`` and ``process_images(images)`` (each one batch), the model run on
each batch as the model cards do (``model(**batch).embeddings``); one float32 array
``(tokens, 16)`` per input, the rows where ``attention_mask`` is 0 removed (queries first,
then images). ``score_reference(q_vecs, d_vecs)``: ``score_retrieval`` on them, a
``(queries, passages)`` float32 array. ``colqwen2_query_text`` / ``colqwen2_image_text`` /
``colpali_query_text`` / ``colpali_image_text``: the recipes above as plain strings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    from PIL.Image import Image

from tests import tiny_vl
from tests.tiny_tokenizer import PUNCTUATION, WORDS

EMBEDDING_DIM = 16
QUERY_AUGMENTATION = 10  # pad tokens appended to every query by both processors

COLQWEN2_QUERY_PREFIX = "Query: "
COLQWEN2_VISUAL_PROMPT = ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>"
                          "Describe the image.<|im_end|><|endoftext|>")
COLPALI_QUERY_PREFIX = "Question: "
COLPALI_VISUAL_PROMPT = "Describe the image."

# PaliGemma's tokenizer: its specials first (ids 0-3 as in Gemma), words, punctuation (with
# "\n"), the location and segmentation tokens, then <image>
PALIGEMMA_SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>"]
PALIGEMMA_EXTRA = [f"<loc{i:0>4}>" for i in range(1024)] + [f"<seg{i:0>3}>" for i in range(128)]
PALIGEMMA_IMAGE = "<image>"
COLPALI_WORDS = sorted(set(WORDS) | {"question", "describe", "image", "photo", "picture"})
COLPALI_VOCAB = {t: i for i, t in enumerate(PALIGEMMA_SPECIAL + COLPALI_WORDS + PUNCTUATION)}
for _token in PALIGEMMA_EXTRA + [PALIGEMMA_IMAGE]:
    COLPALI_VOCAB[_token] = len(COLPALI_VOCAB)
COLPALI_MODEL_VOCAB = -(-len(COLPALI_VOCAB) // 16) * 16
COLPALI_IMAGE_SIZE, COLPALI_PATCH = 56, 14
COLPALI_IMAGE_SEQ_LENGTH = (COLPALI_IMAGE_SIZE // COLPALI_PATCH) ** 2  # 16


# ---- the recipes, as plain strings -------------------------------------------------------

def colqwen2_query_text(query: str) -> str:
    """The text ColQwen2Processor tokenizes for a query (Qwen's pad is ``<|endoftext|>``)."""
    return COLQWEN2_QUERY_PREFIX + query + "<|endoftext|>" * QUERY_AUGMENTATION + "\n"


def colqwen2_image_text(image_tokens: int) -> str:
    """The text ColQwen2Processor tokenizes for an image of ``image_tokens`` merged tokens."""
    return COLQWEN2_VISUAL_PROMPT.replace("<|image_pad|>", "<|image_pad|>" * image_tokens)


def colpali_query_text(query: str) -> str:
    """The text ColPaliProcessor tokenizes for a query (PaliGemma's pad is ``<pad>``)."""
    return "<bos>" + COLPALI_QUERY_PREFIX + query + "<pad>" * QUERY_AUGMENTATION + "\n"


def colpali_image_text(image_seq_length: int = COLPALI_IMAGE_SEQ_LENGTH) -> str:
    """The text ColPaliProcessor tokenizes for any image."""
    return PALIGEMMA_IMAGE * image_seq_length + "<bos>" + COLPALI_VISUAL_PROMPT + "\n"


# ---- builders -----------------------------------------------------------------------------

def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _processor_config(target: Path, processor_class: str, query_prefix: str,
                      visual_prompt_prefix: str) -> None:
    _write_json(target / "processor_config.json", {
        "processor_class": processor_class, "query_prefix": query_prefix,
        "visual_prompt_prefix": visual_prompt_prefix})


def _mark_processor_class(target: Path, processor_class: str) -> None:
    path = target / "preprocessor_config.json"
    saved = json.loads(path.read_text())
    saved["processor_class"] = processor_class
    _write_json(path, saved)


def build_colqwen2(folder: str | Path, *, seed: int = 0, padding_side: str = "right") -> Path:
    """A random tiny ``ColQwen2ForRetrieval`` with its tokenizer and processor files in
    ``folder`` (made if missing); returns the folder."""
    import torch
    from transformers import Qwen2VLConfig
    from transformers.models.colqwen2 import ColQwen2Config, ColQwen2ForRetrieval

    target = Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    family = "qwen2_vl"
    text = tiny_vl._text_config(family)
    ids = {"image_token_id": tiny_vl.token_id("<|image_pad|>"),
           "video_token_id": tiny_vl.token_id("<|video_pad|>"),
           "vision_start_token_id": tiny_vl.token_id("<|vision_start|>"),
           "vision_end_token_id": tiny_vl.token_id("<|vision_end|>")}
    vlm = Qwen2VLConfig(text_config=text,
                        vision_config=tiny_vl._vision_config(family, text["hidden_size"]),
                        tie_word_embeddings=False, **ids)
    torch.manual_seed(seed)
    model = ColQwen2ForRetrieval(ColQwen2Config(vlm_config=vlm,
                                                embedding_dim=EMBEDDING_DIM)).eval()
    model.save_pretrained(str(target), safe_serialization=True)
    tiny_vl._save_image_processor(family, target)
    _mark_processor_class(target, "ColQwen2Processor")
    tiny_vl.save_tiny_vl_tokenizer(target, padding_side=padding_side)
    _processor_config(target, "ColQwen2Processor", COLQWEN2_QUERY_PREFIX,
                      COLQWEN2_VISUAL_PROMPT)
    return target


def _save_paligemma_tokenizer(target: Path, padding_side: str) -> None:
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        models,
        normalizers,
        pre_tokenizers,
        processors,
    )

    tokenizer = Tokenizer(models.WordLevel(vocab=COLPALI_VOCAB, unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"[^\S\n]+"), behavior="removed"),
        pre_tokenizers.Split("\n", behavior="isolated"),
        pre_tokenizers.Punctuation()])
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t in PALIGEMMA_SPECIAL + [PALIGEMMA_IMAGE]])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False)
                          for t in PALIGEMMA_EXTRA])
    bos = ("<bos>", COLPALI_VOCAB["<bos>"])
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[bos])
    tokenizer.save(str(target / "tokenizer.json"))
    _write_json(target / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 2048,
        "padding_side": padding_side, "pad_token": "<pad>", "eos_token": "<eos>",
        "bos_token": "<bos>", "unk_token": "<unk>", "add_bos_token": True,
        "add_eos_token": False, "processor_class": "ColPaliProcessor",
        "model_input_names": ["input_ids", "attention_mask"]})


def build_colpali(folder: str | Path, *, seed: int = 0, padding_side: str = "right") -> Path:
    """A random tiny ``ColPaliForRetrieval`` (PaliGemma: SigLIP vision, Gemma text) with its
    tokenizer and processor files in ``folder`` (made if missing); returns the folder."""
    import torch
    from transformers import PaliGemmaConfig
    from transformers.models.colpali import ColPaliConfig, ColPaliForRetrieval
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    target = Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    text = {"vocab_size": COLPALI_MODEL_VOCAB, "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1,
            "head_dim": 8, "max_position_embeddings": 512, "initializer_range": 0.2,
            "pad_token_id": COLPALI_VOCAB["<pad>"], "eos_token_id": COLPALI_VOCAB["<eos>"],
            "bos_token_id": COLPALI_VOCAB["<bos>"]}
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "image_size": COLPALI_IMAGE_SIZE,
              "patch_size": COLPALI_PATCH, "vision_use_head": False}
    vlm = PaliGemmaConfig(text_config=text, vision_config=vision,
                          image_token_index=COLPALI_VOCAB[PALIGEMMA_IMAGE],
                          vocab_size=COLPALI_MODEL_VOCAB, projection_dim=32, hidden_size=32)
    torch.manual_seed(seed)
    model = ColPaliForRetrieval(ColPaliConfig(vlm_config=vlm,
                                              embedding_dim=EMBEDDING_DIM)).eval()
    model.save_pretrained(str(target), safe_serialization=True)
    SiglipImageProcessorPil(
        size={"height": COLPALI_IMAGE_SIZE, "width": COLPALI_IMAGE_SIZE}, resample=3,
        image_mean=[0.5] * 3, image_std=[0.5] * 3,
        image_seq_length=COLPALI_IMAGE_SEQ_LENGTH).save_pretrained(str(target))
    _mark_processor_class(target, "ColPaliProcessor")
    _save_paligemma_tokenizer(target, padding_side)
    _processor_config(target, "ColPaliProcessor", COLPALI_QUERY_PREFIX, COLPALI_VISUAL_PROMPT)
    return target


# ---- references -------------------------------------------------------------------------

def _prefixes(folder: Path) -> dict[str, str]:
    path = folder / "processor_config.json"
    saved = json.loads(path.read_text()) if path.exists() else {}
    return {k: saved[k] for k in ("query_prefix", "visual_prompt_prefix") if k in saved}


def colqwen2_processor(folder: str | Path):
    """``ColQwen2Processor`` from the folder's ``Qwen2VLImageProcessorPil`` and tokenizer
    (explicitly the PIL image processor: the default one needs torchvision)."""
    from transformers import AutoTokenizer
    from transformers.models.colqwen2 import ColQwen2Processor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    folder = Path(folder)
    return ColQwen2Processor(image_processor=Qwen2VLImageProcessorPil.from_pretrained(str(folder)),
                             tokenizer=AutoTokenizer.from_pretrained(str(folder)),
                             **_prefixes(folder))


def colpali_processor(folder: str | Path):
    """``ColPaliProcessor`` from the folder's ``SiglipImageProcessorPil`` and tokenizer."""
    from transformers import AutoTokenizer
    from transformers.models.colpali import ColPaliProcessor
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    folder = Path(folder)
    return ColPaliProcessor(image_processor=SiglipImageProcessorPil.from_pretrained(str(folder)),
                            tokenizer=AutoTokenizer.from_pretrained(str(folder)),
                            **_prefixes(folder))


def _reference(model, processor, queries: list[str] | None,
               images: list[Image] | None) -> list[np.ndarray]:
    import numpy as np
    import torch

    batches = []
    if queries:
        batches.append(processor.process_queries(list(queries)))
    if images:
        batches.append(processor.process_images(list(images)))
    vectors: list[np.ndarray] = []
    with torch.inference_mode():
        for batch in batches:
            embeddings = model(**batch).embeddings.float()
            for row, mask in zip(embeddings, batch["attention_mask"], strict=True):
                vectors.append(row[mask.bool()].numpy().astype(np.float32))
    return vectors


def colqwen2_reference(folder: str | Path, queries: list[str] | None = None,
                       images: list[Image] | None = None) -> list[np.ndarray]:
    """ColQwen2's multi-vectors, as its model card computes them: ``process_queries`` and
    ``process_images`` (one batch each) and ``ColQwen2ForRetrieval(**batch).embeddings``;
    per input a float32 ``(tokens, dim)`` array without its padding rows, queries first."""
    import torch
    from transformers.models.colqwen2 import ColQwen2ForRetrieval

    model = ColQwen2ForRetrieval.from_pretrained(str(folder), dtype=torch.float32).eval()
    return _reference(model, colqwen2_processor(folder), queries, images)


def colpali_reference(folder: str | Path, queries: list[str] | None = None,
                      images: list[Image] | None = None) -> list[np.ndarray]:
    """ColPali's multi-vectors, as ``colqwen2_reference`` (``ColPaliForRetrieval``)."""
    import torch
    from transformers.models.colpali import ColPaliForRetrieval

    model = ColPaliForRetrieval.from_pretrained(str(folder), dtype=torch.float32).eval()
    return _reference(model, colpali_processor(folder), queries, images)


def score_reference(q_vecs: list[np.ndarray], d_vecs: list[np.ndarray]) -> np.ndarray:
    """``score_retrieval`` (MaxSim; ColQwen2Processor's, the same code as ColPaliProcessor's)
    of the queries' against the passages' multi-vectors: a float32 ``(queries, passages)``
    array. It reads nothing of the processor, hence the unbound call."""
    import numpy as np
    import torch
    from transformers.models.colqwen2 import ColQwen2Processor

    scores = ColQwen2Processor.score_retrieval(
        None, [torch.from_numpy(np.asarray(q, dtype=np.float32)) for q in q_vecs],
        [torch.from_numpy(np.asarray(d, dtype=np.float32)) for d in d_vecs])
    return scores.numpy().astype(np.float32)
