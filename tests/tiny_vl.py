"""Tiny randomly initialised vision-language decoders (Qwen2-VL and Qwen3-VL) built offline
from configs, and reference scores written from the model cards, independently of Blitz
(transformers, torch, PIL and numpy only).

``build_tiny_vl(directory, family)`` writes a folder with:

* ``config.json`` and ``model.safetensors`` (fp32) of a ``Qwen2VLForConditionalGeneration``
  (family "qwen2_vl": GME, jina-reranker-m0's base) or a ``Qwen3VLForConditionalGeneration``
  (family "qwen3_vl": Qwen3-VL-Embedding, Qwen3-VL-Reranker): two text layers, four heads
  (two KV heads), a two-block vision tower whose merger projects to the text width, and
  ``image_token_id`` / ``video_token_id`` / ``vision_start_token_id`` / ``vision_end_token_id``
  at the top of the config (where both families' ``get_placeholder_mask`` read them) equal to
  the tokenizer's ids (the sub-configs are nested: ``text_config``, ``vision_config``).
  transformers 5 saves each family in its hub layout: qwen2_vl as ``model.layers.*``,
  ``model.embed_tokens.*``, ``visual.*``, ``lm_head.weight`` (converted back to
  ``model.language_model.*`` / ``model.visual.*`` on loading), qwen3_vl as
  ``model.language_model.*``, ``model.visual.*``, ``lm_head.weight``. ``AutoModel`` opens the
  base model (``Qwen2VLModel`` / ``Qwen3VLModel``; no missing keys, ``lm_head.weight``
  unexpected), ``AutoModelForImageTextToText`` the whole
  ``...ForConditionalGeneration`` with its ``lm_head`` (the Qwen3-VL-Reranker reads its yes
  and no rows).
  ``head="jina-m0"`` (qwen2_vl only) adds jina-reranker-m0's score head to the same
  ``model.safetensors``: ``score.0`` (Linear hidden->hidden), ReLU, ``score.2`` (Linear
  hidden->1; its bias offset by +2.65 so that the scores spread around 0.5). transformers
  ignores those keys (an "UNEXPECTED" line in its load report) when it opens the folder;
  ``jina_head`` / ``reference_jina_m0`` read them.
* ``tokenizer.json`` / ``tokenizer_config.json``: ``tests.tiny_tokenizer``'s word-level
  vocabulary (its ids unchanged) plus a few words ("represent", "input", "s", ...) and Qwen's
  specials (``<|vision_start|>``, ``<|vision_end|>``, ``<|image_pad|>``, ``<|video_pad|>`` after
  the existing ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``), opened by ``AutoTokenizer``
  as a ``PreTrainedTokenizerFast`` (transformers 5 names that class ``TokenizersBackend``) with
  ``<|endoftext|>`` as pad, ``<|im_end|>`` as EOS, and a Qwen-VL chat template
  (no default system prompt, no tools, no video). Unlike ``tests.tiny_tokenizer`` a newline is
  a token of its own (the chat template's and the rerankers' "\\n" then count); spaces and tabs
  only separate words. At least 101 ids: jina-reranker-m0 appends id 100.
* ``preprocessor_config.json``: transformers 5's PIL ``Qwen2VLImageProcessorPil`` (the
  torchvision one does not import without torchvision) with patch 14 (qwen2_vl) or 16
  (qwen3_vl), merge 2, temporal patch 2 and small ``min_pixels`` / ``max_pixels``, so an image of
  20..200 px gives 4..64 visual tokens. ``Qwen2VLImageProcessorPil.from_pretrained`` opens it;
  so does ``AutoImageProcessor.from_pretrained`` here, which without torchvision resolves the
  "pil" backend and gives the same ``Qwen2VLImageProcessorPil``.

The references take one document (or pair) at a time, a batch of one: the text from the chat
template (or jina's prompt), each ``<|image_pad|>`` replaced by ``grid_t*grid_h*grid_w //
merge_size**2`` copies as ``Qwen2VLProcessor`` / ``Qwen3VLProcessor`` do, tokenized without
added specials, and the base model run with ``input_ids``, ``attention_mask``,
``pixel_values``, ``image_grid_thw`` and ``mm_token_type_ids`` (1 on image pads: transformers 5
refuses ``image_grid_thw`` without it, as the processors return it):

* ``reference_embedding``: Qwen3-VL-Embedding's ``Qwen3VLEmbedder`` (last token, L2-normalised).
* ``reference_qwen3vl_rerank``: Qwen3-VL-Reranker (sigmoid of the last hidden state on
  ``lm_head[yes] - lm_head[no]``).
* ``reference_jina_m0``: jina-reranker-m0's ``compute_score`` (token 100 appended, score head,
  ``sigmoid(x - 2.65)``).

Test images: ``tests.tiny_vision.random_images``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    from PIL.Image import Image

from tests.tiny_tokenizer import SPECIAL, VOCAB

VISION_SPECIALS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
EXTRA_WORDS = ["represent", "input", "s", "based", "provided", "candidates", "image", "photo",
               "picture", "describe", "null"]
VL_VOCAB = dict(VOCAB)
for _token in [w for w in EXTRA_WORDS if w not in VOCAB] + VISION_SPECIALS:
    VL_VOCAB[_token] = len(VL_VOCAB)
VL_SPECIAL = SPECIAL + VISION_SPECIALS
VL_VOCAB_SIZE = max(len(VL_VOCAB), 101)  # jina-reranker-m0 appends token id 100
MODEL_VOCAB_SIZE = -(-VL_VOCAB_SIZE // 16) * 16
IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
DEFAULT_EMBED_INSTRUCTION = "Represent the user's input."
RERANK_SYSTEM = ("Judge whether the Document meets the requirements based on the Query and the "
                 "Instruct provided. Note that the answer can only be \"yes\" or \"no\".")
DEFAULT_RERANK_INSTRUCTION = ("Given a search query, retrieve relevant candidates that answer "
                              "the query.")
JINA_SCORE_TOKEN_ID = 100
JINA_LOGIT_BIAS = 2.65

# Qwen2-VL's / Qwen3-VL's template, without the tools, the video parts, "Picture N:" labels
# and (Qwen2-VL) the default system prompt.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] in ['image', 'image_url'] or 'image' in part or 'image_url' in part -%}"
    "{{- '" + IMAGE_PLACEHOLDER + "' -}}"
    "{%- elif 'text' in part -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# patch size per family; merge 2 and temporal patch 2 for both
PATCH = {"qwen2_vl": 14, "qwen3_vl": 16}
MERGE = 2
TEMPORAL_PATCH = 2
MIN_TOKENS, MAX_TOKENS = 4, 64  # about the fewest and most visual tokens of an image


def token_id(token: str) -> int:
    """The id of ``token`` (a word, punctuation or special) in the tiny VL tokenizer."""
    return VL_VOCAB[token]


def save_tiny_vl_tokenizer(directory: str | Path, *, padding_side: str = "right") -> Path:
    """The VL tokenizer's files in ``directory`` (made if missing); returns the directory."""
    from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers

    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.WordLevel(vocab=VL_VOCAB, unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"[^\S\n]+"), behavior="removed"),
        pre_tokenizers.Split("\n", behavior="isolated"),
        pre_tokenizers.Punctuation()])
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t in VL_SPECIAL])
    tokenizer.save(str(target / "tokenizer.json"))
    (target / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 8192,
        "padding_side": padding_side, "pad_token": "<|endoftext|>",
        "eos_token": "<|im_end|>", "unk_token": "<unk>", "add_bos_token": False,
        "model_input_names": ["input_ids", "attention_mask"],
        "chat_template": CHAT_TEMPLATE}, indent=1))
    return target


