"""Routing policy (docs/operations.md, "Routing and cold GPU pools"): request facts in,
pool and reason out. Pure; tested as a table."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal, get_args

from blitz.settings.config import RoutingSettings
from blitz.settings.kinds import kind_of

Pool = Literal["cpu", "gpu"]
Reason = Literal["no_gpu", "small", "size", "kind", "cold_gpu"]
"""Why a pool was chosen; the ``reason`` label of the route-decision metric (a closed set)."""
REASONS: tuple[Reason, ...] = get_args(Reason)


@dataclass(frozen=True, slots=True)
class Route:
    pool: Pool
    reason: Reason


def choose_pool(kind: str, n_items: int, pools: Collection[str], running: Collection[str],
                policy: RoutingSettings, images: bool = False) -> Route:
    """The pool for a request of ``n_items`` texts (or rerank pairs, or ``images``) on a
    model of ``kind``.

    ``pools`` are the pools that exist; ``running`` those with at least one running
    replica now (a pool scaled to zero is in ``pools`` but not in ``running``).

    - no GPU pool -> cpu (``no_gpu``);
    - cross-encoders and LLM rerankers -> ``policy.cross_encoder_pool`` (gpu by default), whatever the size
      (``kind``); embedding, sparse and classifier models go by size, as below;
    - fewer than ``policy.gpu_min_batch`` texts (``gpu_min_images`` images) -> cpu
      (``small``);
    - everything else -> gpu (``size``);
    - but a request bound for a GPU pool with no running replica goes to the CPU pool
      when ``policy.cold_gpu`` is ``"cpu"`` (``cold_gpu``): it does not wait for a cold
      start. The caller wakes the GPU pool so that the next ones find it running.
    """
    if "gpu" not in pools:
        return Route("cpu", "no_gpu")
    if kind_of(kind).reranks_only:
        route = Route(policy.cross_encoder_pool, "kind")
    elif n_items < (policy.gpu_min_images if images else policy.gpu_min_batch):
        return Route("cpu", "small")
    else:
        route = Route("gpu", "size")
    if route.pool == "gpu" and "gpu" not in running and policy.cold_gpu == "cpu":
        return Route("cpu", "cold_gpu")
    return route
