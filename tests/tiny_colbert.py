"""Tiny randomly initialised ColBERT (late-interaction) model folders, built offline in the
layouts real checkpoints ship in, and reference computations written from each format's own
code, for a server that serves them.

Backbones (seeded, fp32; hidden 32, two layers, two heads; 16-dim token vectors):

* "bert": ``BertModel`` with a WordPiece tokenizer built here (``BERT_VOCAB``: ``[PAD]`` 0,
  ``[unused0]`` 1, ``[unused1]`` 2, ``[UNK]`` 3, ``[CLS]`` 4, ``[SEP]`` 5, ``[MASK]`` 6, every
  ``string.punctuation`` character, digits, letters, ~200 lower-case words and ``##`` pieces, so
  every lower-case ASCII word tokenizes without ``[UNK]``); lower-cases, as bert-base-uncased.
* "modernbert": ``ModernBertModel`` (one global and one 16-token sliding-window layer) with a
  byte-level BPE trained here on ``WORDS`` (256 byte symbols plus merges, then ``[UNK]``
  ``[CLS]`` ``[SEP]`` ``[PAD]`` ``[MASK]`` at the end as ModernBERT has them; ``[MASK]`` lstrips;
  no ``token_type_ids``; case-sensitive; a leading space is part of a word's token, "Ġworld").

``build_st6_colbert(folder, arch)``: what sentence-transformers 6's ``MultiVectorEncoder.save()``
writes for the classic ColBERT recipe: ``modules.json`` with the base ``Transformer`` (in the root:
``config.json``, ``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json``,
``sentence_bert_config.json`` carrying ``query_length`` 32, ``document_length`` 64 and
``query_expansion`` ``{"strategy": "fixed", "attend": False, "token": None, "length": 32}``),
``1_Dense`` (32 -> 16, no bias, identity, ``module_input_name`` "token_embeddings"),
``2_MultiVectorMask`` (``skiplist_words`` = ``string.punctuation``, documents only) and
``3_Normalize`` (token level); ``config_sentence_transformers.json`` with ``model_type``
"MultiVectorEncoder", ``similarity_fn_name`` "maxsim" and the prompts, which are prepended as
text: "bert" uses ``{"query": "[unused0] ", "document": "[unused1] "}`` with both markers
registered in the tokenizer as non-normalized special tokens (what ST6 makes of colbertv2.0),
"modernbert" ``{"query": "[Q] ", "document": "[D] "}`` with "[Q] " / "[D] " (trailing space
included) added tokens at the end of the vocabulary (what PyLate made GTE-ModernColBERT's).

``build_pylate_colbert(folder, arch)``: what PyLate 1.x (``pylate/models/colbert.py``
``ColBERT.save`` on sentence-transformers 5) writes: ``modules.json`` with only
``sentence_transformers.models.Transformer`` (root) and ``pylate.models.Dense.Dense``
(``1_Dense/config.json`` ``in_features`` / ``out_features`` / ``bias`` / ``activation_function``
/ ``use_residual``, ``1_Dense/model.safetensors`` ``linear.weight``); the top-level knobs in
``config_sentence_transformers.json`` (``query_prefix`` / ``document_prefix``, ``query_length``,
``document_length``, ``do_query_expansion``, ``attend_to_expansion_tokens``, ``skiplist_words``,
``similarity_fn_name`` "MaxSim", ``model_type`` "ColBERT"); ``sentence_bert_config.json`` with
``max_seq_length`` = document_length - 1 (PyLate sets it to length - 1 before each tokenize);
the tokenizer as PyLate leaves it: the prefixes passed to ``add_tokens`` (ordinary normalized added
tokens; "[unused0]" keeps its id) and ``pad_token`` set to ``[MASK]``. Normalisation, masking and
query expansion are not modules there: PyLate does them in ``encode`` / ``tokenize``, and ST6
rebuilds them on load (``MultiVectorEncoder._parse_model_config`` / ``_apply_legacy_fixups``).

``build_plain_bert(folder)``: the "bert" backbone alone (no ``modules.json``, no projection): ST6
would open it with a random 128-dim projection; a server should refuse it.

References (one float32 ``(n_tokens, 16)`` array per text):

* ``pylate_reference``: PyLate's ``ColBERT.encode`` / ``tokenize`` written out with transformers
  only: texts stripped (ST5's ``Transformer.tokenize``), tokenized to ``length - 1`` (queries with
  expansion padded to it with ``[MASK]``, PyLate's pad token), the prefix id inserted after the
  first token (attention 1, token type 0), ``attend_to_expansion_tokens`` sets the whole query
  attention mask to 1; ``AutoModel`` -> Dense -> kept rows -> L2 normalise; queries keep every
  position (with expansion), documents drop padding and skiplist ids
  (``convert_tokens_to_ids(word)``, so a word that is not a single token means ``[UNK]``).
* ``st6_reference``: ``MultiVectorEncoder(folder).encode_query`` / ``encode_document``.
* ``maxsim(q, d)``: the sum over query vectors of the best dot product with a document vector.
"""

