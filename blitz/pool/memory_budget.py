"""What a model needs in its pool's memory, the token budget that memory allows, and which
resident models a new one evicts: pure arithmetic, no Ray. docs/models.md, "Token budgets
and memory", has the rule, the measurements it was fitted to, and the decisions.

- **Weights**: the loaded model's parameters and buffers (``Encoder.weight_bytes``), or
  before it loads, a parameter count from its shape (``blitz.loading.facts.ModelShape``,
  read from its ``config.json``) times the bytes of the dtype it runs in.
- **Activations** of one model call of ``T`` tokens in rows of ``L``:
  ``T x (MARGIN x bytes x (2 x hidden + 4 x intermediate) + MASK_BYTES x L)``. Inference
  frees each layer's tensors before the next, so the peak is one layer's (the MLP's
  intermediate tensors dominate) and does not grow with depth; ``MASK_BYTES x L`` is the
  L x L attention mask transformers builds for every row on the load path (sentence-
  transformers passes a padding mask), whatever the model's size. Measured on CPU (fp32,
  peak RSS) and an H200 (bf16, ``max_memory_allocated``); ``MARGIN`` covers the allocator.
- **A model's bytes**: weights + ``workers`` x the activations of its largest call (each
  worker thread can run one at once); a pool needs the sum of its models' weights plus
  ``workers`` x the largest of their activations.
- **max_batch_tokens**: the model's setting, else the pool's, else the cap (512 on a CPU:
  measured fastest there; 65,536 on a GPU: within 1% of the throughput of 262,144),
  lowered so that ``workers`` calls take at most ``SHARE`` of what the model's weights
  leave of the budget, so that other models fit beside it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blitz.encoders.st_models import CPU_TOKEN_BUDGET, GPU_TOKEN_BUDGET
from blitz.errors import ModelTooLarge, Unavailable
from blitz.loading.facts import ModelShape
from blitz.settings.pool_settings import PoolSettings
from blitz.settings.registry import ModelSpec

logger = logging.getLogger("blitz.pool")
MEMORY_POLL_S = 0.05  # how often a load waiting for evicted models' memory looks again
MARGIN = 1.25  # measured peaks reached 1.22 x the rule's bytes (CPU, 4 layers)
MASK_BYTES = 44  # per token per position of its row: the masks (40.0-40.3 measured, +10%)
SHARE = 0.5  # of what the weights leave: the most one model's calls take by default
CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"),
                 Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))


def dtype_bytes(spec: ModelSpec, device: str) -> tuple[int, int]:
    """Bytes of one weight and of one activation value as ``spec`` runs on ``device``."""
    if device.startswith("cuda"):
        size = 4 if spec.gpu_dtype == "float32" else 2
        return size, size
    if spec.cpu_backend == "torch-bf16":
        return 2, 2
    return (1 if spec.cpu_backend == "onnx-int8" else 4), 4


def activation_bytes_per_token(hidden: int, intermediate: int, value_bytes: int,
                               row_length: int) -> int:
    """The rule (module docstring), per token of a call whose rows are ``row_length``."""
    return int(MARGIN * value_bytes * (2 * hidden + 4 * intermediate)
               + MASK_BYTES * row_length)


@dataclass(frozen=True)
class Footprint:
    """One model's bytes in a pool replica: its weights, and its largest call."""

    model_id: str
    weights: int
    per_token: int  # activation bytes per token of its largest call (0: not known)
    max_batch_tokens: int  # tokens (padding included) in one of its calls
    call_tokens: int  # tokens of its largest call: max_batch_tokens, or one longest row

    @property
    def activations(self) -> int:
        return self.per_token * self.call_tokens


def needed_bytes(footprints: list[Footprint], workers: int) -> int:
    """What models need together: their weights, and ``workers`` calls of the largest."""
    return (sum(f.weights for f in footprints)
            + workers * max((f.activations for f in footprints), default=0))


def size_model(spec: ModelSpec, pool: PoolSettings, device: str, budget: int | None,
               shape: ModelShape | None, *, weights: int | None = None,
               max_seq_length: int | None = None) -> Footprint:
    """``spec``'s footprint and effective ``max_batch_tokens`` on ``pool`` (``device``,
    ``budget`` bytes, None: unbounded). ``weights`` and ``max_seq_length`` are the loaded
    model's where known; else estimated from ``shape`` (None: unknown, counted as 0)."""
    weight_size, value_size = dtype_bytes(spec, device)
    if weights is None:
        weights = shape.parameters * weight_size if shape is not None else 0
    longest = max_seq_length or spec.max_seq_length or (shape.max_positions if shape else 512)
    on_gpu = device.startswith("cuda")
    tokens = spec.max_batch_tokens or pool.max_batch_tokens or (
        GPU_TOKEN_BUDGET if on_gpu else CPU_TOKEN_BUDGET)
    per_token = 0
    if shape is not None:
        per_token = activation_bytes_per_token(shape.hidden, shape.intermediate, value_size,
                                               min(longest, tokens))
        if budget is not None:
            room = SHARE * (budget - weights) / (pool.worker_count * per_token)
            tokens = max(1, min(tokens, int(room)))
    return Footprint(spec.id, weights, per_token, tokens, max(tokens, longest))


