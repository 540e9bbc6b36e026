"""Routing policy (SPEC §3): request facts in, pool name out. Pure; tested as a table."""

from __future__ import annotations

from collections.abc import Collection
from typing import Literal

from blitz.config import RoutingSettings

Pool = Literal["cpu", "gpu"]


def choose_pool(kind: str, n_items: int, pools: Collection[str],
                policy: RoutingSettings) -> Pool:
    """The pool for a request of ``n_items`` texts (or rerank pairs) on a model of ``kind``.

    - no GPU pool -> cpu;
    - cross-encoders -> ``policy.cross_encoder_pool`` (gpu by default), whatever the size;
    - fewer than ``policy.gpu_min_batch`` texts -> cpu;
    - everything else -> gpu.
    """
    if "gpu" not in pools:
        return "cpu"
    if kind == "cross-encoder":
        return policy.cross_encoder_pool
    if n_items < policy.gpu_min_batch:
        return "cpu"
    return "gpu"
