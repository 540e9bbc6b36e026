"""The texts and the measure of the same-vector tests (tests/unit and tests/integration
``test_same_vector.py``): eight texts of mixed lengths, 56 others to bury them in."""

from __future__ import annotations

import numpy as np

TEXTS = ["a cat", "the quarterly results beat every analyst's estimate by a wide margin",
         "rain", "how do I reset my password if I no longer have the phone number on file",
         "Blitz", "une phrase en français, pour changer", "42", "the end of the list"]
OTHERS = [("padding " * (i % 23 + 1)).strip() + f" filler {i}" for i in range(56)]


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.min(np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1)
                                                  * np.linalg.norm(b, axis=1))))
