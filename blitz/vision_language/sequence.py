"""A vision-language model's input sequence: its prompt's own text, a caller's texts and
images, as token ids, each image's placeholder expanded to the tokens its grid takes.

A prompt is a list of pieces (``Piece``): the template's own text (its special tokens
parsed as such), a caller's text (tokenized with special-token parsing off, so a document
that spells ``<|im_end|>`` stays plain text and cannot close its turn), and an image
(``<|image_pad|>`` repeated ``VisualInput.tokens`` times, between the template's vision
start and end). ``chat_pieces`` renders a chat conversation with the model's own chat
template (``tokenizer.apply_chat_template``), each caller's text and image in its place.

The texts between two images are tokenized as one string, as the model card's code
tokenizes its whole prompt, so a text's edges merge with the template's as they do there;
but where a caller's text spells one of the tokenizer's special tokens, each text is
tokenized alone, the caller's with special-token parsing off.

A sequence over ``limit`` tokens loses tokens from the end of its cuttable texts, in the
order its pieces name (a reranker's document before its query); images, the template and
the other texts are never cut (the texts are tokenized alone to be cut). One that is
still over (its images alone) is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from blitz.errors import InputTooLong
from blitz.vision_language.visual import VisualInput

IMAGE_PAD = "<|image_pad|>"
VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"
IMAGE_SLOT = VISION_START + IMAGE_PAD + VISION_END  # an image in a prompt's own text
_MARK = re.compile("\ue000(\\d+)\ue001")  # a caller's text in a rendered template


@dataclass(frozen=True)
class Piece:
    """A prompt's template text (``cut`` None), a caller's text (``cut``: its rank among the
    texts cut first when the sequence is too long, 0 first; -1: never cut) or an image."""

    text: str | None = None
    image: VisualInput | None = None
    caller: bool = False
    cut: int = -1


def template(text: str) -> Piece:
    return Piece(text=text)


def caller_text(text: str, cut: int = -1) -> Piece:
    return Piece(text=text, caller=True, cut=cut)


def image(visual: VisualInput) -> Piece:
    return Piece(image=visual)


@dataclass(frozen=True)
class Sequence:
    """One input's token ids and its images, in order."""

    ids: list[int]
    images: list[VisualInput]

    def __len__(self) -> int:
        return len(self.ids)