def _text_config(family: str) -> dict[str, Any]:
    common = {"vocab_size": MODEL_VOCAB_SIZE, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_position_embeddings": 2048,
              "initializer_range": 0.2, "rms_norm_eps": 1e-6,
              "pad_token_id": token_id("<|endoftext|>"),
              "bos_token_id": token_id("<|endoftext|>"), "eos_token_id": token_id("<|im_end|>")}
    if family == "qwen2_vl":  # head_dim = 64 / 4 = 16; mrope over its 8 frequencies
        return {**common, "hidden_size": 64, "intermediate_size": 128,
                "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0,
                                    "mrope_section": [2, 3, 3]}}
    # qwen3_vl: head_dim 16 set apart from hidden 48, as Qwen3's; interleaved mrope
    return {**common, "hidden_size": 48, "intermediate_size": 96, "head_dim": 16,
            "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0,
                                "mrope_section": [4, 2, 2], "mrope_interleaved": True}}


def _vision_config(family: str, text_hidden: int) -> dict[str, Any]:
    common = {"depth": 2, "num_heads": 4, "in_channels": 3, "patch_size": PATCH[family],
              "spatial_merge_size": MERGE, "temporal_patch_size": TEMPORAL_PATCH,
              "initializer_range": 0.2}
    if family == "qwen2_vl":  # embed_dim is the tower's width, hidden_size the merger's output
        return {**common, "embed_dim": 32, "hidden_size": text_hidden, "mlp_ratio": 2}
    return {**common, "hidden_size": 32, "intermediate_size": 64,
            "out_hidden_size": text_hidden, "num_position_embeddings": 64,
            "deepstack_visual_indexes": [0]}