from __future__ import annotations

import json
import string
import tempfile
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

# Sources read for the PyLate layout (lightonai/pylate, tags 1.0.0 .. v1.4.0):
#   pylate/models/colbert.py: ColBERT.__init__ (prefix add_tokens, pad_token_id = mask_token_id,
#     defaults), insert_prefix_token, encode (masks), tokenize (max_seq_length = length - 1,
#     padding="max_length" for expanded queries), skiplist_mask, save (top-level keys),
#     _load_sbert_model, _get_model_type;
#   pylate/models/Dense.py: Dense (linear + activation, use_residual since 1.3), get_config_dict,
#     load; sentence-transformers v5.1.1 SentenceTransformer.save (modules.json "type" strings,
#     "model_type" from the class name), models/Dense.py get_config_dict, models/Transformer.py
#     tokenize (strip) and sentence_bert_config.json.

ARCHES = ("bert", "modernbert")
HIDDEN = 32
DIM = 16
QUERY_LENGTH = 32
DOCUMENT_LENGTH = 64
SEED = 0
PUNCTUATION = list(string.punctuation)

WORDS = sorted(set((
    "the a an of to and in is it that for on with as at by from this be are was were or not but "
    "have has had do does did can could will would should may might must shall i you he she we "
    "they them their there here what which who whom whose how why when where all any some no "
    "one two three four five six seven eight nine ten first last new old good great small large "
    "long short high low big little many much more most other same different own right left "
    "time year day week month hour people man woman child world life hand part place case point "
    "government company number group problem fact water city river sea mountain country state "
    "capital france paris berlin germany london england rome italy spain madrid europe "
    "cat dog fox bird fish tree flower house car road book paper story music film game "
    "red green blue black white brown quick lazy jumps over under between into through "
    "search query document retrieval passage answer question model text token vector "
    "embedding score rank index late interaction colbert neural network learning data "
    "about after before because if then than so very also just only even still "
    "make made take took go went come came see saw know knew think thought say said get got "
    "find found give gave tell told work play run read write eat drink sleep live love "
    "hello goodbye yes please thank thanks"
).split()))
BERT_SPECIALS = ["[PAD]", "[unused0]", "[unused1]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_LETTERS = list(string.ascii_lowercase)
_DIGITS = list(string.digits)
_SUFFIXES = ["##s", "##es", "##ed", "##ing", "##er", "##ly", "##ion", "##al"]
BERT_VOCAB = {token: i for i, token in enumerate(
    BERT_SPECIALS + PUNCTUATION + _DIGITS + _LETTERS
    + [w for w in WORDS if w not in _LETTERS]
    + ["##" + c for c in _LETTERS + _DIGITS] + _SUFFIXES)}
MODERNBERT_SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
MODERNBERT_BPE_SIZE = 1024  # byte alphabet (256) + merges, before the specials

# The version stamp PyLate 1.4 (sentence-transformers 5.1.1, transformers <= 4.56.2) writes.
PYLATE_VERSIONS = {"sentence_transformers": "5.1.1", "transformers": "4.56.2",
                   "pytorch": "2.8.0+cu128"}


# --- tokenizers ----------------------------------------------------------------------------


def bert_tokenizer():
    """The tiny WordPiece tokenizer (a transformers ``BertTokenizer``, lower-casing)."""
    from transformers import BertTokenizer

    return BertTokenizer(vocab=dict(BERT_VOCAB), do_lower_case=True, model_max_length=512)


def _bpe_corpus() -> list[str]:
    # Every word alone, after a space and capitalised, so the merges make whole-word tokens.
    return [f"{w} {w} {w.capitalize()} {w}, {w}." for w in WORDS] + [string.punctuation]


def modernbert_tokenizer():
    """The tiny byte-level BPE tokenizer with ModernBERT's specials and template
    (``[CLS] $A [SEP]``), as a ``PreTrainedTokenizerFast``."""
    from tokenizers import (
        AddedToken,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=MODERNBERT_BPE_SIZE, min_frequency=1,
                                  show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(_bpe_corpus(), trainer=trainer)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False,
                                             lstrip=t == "[MASK]") for t in MODERNBERT_SPECIALS])
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
        pad_token="[PAD]", mask_token="[MASK]", model_max_length=8192,
        clean_up_tokenization_spaces=True, model_input_names=["input_ids", "attention_mask"])