class SequenceBuilder:
    """Pieces into token ids with ``tokenizer`` (a transformers fast tokenizer)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.image_pad = self._special(IMAGE_PAD)
        self.start = self._special(VISION_START)
        self.end = self._special(VISION_END)
        specials = sorted(tokenizer.get_added_vocab(), key=len, reverse=True)
        self._spells_special = re.compile("|".join(map(re.escape, specials))) if specials \
            else None

    def _special(self, token: str) -> int:
        token_id = self.tokenizer.convert_tokens_to_ids(token)
        if token_id is None or token_id == self.tokenizer.unk_token_id:
            raise ValueError(f"the tokenizer has no {token} token: not a Qwen-VL-family "
                             "vision-language model")
        return int(token_id)

    def ids(self, texts: list[str], *, caller: bool) -> list[list[int]]:
        if not texts:
            return []
        return self.tokenizer(texts, add_special_tokens=False, truncation=False,
                              return_attention_mask=False, return_token_type_ids=False,
                              split_special_tokens=caller, verbose=False)["input_ids"]

    def build(self, pieces: list[Piece], limit: int, truncate: bool, index: int = 0
              ) -> Sequence:
        """``pieces`` as one sequence of at most ``limit`` tokens (``truncate``: caller
        texts cut to fit; else an over-long input is a 413 naming ``index``)."""
        runs = self._joined(pieces)
        if runs is not None and sum(len(c) for c in runs[0]) <= limit:
            return Sequence([i for c in runs[0] for i in c], runs[1])
        chunks, images = self._alone(pieces)
        total = sum(len(c) for c in chunks)
        if total > limit:
            if not truncate:
                raise InputTooLong.at(index, total, limit)
            total = self._cut(pieces, chunks, total - limit)
            if total > limit:
                raise InputTooLong(
                    f"input {index} takes {total} tokens with its texts cut away (its "
                    f"images and the prompt); the model's limit is {limit}: send fewer or "
                    "smaller images", param="input")
        return Sequence([i for c in chunks for i in c], images)

    def _joined(self, pieces: list[Piece]) -> tuple[list[list[int]], list[VisualInput]] | None:
        """The texts between images tokenized as one string each; None where a caller's
        text spells a special token."""
        spells = self._spells_special
        if spells is not None and any(p.caller and p.text and spells.search(p.text)
                                      for p in pieces):
            return None
        runs: list[str] = [""]
        images: list[VisualInput] = []
        for p in pieces:
            if p.image is not None:
                images.append(p.image)
                runs.append("")
            elif p.text:
                runs[-1] += p.text
        ids = self.ids(runs, caller=False)
        chunks: list[list[int]] = [list(ids[0])]
        for visual, run in zip(images, ids[1:], strict=True):
            chunks.append([self.start, *([self.image_pad] * visual.tokens), self.end])
            chunks.append(list(run))
        if any(self.image_pad in c for c in chunks[::2]):
            raise ValueError("a prompt's own text holds an image pad: pass images as pieces")
        return chunks, images

    def _alone(self, pieces: list[Piece]) -> tuple[list[list[int]], list[VisualInput]]:
        """Each piece's ids alone (a caller's text with special-token parsing off)."""
        callers = iter(self.ids([t for p in pieces if p.caller and (t := p.text)], caller=True))
        owns = iter(self.ids([t for p in pieces if not p.caller and (t := p.text)],
                             caller=False))
        chunks: list[list[int]] = []
        images: list[VisualInput] = []
        for p in pieces:
            if p.image is not None:
                chunks.append([self.start, *([self.image_pad] * p.image.tokens), self.end])
                images.append(p.image)
            elif p.text:
                own = list(next(callers) if p.caller else next(owns))
                if not p.caller and self.image_pad in own:
                    raise ValueError("a prompt's own text holds an image pad: pass images "
                                     "as pieces")
                chunks.append(own)
            else:
                chunks.append([])
        return chunks, images

    @staticmethod
    def _cut(pieces: list[Piece], chunks: list[list[int]], excess: int) -> int:
        """Drop ``excess`` tokens from the ends of the cuttable texts, first-ranked first;
        the total left."""
        order = sorted((p.cut, -k) for k, p in enumerate(pieces) if p.caller and p.cut >= 0)
        for _, negative in order:
            k = -negative
            take = min(excess, len(chunks[k]))
            if take:
                del chunks[k][len(chunks[k]) - take:]
                excess -= take
            if not excess:
                break
        return sum(len(c) for c in chunks)


def chat_pieces(tokenizer: Any, messages: list[dict[str, Any]]) -> list[Piece]:
    """A conversation rendered with the model's chat template (a generation prompt after
    it), as pieces. ``messages`` are chat messages whose ``content`` lists hold ``Piece``
    values: a caller's text or an image in its place."""
    held: list[Piece] = []
    rendered_messages = []
    for message in messages:
        content = []
        for part in message["content"]:
            if part.image is not None:
                content.append({"type": "image"})
                held.append(part)
            else:
                content.append({"type": "text", "text": f"\ue000{len(held)}\ue001"})
                held.append(part)
        rendered_messages.append({"role": message["role"], "content": content})
    text = tokenizer.apply_chat_template(rendered_messages, tokenize=False,
                                         add_generation_prompt=True)
    images = [p for p in held if p.image is not None]
    pieces: list[Piece] = []
    placed = 0
    at = 0
    for match in _MARK.finditer(text):
        own = text[at:match.start()]
        placed = _template_with_images(own, images, placed, pieces)
        pieces.append(held[int(match.group(1))])
        at = match.end()
    placed = _template_with_images(text[at:], images, placed, pieces)
    if placed != len(images):
        raise ValueError(f"the chat template placed {placed} of {len(images)} images")
    return pieces


def _template_with_images(text: str, images: list[Piece], placed: int,
                          pieces: list[Piece]) -> int:
    """The template's ``text`` as pieces, each image slot in it the next image."""
    for k, own in enumerate(text.split(IMAGE_SLOT)):
        if k:
            pieces.append(images[placed])
            placed += 1
        if own:
            pieces.append(template(own))
    return placed