def _model(family: str):
    from transformers import (
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen3VLConfig,
        Qwen3VLForConditionalGeneration,
    )

    text = _text_config(family)
    ids = {"image_token_id": token_id("<|image_pad|>"),
           "video_token_id": token_id("<|video_pad|>"),
           "vision_start_token_id": token_id("<|vision_start|>"),
           "vision_end_token_id": token_id("<|vision_end|>")}
    config_class, model_class = {
        "qwen2_vl": (Qwen2VLConfig, Qwen2VLForConditionalGeneration),
        "qwen3_vl": (Qwen3VLConfig, Qwen3VLForConditionalGeneration)}[family]
    config = config_class(text_config=text,
                          vision_config=_vision_config(family, text["hidden_size"]),
                          tie_word_embeddings=False, **ids)
    return model_class(config).eval()


def _image_processor(family: str):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    factor = PATCH[family] * MERGE
    # Qwen3-VL normalises with 0.5 / 0.5, Qwen2-VL with CLIP's mean and std (the default)
    norm = {"image_mean": [0.5] * 3, "image_std": [0.5] * 3} if family == "qwen3_vl" else {}
    return Qwen2VLImageProcessorPil(patch_size=PATCH[family], merge_size=MERGE,
                                    temporal_patch_size=TEMPORAL_PATCH,
                                    min_pixels=MIN_TOKENS * factor**2,
                                    max_pixels=MAX_TOKENS * factor**2, **norm)


def _save_image_processor(family: str, target: Path) -> None:
    """``preprocessor_config.json`` as transformers 5 writes it (``size`` with
    ``shortest_edge`` / ``longest_edge`` in pixels); for qwen2_vl also ``min_pixels`` /
    ``max_pixels`` at the top, the same values, as Qwen2-VL's hub files carry them."""
    _image_processor(family).save_pretrained(str(target))
    if family == "qwen2_vl":
        path = target / "preprocessor_config.json"
        saved = json.loads(path.read_text())
        saved["min_pixels"] = saved["size"]["shortest_edge"]
        saved["max_pixels"] = saved["size"]["longest_edge"]
        path.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")


def _add_jina_head(target: Path, hidden: int, seed: int) -> None:
    """jina-reranker-m0's score head (Linear, ReLU, Linear), random, added to the folder's
    ``model.safetensors`` under ``score.0.*`` and ``score.2.*``."""
    import torch
    from safetensors.torch import load_file, save_file

    generator = torch.Generator().manual_seed(seed + 1)
    bound = hidden ** -0.5
    head = {"score.0.weight": (hidden, hidden), "score.0.bias": (hidden,),
            "score.2.weight": (1, hidden), "score.2.bias": (1,)}
    path = target / "model.safetensors"
    tensors = load_file(str(path))
    for key, shape in head.items():  # a wide first layer, so that the ReLU passes a spread
        scale = bound * (4 if key.startswith("score.0") else 1)
        tensors[key] = (torch.rand(shape, generator=generator) * 2 - 1) * scale
    # centre the logits on jina's bias, so the scores spread around 0.5 rather than near 0
    tensors["score.2.bias"] += JINA_LOGIT_BIAS
    save_file(tensors, str(path), metadata={"format": "pt"})


