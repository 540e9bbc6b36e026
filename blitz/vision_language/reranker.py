"""A vision-language reranker: a query scored against documents that are texts, images or
mixes of both, by one of two model cards' formulas (``ModelSpec.reranker_style``):

    qwen3-vl  (Qwen3-VL-Reranker) a chat: the system turn asks whether the Document meets
              the Query and the Instruct; the user turn is ``<Instruct>: {instruction}``,
              ``<Query>:``, the query's parts, ``\\n<Document>:``, the document's parts;
              then the generation prompt. logit = h . (w_yes - w_no), ``w`` the LM head's
              rows of the tokens "yes" and "no" and ``h`` the last hidden state.
    jina-m0   (jina-reranker-m0) ``**Document**:\\n{document}\\n**Query**:\\n{query}``,
              then the score token (id 100); logit = the model's score head (Linear, ReLU,
              Linear) on the last hidden state, less 2.65.

The score is ``sigmoid(logit)`` when the spec's ``normalize`` is on (the default), else the
logit. A pair over ``max_seq_length`` loses the end of its document's texts, then of its
query's; never an image nor the prompt.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from blitz.encoders.base import Encoded
from blitz.settings.registry import ModelSpec
from blitz.vision_language.decoder import Document, VlDecoder, open_decoder
from blitz.vision_language.sequence import Piece, caller_text, chat_pieces, template
from blitz.vision_language.visual import ImageShape, read_image_shape

QWEN3_VL_SYSTEM = ("Judge whether the Document meets the requirements based on the Query and "
                   "the Instruct provided. Note that the answer can only be \"yes\" or \"no\".")
QWEN3_VL_INSTRUCTION = "Given a search query, retrieve relevant candidates that answer the query."
JINA_SCORE_TOKEN = 100  # jina-reranker-m0's score_token_id
JINA_LOGIT_BIAS = 2.65  # subtracted before the sigmoid (its compute_score)
NULL = "NULL"  # the model card's stand-in for an empty query or document


class VlReranker(VlDecoder):
    kind = "vl-reranker"
    capabilities = frozenset({"score", "score_parts"})

    def __init__(self, model_id: str, model: Any, tokenizer: Any, folder: Path,
                 shape: ImageShape, head: Any, *, style: str, instruction: str | None = None,
                 normalize: bool = True, max_seq_length: int | None = None,
                 token_budget: int = 4096):
        super().__init__(model_id, model, tokenizer, folder, shape,
                         max_seq_length=max_seq_length, token_budget=token_budget)
        self.style = style
        self.instruction = instruction or QWEN3_VL_INSTRUCTION
        self.normalize = normalize
        self.score_head = head

    @property
    def dimension(self) -> None:
        return None

    def head(self, states: Any) -> Any:
        return self.score_head(states.to(self.score_head_dtype)).reshape(-1, 1)

    @property
    def score_head_dtype(self) -> Any:
        return next(self.score_head.parameters()).dtype

    def prompt(self, query: list[Piece], document: list[Piece],
               instruction: str | None) -> list[Piece]:
        query = query or [caller_text(NULL)]
        document = document or [caller_text(NULL)]
        if self.style == "jina-m0":
            return [template("**Document**:\n"), *document, template("\n**Query**:\n"), *query]
        with self._lock:
            return chat_pieces(self.tokenizer, [
                {"role": "system", "content": [template(QWEN3_VL_SYSTEM)]},
                {"role": "user", "content": [
                    caller_text("<Instruct>: " + (instruction or self.instruction)),
                    template("<Query>:"), *query, template("\n<Document>:"), *document]}])

    def score_parts(self, query: Document, documents: list[Document], *,
                    instruction: str | None = None, truncate: bool = True) -> Encoded:
        """Each document's score against ``query`` (texts, images or both, in order)."""
        if not documents:
            return Encoded(np.zeros(0, np.float32), np.zeros(0, np.int64), 0)
        asked = self.parts(query, -1, cut=1)
        prompts = [self.prompt(asked, self.parts(doc, i, cut=0), instruction)
                   for i, doc in enumerate(documents)]
        sequences = self.sequences(prompts, truncate)
        if self.style == "jina-m0":  # the score token after each pair
            sequences = [type(s)([*s.ids, JINA_SCORE_TOKEN], s.images) for s in sequences]
        logits, padded = self.last_states(sequences)
        logits = logits.astype(np.float64)
        if self.style == "jina-m0":
            logits = logits - JINA_LOGIT_BIAS
        # sigmoid, written so that no logit overflows exp
        scores = 0.5 * (1.0 + np.tanh(0.5 * logits)) if self.normalize else logits
        counts = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=len(sequences))
        return Encoded(scores.reshape(-1).astype(np.float32), counts, padded)

    def warmup(self) -> None:
        """A text and an image document: both paths' lazy setup done before a request."""
        self.score_parts(("warm up",), [("warm up",), (self.blank_image(),)])

    def score(self, query: str, documents: list[str], *, truncate: bool = True) -> Encoded:
        return self.score_parts((query,), [(d,) for d in documents], truncate=truncate)

    out_width = 1  # one logit a row