def _tokenizer(arch: str):
    if arch == "bert":
        return bert_tokenizer()
    if arch == "modernbert":
        return modernbert_tokenizer()
    raise ValueError(f"no tiny ColBERT backbone {arch!r}: one of {ARCHES}")


# --- backbones -----------------------------------------------------------------------------


def _backbone(arch: str, tokenizer, seed: int):
    """A seeded random ``BertModel`` / ``ModernBertModel`` sized to ``len(tokenizer)``."""
    import torch
    from transformers import BertConfig, BertModel, ModernBertConfig, ModernBertModel

    torch.manual_seed(seed)
    if arch == "bert":
        config = BertConfig(vocab_size=len(tokenizer), hidden_size=HIDDEN, num_hidden_layers=2,
                            num_attention_heads=2, intermediate_size=2 * HIDDEN,
                            max_position_embeddings=128, pad_token_id=0)
        return BertModel(config, add_pooling_layer=True).eval()
    config = ModernBertConfig(
        vocab_size=len(tokenizer), hidden_size=HIDDEN, num_hidden_layers=2,
        num_attention_heads=2, intermediate_size=2 * HIDDEN, max_position_embeddings=128,
        layer_types=["full_attention", "sliding_attention"], local_attention=16,
        pad_token_id=tokenizer.convert_tokens_to_ids("[PAD]"),
        bos_token_id=tokenizer.cls_token_id, cls_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id, sep_token_id=tokenizer.sep_token_id,
        attn_implementation="sdpa")
    return ModernBertModel(config).eval()


def _save_backbone(target: Path, arch: str, tokenizer, seed: int) -> None:
    target.mkdir(parents=True, exist_ok=True)
    _backbone(arch, tokenizer, seed).save_pretrained(str(target), safe_serialization=True)
    tokenizer.save_pretrained(str(target))


def _projection(seed: int):
    """The seeded 32 -> 16 ColBERT projection weight, ``(16, 32)``, shared by both formats."""
    import torch

    generator = torch.Generator().manual_seed(seed + 1)
    return torch.randn(DIM, HIDDEN, generator=generator) / HIDDEN ** 0.5


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2) + "\n", encoding="utf8")


def build_plain_bert(folder: str | Path, *, seed: int = SEED) -> Path:
    """The tiny "bert" backbone alone (``config.json``, ``model.safetensors``,
    ``tokenizer.json``, ``tokenizer_config.json``): no ColBERT files. Returns the folder."""
    target = Path(folder)
    _save_backbone(target, "bert", bert_tokenizer(), seed)
    return target


# --- sentence-transformers 6 ---------------------------------------------------------------

ST6_PROMPTS = {"bert": {"query": "[unused0] ", "document": "[unused1] "},
               "modernbert": {"query": "[Q] ", "document": "[D] "}}


def build_st6_colbert(folder: str | Path, arch: str = "bert", *, seed: int = SEED) -> Path:
    """A native sentence-transformers 6 ``MultiVectorEncoder`` folder (classic ColBERT recipe;
    see the module docstring). Returns the folder."""
    import torch
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask
    from transformers import AddedToken

    tokenizer = _tokenizer(arch)
    if arch == "bert":
        # What ST6's _register_prefix_tokens does to a legacy [unused0] checkpoint: one piece.
        tokenizer.add_special_tokens({"additional_special_tokens": [
            AddedToken(t, normalized=False, special=True) for t in ("[unused0]", "[unused1]")]})
    else:
        # What PyLate's ColBERT.__init__ does: add_tokens(["[Q] ", "[D] "]), new ids at the end.
        tokenizer.add_tokens(list(ST6_PROMPTS["modernbert"].values()))
    target = Path(folder)
    with tempfile.TemporaryDirectory() as base:
        _save_backbone(Path(base), arch, tokenizer, seed)
        transformer = Transformer(
            base, query_length=QUERY_LENGTH, document_length=DOCUMENT_LENGTH,
            query_expansion={"strategy": "fixed", "attend": False, "length": QUERY_LENGTH})
        dense = Dense(in_features=HIDDEN, out_features=DIM, bias=False,
                      activation_function=torch.nn.Identity(), init_weight=_projection(seed),
                      module_input_name="token_embeddings")
        modules = [transformer, dense, MultiVectorMask(skiplist_words=PUNCTUATION),
                   Normalize(module_input_name="token_embeddings")]
        model = MultiVectorEncoder(modules=modules, prompts=dict(ST6_PROMPTS[arch]),
                                   device="cpu", similarity_fn_name="maxsim")
        model.save(str(target), create_model_card=False)
    return target