def build_tiny_vl(directory: str | Path, family: str = "qwen3_vl", *, seed: int = 0,
                  head: str | None = None, padding_side: str = "right") -> Path:
    """A random tiny Qwen2-VL or Qwen3-VL, its tokenizer and image processor in
    ``directory``; ``head="jina-m0"`` (qwen2_vl only) adds jina-reranker-m0's score head."""
    import torch

    if family not in PATCH:
        raise ValueError(f"no tiny {family!r}: qwen2_vl or qwen3_vl")
    if head not in (None, "jina-m0") or (head == "jina-m0" and family != "qwen2_vl"):
        raise ValueError(f"head {head!r} does not fit {family!r}: None, or 'jina-m0' on qwen2_vl")
    target = Path(directory)
    torch.manual_seed(seed)
    model = _model(family)
    model.save_pretrained(str(target), safe_serialization=True)
    _save_image_processor(family, target)
    save_tiny_vl_tokenizer(target, padding_side=padding_side)
    if head == "jina-m0":
        _add_jina_head(target, model.config.text_config.hidden_size, seed)
    return target


def image_processor(folder: str | Path):
    """The folder's ``Qwen2VLImageProcessorPil``."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    return Qwen2VLImageProcessorPil.from_pretrained(str(folder))


def vl_inputs(folder: str | Path, text: str, images: list[Image] | None = None, *,
              tokenizer=None, processor=None) -> dict:
    """One sequence (batch of 1) as the Qwen-VL processors make it: ``text`` with its
    ``<|image_pad|>`` placeholders (one per image, in order) expanded to each image's visual
    token count, tokenized without added specials; ``pixel_values`` / ``image_grid_thw`` from
    the image processor and ``mm_token_type_ids`` (1 on image pads) when there are images."""
    import torch
    from transformers import AutoTokenizer

    tokenizer = tokenizer or AutoTokenizer.from_pretrained(str(folder))
    images = list(images or [])
    pad = "<|image_pad|>"
    if text.count(pad) != len(images):
        raise ValueError(f"{text.count(pad)} image placeholders for {len(images)} images")
    extra: dict = {}
    if images:
        processor = processor or image_processor(folder)
        extra = dict(processor(images=images, return_tensors="pt"))
        pieces = text.split(pad)
        counts = [int(g.prod()) // processor.merge_size**2 for g in extra["image_grid_thw"]]
        text = pieces[0] + "".join(pad * n + rest for n, rest in zip(counts, pieces[1:],
                                                                       strict=True))
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    input_ids = torch.tensor([ids])
    inputs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), **extra}
    if images:
        inputs["mm_token_type_ids"] = (input_ids == token_id(pad)).long()
    return inputs


def _content(parts: list[str | Image], *, images_first: bool) -> list[dict]:
    """Chat content parts: ``{"type": "image"}`` per PIL image, text parts per string;
    "NULL" when empty."""
    if not parts:
        return [{"type": "text", "text": "NULL"}]
    if images_first:
        parts = [p for p in parts if not isinstance(p, str)] + [p for p in parts
                                                                 if isinstance(p, str)]
    return [{"type": "text", "text": p} if isinstance(p, str) else {"type": "image"}
            for p in parts]


def _images(parts: list[str | Image]) -> list[Image]:
    return [p for p in parts if not isinstance(p, str)]


def _last_hidden(model, inputs: dict):
    """The base model's last hidden state (after the final norm) at the last position."""
    return model(**inputs).last_hidden_state[0, -1].float()


def reference_embedding(folder: str | Path, parts: list[str | Image], *,
                        instruction: str | None = None, normalize: bool = True,
                        images_first: bool = False) -> np.ndarray:
    """Qwen3-VL-Embedding's ``Qwen3VLEmbedder`` on one input: a system message with the
    instruction (default "Represent the user's input."; a "." appended when it does not end in
    punctuation), a user message with ``parts`` (PIL images and strings, in order; the
    official code, with one image and one text, puts the image first: ``images_first=True``),
    the generation prompt; the base model's last hidden state at the last token, L2-normalised
    when ``normalize``. Returns a float32 numpy vector."""
    import unicodedata

    import numpy as np
    import torch
    from transformers import AutoModel, AutoTokenizer

    if instruction:
        instruction = instruction.strip()
        if instruction and not unicodedata.category(instruction[-1]).startswith("P"):
            instruction += "."
    conversation = [
        {"role": "system",
         "content": [{"type": "text", "text": instruction or DEFAULT_EMBED_INSTRUCTION}]},
        {"role": "user", "content": _content(parts, images_first=images_first)}]
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    text = tokenizer.apply_chat_template(conversation, tokenize=False,
                                         add_generation_prompt=True)
    inputs = vl_inputs(folder, text, _images(parts), tokenizer=tokenizer)
    model = AutoModel.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.inference_mode():
        vector = _last_hidden(model, inputs)
        if normalize:
            vector = torch.nn.functional.normalize(vector, p=2, dim=-1)
        return vector.numpy().astype(np.float32)