def evictions(resident: list[Footprint], evictable: list[str], new: Footprint,
              budget: int | None, workers: int) -> int:
    """How many of ``evictable`` (model ids, least recently used first) to evict so that
    ``new`` fits beside what stays of ``resident`` (every model in memory, evicted ones a
    call still holds included). May be more than can go: the caller waits for held ones.
    Raises ``ModelTooLarge`` when ``new`` cannot fit even alone."""
    if budget is None:
        return 0
    alone = needed_bytes([new], workers)
    if alone > budget:  # the resident models go to the log, not to the client
        others = ", ".join(f"{f.model_id} {gib(needed_bytes([f], workers))}" for f in resident)
        logger.warning("model %r needs %s, over the pool's memory budget of %s (resident "
                       "now: %s)", new.model_id, gib(alone), gib(budget), others or "none")
        raise ModelTooLarge(
            f"model {new.model_id!r} needs {gib(alone)} (weights {gib(new.weights)} + "
            f"{workers} call(s) of {new.call_tokens} tokens at {gib(new.activations)} each) "
            f"but its pool's memory budget is {gib(budget)}; lower its max_batch_tokens or "
            "max_seq_length, or raise memory_bytes", param="model")
    staying = list(resident)
    for count, model_id in enumerate(evictable):
        if needed_bytes([*staying, new], workers) <= budget:
            return count
        staying = _without(staying, model_id)
    return len(evictable)


async def make_room(resident: list[Footprint], new: Footprint, budget: int | None,
                    workers: int, evictable: list[str],
                    evict: Callable[[], Awaitable[None]] | None, wait_s: float) -> None:
    """Evict least recently used models (``evict``: one each call, of ``evictable``)
    until ``new`` fits ``budget`` beside ``resident`` (a live list: a call that still holds
    an evicted model keeps its footprint there until it ends), then wait ``wait_s`` at most
    for those calls: their memory is freed only then. ``ModelTooLarge`` if ``new`` cannot
    fit alone (nothing evicted)."""
    for _ in range(evictions(list(resident), evictable, new, budget, workers)):
        if evict is not None:
            await evict()
    deadline = time.monotonic() + wait_s
    while budget is not None and needed_bytes([*resident, new], workers) > budget:
        if time.monotonic() > deadline:
            raise Unavailable(f"model {new.model_id!r} is waiting for memory that calls "
                              "on evicted models still hold; retry shortly")
        await asyncio.sleep(MEMORY_POLL_S)


def _without(footprints: list[Footprint], model_id: str) -> list[Footprint]:
    out, dropped = [], False
    for f in footprints:
        if f.model_id == model_id and not dropped:
            dropped = True
            continue
        out.append(f)
    return out


def gib(size: int) -> str:
    return f"{size / 2 ** 30:.2f} GiB"


# ---- the budget ------------------------------------------------------------------------


def device_memory_bytes(device: str, cuda: Any = None) -> int:
    """The memory of ``device``: a CUDA device's total (``cuda``: the ``torch.cuda``
    module, or a stand-in for tests), else this machine's or container's."""
    if device.startswith("cuda"):
        if cuda is None:
            import torch

            cuda = torch.cuda
        index = int(device.partition(":")[2] or 0)
        return int(cuda.get_device_properties(index).total_memory)
    return host_memory_bytes()


def host_memory_bytes(limits: tuple[Path, ...] = CGROUP_LIMITS) -> int:
    """Physical memory, or the container's cgroup limit where that is lower."""
    size = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in limits:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            size = min(size, int(text))
    return size


def pool_budget(pool: PoolSettings, device: str, cpu_replicas: int = 1,
                cuda: Any = None) -> int:
    """A replica's memory budget: ``memory_bytes``; else on a GPU its memory x
    ``memory_fraction``; on a CPU the replica's Ray ``memory`` claim, else the machine's
    memory x ``memory_fraction`` shared by the ``cpu_replicas`` sized for the node."""
    if pool.memory_bytes is not None:
        return pool.memory_bytes
    if device.startswith("cuda"):
        return int(device_memory_bytes(device, cuda) * pool.memory_fraction)
    claim = pool.deployment.get("ray_actor_options", {}).get("memory")
    if claim:
        return int(claim)
    return int(host_memory_bytes() * pool.memory_fraction / max(1, cpu_replicas))