def _qwen3_vl_head(path: Path, tokenizer: Any, dtype: Any, device: str) -> Any:
    """A linear layer of the LM head's "yes" row less its "no" row."""
    torch = __import__("torch")
    weights = _tensors(path, ("lm_head.weight", "model.language_model.embed_tokens.weight",
                              "model.embed_tokens.weight"))
    rows = weights.get("lm_head.weight")
    if rows is None:  # tied to the input embeddings
        rows = next(iter(weights.values()))
    yes, no = (_one_token(tokenizer, word) for word in ("yes", "no"))
    layer = torch.nn.Linear(rows.shape[1], 1, bias=False)
    with torch.no_grad():
        layer.weight[0] = rows[yes].float() - rows[no].float()
    return layer.to(device, dtype).eval()


def _jina_head(path: Path, dtype: Any, device: str) -> Any:
    """jina-reranker-m0's score head (Linear, ReLU, Linear) from the model's weights."""
    torch = __import__("torch")
    weights = _tensors(path, ("score.0.weight", "score.0.bias", "score.2.weight",
                              "score.2.bias"))
    if len(weights) != 4:
        raise ValueError(f"{path}: no jina-reranker-m0 score head (score.0, score.2) in the "
                         "weights")
    width = weights["score.0.weight"].shape[1]
    head = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                               torch.nn.Linear(width, 1))
    head.load_state_dict({k.removeprefix("score."): v.float() for k, v in weights.items()})
    return head.to(device, dtype).eval()


def _tensors(path: Path, names: tuple[str, ...]) -> dict[str, Any]:
    """The named tensors found in ``path``'s safetensors files."""
    from safetensors import safe_open

    index = path / "model.safetensors.index.json"
    files = (sorted(set(json.loads(index.read_text())["weight_map"].values()))
             if index.exists() else ["model.safetensors"])
    out: dict[str, Any] = {}
    for name in files:
        with safe_open(str(path / name), framework="pt") as f:
            for key in names:
                if key in f.keys() and key not in out:
                    out[key] = f.get_tensor(key)
    return out


def _one_token(tokenizer: Any, word: str) -> int:
    ids = tokenizer(word, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise ValueError(f"{word!r} is {len(ids)} tokens in the model's tokenizer; the "
                         "qwen3-vl style reads one token's logit")
    return int(ids[0])


def open_vl_reranker(spec: ModelSpec, path: Path, device: str, dtype: Any,
                     token_budget: int) -> VlReranker:
    """``spec``'s vision-language reranker in ``path`` on ``device`` in ``dtype``."""
    model, tokenizer = open_decoder(path, device, dtype, spec.trust_remote_code)
    style = "jina-m0" if spec.reranker_style == "jina-m0" else "qwen3-vl"
    head = (_jina_head(path, model.dtype, device) if style == "jina-m0"
            else _qwen3_vl_head(path, tokenizer, model.dtype, device))
    shape = read_image_shape(path).capped(spec.image_max_tokens, spec.image_min_tokens)
    return VlReranker(spec.id, model, tokenizer, path, shape, head, style=style,
                      instruction=spec.rerank_instruction, normalize=spec.normalize,
                      max_seq_length=spec.max_seq_length, token_budget=token_budget)