def reference_qwen3vl_rerank(folder: str | Path, query_parts: list[str | Image],
                             document_parts: list[str | Image], *,
                             instruction: str | None = None, images_first: bool = True) -> float:
    """Qwen3-VL-Reranker on one (query, document) pair: the judge system prompt; user content
    "<Instruct>: " + instruction, "<Query>:", the query's parts, "\\n<Document>:", the
    document's parts (each side's images before its texts, as the official
    ``format_mm_content`` orders them, unless ``images_first=False``; "NULL" for an empty
    side); the generation prompt; ``sigmoid(h . (lm_head[yes] - lm_head[no]))`` with ``h`` the
    base model's (``model.model``) last hidden state at the last token."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    query = _content(query_parts, images_first=images_first)
    document = _content(document_parts, images_first=images_first)
    content = ([{"type": "text",
                 "text": "<Instruct>: " + (instruction or DEFAULT_RERANK_INSTRUCTION)},
                {"type": "text", "text": "<Query>:"}] + query
               + [{"type": "text", "text": "\n<Document>:"}] + document)
    conversation = [{"role": "system", "content": [{"type": "text", "text": RERANK_SYSTEM}]},
                    {"role": "user", "content": content}]
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    text = tokenizer.apply_chat_template(conversation, tokenize=False,
                                         add_generation_prompt=True)
    inputs = vl_inputs(folder, text, _images(query_parts) + _images(document_parts),
                       tokenizer=tokenizer)
    model = AutoModelForImageTextToText.from_pretrained(str(folder),
                                                        dtype=torch.float32).eval()
    yes, no = tokenizer.convert_tokens_to_ids("yes"), tokenizer.convert_tokens_to_ids("no")
    with torch.inference_mode():
        hidden = _last_hidden(model.model, inputs)
        weight = model.lm_head.weight.float()
        return float(torch.sigmoid(hidden @ (weight[yes] - weight[no])))


def jina_head(folder: str | Path):
    """The score head jina-reranker-m0 stores (``score.0``, ReLU, ``score.2``) as a torch
    ``Sequential`` loaded from the folder's safetensors."""
    import torch
    from safetensors.torch import load_file

    tensors = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        tensors.update({k: v for k, v in load_file(str(path)).items()
                        if k.startswith("score.")})
    hidden = tensors["score.0.weight"].shape[1]
    head = torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, 1))
    head.load_state_dict({k.removeprefix("score."): v.float() for k, v in tensors.items()})
    return head.eval()


def reference_jina_m0(folder: str | Path, query: str | Image, document: str | Image) -> float:
    """jina-reranker-m0's ``compute_score`` on one pair (each side a string or a PIL image):
    "**Document**:\\n" + doc + "\\n" + "**Query**:\\n" + query, an image as the vision
    placeholder, images in the order [document, query]; token 100 appended (attention 1);
    the Qwen2-VL base model's last hidden state at that last position through the score head;
    ``sigmoid(x - 2.65)``."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    def side(value: str | Image) -> str:
        return value if isinstance(value, str) else IMAGE_PLACEHOLDER

    text = "**Document**:\n" + side(document) + "\n" + "**Query**:\n" + side(query)
    images = [v for v in (document, query) if not isinstance(v, str)]
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    inputs = vl_inputs(folder, text, images, tokenizer=tokenizer)
    one = torch.ones((1, 1), dtype=torch.long)
    inputs["input_ids"] = torch.cat([inputs["input_ids"], one * JINA_SCORE_TOKEN_ID], dim=1)
    inputs["attention_mask"] = torch.cat([inputs["attention_mask"], one], dim=1)
    if "mm_token_type_ids" in inputs:
        inputs["mm_token_type_ids"] = torch.cat([inputs["mm_token_type_ids"], one * 0], dim=1)
    model = AutoModel.from_pretrained(str(folder), dtype=torch.float32).eval()
    head = jina_head(folder)
    with torch.inference_mode():
        logit = head(_last_hidden(model, inputs))[0]
        return float(torch.sigmoid(logit - JINA_LOGIT_BIAS))
