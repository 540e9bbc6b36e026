"""A deterministic corpus of English-like sentences for load tests and benchmarks.

No downloads: sentences are built from word lists and templates with a seeded
``random.Random``. With the all-MiniLM-L6-v2 tokenizer (special tokens included) they
run 8 to 80 tokens, about 25 on average, with a long right tail like real queries and
product text. The same ``seed`` always gives the same sentences, on every platform, and
``sentences(n, seed)`` is a prefix of ``sentences(m, seed)`` for ``n <= m``.

    >>> from loadtest.corpus import sentences
    >>> texts = sentences(1000)            # seed 0
    >>> batches = list(batched(texts, 32))
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterable, Iterator

__all__ = ["batched", "sentences", "stream"]

_PEOPLE = [
    "the team", "our new manager", "a small company in Berlin", "my neighbor",
    "the city council", "most students", "the research group", "her younger brother",
    "the head chef", "several investors", "the museum director", "our landlord",
    "the support engineer", "a local farmer", "the airline", "his grandmother",
    "the school board", "a group of volunteers", "the author", "the night shift nurse",
    "the startup founder", "my doctor", "the football coach", "a retired teacher",
    "the delivery driver", "the mayor", "our product designer", "the bank",
]
_THINGS = [
    "the quarterly report", "a new recipe for lemon cake", "the database migration",
    "the train schedule", "an old bicycle", "the hotel booking", "the software update",
    "a pair of running shoes", "the annual budget", "the garden fence", "a used car",
    "the customer survey", "the museum exhibition", "a cheap flight to Lisbon",
    "the kitchen renovation", "the marketing plan", "a wireless keyboard",
    "the tax return", "the hiking trail map", "a vegetarian lasagna", "the science fair project",
    "the electricity bill", "a history of the Roman empire", "the mobile app",
    "the health insurance policy", "a birthday present", "the research paper",
    "the weekly newsletter", "a noise cancelling headset", "the parking permit",
]
_VERBS_PAST = [
    "finished", "cancelled", "reviewed", "postponed", "approved", "rejected", "ordered",
    "repaired", "discussed", "recommended", "published", "tested", "changed", "explained",
    "returned", "described", "updated", "planned", "shared", "criticized", "improved",
    "found", "lost", "sold", "bought", "checked", "delivered", "designed",
]
_VERBS_BASE = [
    "finish", "cancel", "review", "postpone", "approve", "order", "repair", "discuss",
    "recommend", "publish", "test", "change", "explain", "return", "describe", "update",
    "plan", "share", "improve", "find", "sell", "buy", "check", "deliver", "design",
    "compare", "translate", "summarize",
]
_TIMES = [
    "yesterday", "last week", "on Monday morning", "after lunch", "this year",
    "before the holidays", "late at night", "in the spring", "two days ago",
    "at the end of the month", "during the meeting", "earlier today", "last summer",
    "over the weekend", "in 2019", "next Friday", "by the end of the quarter",
]
_PLACES = [
    "in the office", "at home", "near the station", "in the north of the city",
    "at the conference", "on the second floor", "in a small village", "at the airport",
    "in the shared folder", "on the website", "at the farmers market", "in the lab",
    "across the river", "downtown", "in the cloud", "at the clinic",
]
_REASONS = [
    "the price was too high", "nobody had enough time", "the weather was terrible",
    "the results looked promising", "the old version kept crashing",
    "the customers asked for it", "the deadline moved", "the team wanted more feedback",
    "the first attempt failed", "it was cheaper than expected",
    "the instructions were confusing", "the reviews were mostly positive",
]
_ADVERBS = [
    "quickly", "carefully", "again", "finally", "quietly", "without much trouble",
    "almost immediately", "for the first time", "with great care", "in a hurry",
]
_OPINIONS = [
    "works better than I expected", "is far too expensive for what it does",
    "arrived broken and smelled like plastic", "is easy to set up",
    "stopped working after a month", "looks great but feels cheap",
    "is the best purchase I made this year", "needs a clearer manual",
    "is fine for beginners", "keeps disconnecting from the network",
]
_TOPICS = [
    "climate change", "machine learning", "the housing market", "remote work",
    "public transport", "renewable energy", "sleep quality", "small business loans",
    "vitamin D", "electric cars", "the stock market", "online privacy", "urban gardening",
    "interest rates", "language learning", "video compression", "food allergies",
]
_CONNECTORS = [", and", ", but", "; however,", ", while", ", although", ", so", ". Then"]


def _clause(rng: random.Random) -> str:
    """One independent clause, 4 to 14 words."""
    kind = rng.random()
    if kind < 0.45:
        words = [rng.choice(_PEOPLE), rng.choice(_VERBS_PAST), rng.choice(_THINGS)]
    elif kind < 0.65:
        words = [rng.choice(_PEOPLE), "will", rng.choice(_VERBS_BASE), rng.choice(_THINGS)]
    elif kind < 0.8:
        words = [rng.choice(_THINGS), "was", rng.choice(_VERBS_PAST), "by", rng.choice(_PEOPLE)]
    elif kind < 0.9:
        words = [rng.choice(_PEOPLE), "said that", rng.choice(_THINGS),
                 rng.choice(["is", "was", "seems"]),
                 rng.choice(["late", "ready", "too long", "very useful", "out of date"])]
    else:
        words = ["I bought", rng.choice(_THINGS), "and it", rng.choice(_OPINIONS)]
    if rng.random() < 0.35:
        words.append(rng.choice(_ADVERBS))
    if rng.random() < 0.4:
        words.append(rng.choice(_PLACES))
    if rng.random() < 0.45:
        words.append(rng.choice(_TIMES))
    return " ".join(words)


def _question(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.3:
        return f"How do I {rng.choice(_VERBS_BASE)} {rng.choice(_THINGS)} {rng.choice(_PLACES)}?"
    if kind < 0.55:
        return f"What is the best way to {rng.choice(_VERBS_BASE)} {rng.choice(_THINGS)}?"
    if kind < 0.75:
        return f"Why did {rng.choice(_PEOPLE)} {rng.choice(_VERBS_BASE)} {rng.choice(_THINGS)}?"
    if kind < 0.9:
        return f"What are the effects of {rng.choice(_TOPICS)} on {rng.choice(_TOPICS)}?"
    audience = rng.choice(["beginners", "busy parents", "small teams", "students"])
    return f"{rng.choice(_TOPICS)} explained in simple words for {audience}.".capitalize()


def _fact(rng: random.Random) -> str:
    pct = f"{rng.randint(1, 60)}.{rng.randint(0, 9)}"
    return (f"According to {rng.choice(_PEOPLE)}, interest in {rng.choice(_TOPICS)} "
            f"grew by {pct} percent {rng.choice(_TIMES)}")


def _target_words(rng: random.Random) -> int:
    """Words to aim for: log-normal around 15, clipped to 5..50 (tokens add ~30%)."""
    return min(50, max(5, round(rng.lognormvariate(math.log(15.0), 0.5))))


def _sentence(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.14:
        return _question(rng)
    target = _target_words(rng)
    text = _fact(rng) if roll < 0.22 else _clause(rng)
    words = len(text.split())
    while words < target:
        if rng.random() < 0.3:
            connector, extra = ", because", rng.choice(_REASONS)
        else:
            connector, extra = rng.choice(_CONNECTORS), _clause(rng)
        n = len(extra.split()) + 1
        if words + n > 56:
            break
        text = f"{text}{connector} {extra}"
        words += n
    return text[0].upper() + text[1:] + "."


def stream(seed: int = 0) -> Iterator[str]:
    """An endless, deterministic stream of sentences."""
    rng = random.Random(seed)
    while True:
        yield _sentence(rng)


def sentences(n: int, seed: int = 0) -> list[str]:
    """The first ``n`` sentences of ``stream(seed)``."""
    if n < 0:
        raise ValueError("n must be >= 0")
    return list(itertools.islice(stream(seed), n))


def batched(texts: Iterable[str], size: int) -> Iterator[list[str]]:
    """Consecutive lists of ``size`` texts (the last may be shorter)."""
    if size < 1:
        raise ValueError("size must be >= 1")
    it = iter(texts)
    while batch := list(itertools.islice(it, size)):
        yield batch