# --- PyLate 1.x ----------------------------------------------------------------------------

PYLATE_PREFIXES = {"bert": ("[unused0]", "[unused1]"), "modernbert": ("[Q] ", "[D] ")}


def build_pylate_colbert(folder: str | Path, arch: str = "bert", *, seed: int = SEED,
                         model_type: str | None = "ColBERT",
                         skiplist_words: list[str] | None = None,
                         do_query_expansion: bool = True,
                         attend_to_expansion_tokens: bool = False) -> Path:
    """A folder as PyLate 1.x's ``ColBERT.save`` writes it (see the module docstring):
    "bert" with prefixes "[unused0]" / "[unused1]" (PyLate's Stanford-style checkpoints),
    "modernbert" with "[Q] " / "[D] " (GTE-ModernColBERT). ``model_type=None`` leaves out the
    ``model_type`` key, as PyLate 1.0 - 1.2 (sentence-transformers 3 / 4) saved it.
    ``skiplist_words`` defaults to ``string.punctuation``. Returns the folder."""
    from safetensors.torch import save_file

    tokenizer = _tokenizer(arch)
    query_prefix, document_prefix = PYLATE_PREFIXES[arch]
    tokenizer.add_tokens([query_prefix, document_prefix])  # ColBERT.__init__
    tokenizer.pad_token_id = tokenizer.mask_token_id  # ColBERT.__init__: [MASK] pads queries
    target = Path(folder)
    _save_backbone(target, arch, tokenizer, seed)
    if arch == "bert":  # transformers 4 also wrote these two next to tokenizer.json
        (target / "vocab.txt").write_text("".join(t + "\n" for t in BERT_VOCAB), encoding="utf8")
        _write_json(target / "special_tokens_map.json", {
            "cls_token": "[CLS]", "mask_token": "[MASK]", "pad_token": "[MASK]",
            "sep_token": "[SEP]", "unk_token": "[UNK]"})
    _write_json(target / "sentence_bert_config.json",
                {"max_seq_length": DOCUMENT_LENGTH - 1, "do_lower_case": False})
    _write_json(target / "modules.json", [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"}])
    dense = target / "1_Dense"
    dense.mkdir(exist_ok=True)
    _write_json(dense / "config.json", {
        "in_features": HIDDEN, "out_features": DIM, "bias": False,
        "activation_function": "torch.nn.modules.linear.Identity", "use_residual": False})
    save_file({"linear.weight": _projection(seed).contiguous()},
              str(dense / "model.safetensors"), metadata={"format": "pt"})
    config: dict[str, Any] = {} if model_type is None else {"model_type": model_type}
    config.update({
        "__version__": dict(PYLATE_VERSIONS),
        "prompts": {"query": "", "document": ""},
        "default_prompt_name": None,
        "similarity_fn_name": "MaxSim",
        "query_prefix": query_prefix,
        "document_prefix": document_prefix,
        "query_length": QUERY_LENGTH,
        "document_length": DOCUMENT_LENGTH,
        "attend_to_expansion_tokens": attend_to_expansion_tokens and do_query_expansion,
        "skiplist_words": list(PUNCTUATION if skiplist_words is None else skiplist_words),
        "do_query_expansion": do_query_expansion,
    })
    _write_json(target / "config_sentence_transformers.json", config)
    return target


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf8"))


def pylate_reference(folder: str | Path, texts: Sequence[str], is_query: bool) -> list[np.ndarray]:
    """PyLate 1.x's ``ColBERT.encode(texts, is_query=...)`` on a PyLate folder, written out
    with transformers, safetensors and torch (one batch, no sorting: padding is masked)."""
    import numpy as np
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModel, AutoTokenizer

    folder = Path(folder)
    config = _json(folder / "config_sentence_transformers.json")
    # ColBERT.__init__ defaults for missing keys.
    query_prefix = config.get("query_prefix") or "[Q] "
    document_prefix = config.get("document_prefix") or "[D] "
    query_length = config.get("query_length") or 32
    document_length = config.get("document_length") or 180
    skiplist_words = config.get("skiplist_words") or PUNCTUATION
    do_expansion = config.get("do_query_expansion")
    do_expansion = True if do_expansion is None else do_expansion
    attend = bool(config.get("attend_to_expansion_tokens")) and do_expansion
    do_lower_case = _json(folder / "sentence_bert_config.json").get("do_lower_case", False)

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    tokenizer.add_tokens([query_prefix, document_prefix])
    tokenizer.pad_token_id = tokenizer.mask_token_id
    prefix_id = tokenizer.convert_tokens_to_ids(query_prefix if is_query else document_prefix)
    skiplist = [tokenizer.convert_tokens_to_ids(word) for word in skiplist_words]

    # ColBERT.tokenize -> sentence-transformers 5 Transformer.tokenize (strip, lower-case).
    batch = [str(text).strip() for text in texts]
    if do_lower_case:
        batch = [text.lower() for text in batch]
    length = query_length if is_query else document_length
    features = tokenizer(batch, padding="max_length" if is_query and do_expansion else True,
                         truncation="longest_first", max_length=length - 1, return_tensors="pt")

    def insert(values: torch.Tensor, value: int) -> torch.Tensor:  # insert_prefix_token
        column = torch.full((values.shape[0], 1), value, dtype=values.dtype)
        return torch.cat([values[:, :1], column, values[:, 1:]], dim=1)

    input_ids = insert(features["input_ids"], prefix_id)
    attention_mask = insert(features["attention_mask"], 1)
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    if "token_type_ids" in features:
        inputs["token_type_ids"] = insert(features["token_type_ids"], 0)
    if is_query and attend:
        inputs["attention_mask"] = torch.ones_like(attention_mask)

    model = AutoModel.from_pretrained(str(folder), dtype=torch.float32).eval()
    modules = json.loads((folder / "modules.json").read_text(encoding="utf8"))
    dense_dir = folder / next(m["path"] for m in modules if m["type"].endswith("Dense"))
    dense_config = _json(dense_dir / "config.json")
    weights = load_file(str(dense_dir / "model.safetensors"))
    if dense_config.get("activation_function", "torch.nn.modules.linear.Identity") != (
            "torch.nn.modules.linear.Identity"):
        raise NotImplementedError("only PyLate's identity activation is written out here")
    with torch.inference_mode():
        hidden = model(**inputs).last_hidden_state
        projected = torch.nn.functional.linear(hidden, weights["linear.weight"],
                                               weights.get("linear.bias"))
        if dense_config.get("use_residual"):
            residual = hidden if "residual.weight" not in weights else (
                torch.nn.functional.linear(hidden, weights["residual.weight"]))
            projected = projected + residual
    if is_query:
        masks = (torch.ones_like(input_ids, dtype=torch.bool) if do_expansion
                 else attention_mask.bool())
    else:
        masks = ~torch.isin(input_ids, torch.tensor(skiplist)) & attention_mask.bool()
    return [torch.nn.functional.normalize(row[mask], p=2, dim=1).numpy().astype(np.float32)
            for row, mask in zip(projected, masks, strict=True)]


# --- sentence-transformers 6 reference and MaxSim ------------------------------------------


@lru_cache(maxsize=8)
def _st6_model(folder: str, mtime_ns: int):
    from sentence_transformers import MultiVectorEncoder

    return MultiVectorEncoder(folder, device="cpu", local_files_only=True)


def load_st6(folder: str | Path):
    """``MultiVectorEncoder(folder)`` on the CPU (cached per folder and its mtime)."""
    resolved = Path(folder).resolve()
    return _st6_model(str(resolved), resolved.stat().st_mtime_ns)


def st6_reference(folder: str | Path, texts: Sequence[str], is_query: bool) -> list[np.ndarray]:
    """sentence-transformers 6's ``encode_query`` / ``encode_document`` of ``texts``, one
    float32 ``(n_tokens, dim)`` array per text."""
    import numpy as np

    model = load_st6(folder)
    encode = model.encode_query if is_query else model.encode_document
    return [np.asarray(v, dtype=np.float32)
            for v in encode(list(texts), convert_to_numpy=True, batch_size=32)]


def maxsim(query: np.ndarray, document: np.ndarray) -> float:
    """ColBERT's MaxSim: for each query vector the best dot product with a document vector,
    summed."""
    import numpy as np

    return float(np.max(np.asarray(query) @ np.asarray(document).T, axis=1).sum())
