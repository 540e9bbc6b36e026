"""One replica pool's settings (bound once as the CPU pool, once as the GPU pool), and
the base every settings section shares."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from blitz.settings.deployment_options import (
    AUTOSCALING_METRICS_PUSH_S,
    POOL_DEPLOYMENT,
    merge_options,
)
from blitz.settings.sizing import AUTO

MAX_MODELS_PER_REPLICA = 3  # models one pool replica holds at most (Serve multiplexing,
# LRU); memory evicts sooner where the models' bytes do not fit (blitz.pool.memory_budget)


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PoolSettings(_Settings):
    """One replica pool (bound once as the CPU pool, once as the GPU pool)."""

    max_batch_size: int = Field(128, ge=1, description="texts per model call")
    max_queued_texts: int = Field(
        4096, ge=1, description="texts waiting per model on a replica; past it: 503")
    priority_aging_s: float = Field(
        5.0, gt=0, description="a request waiting this long in a queue of this pool (the "
        "ingress's in front of it, or a replica's) moves up one priority: low competes as "
        "normal after it, as high after twice it, so bulk work is never starved "
        "(docs/operations.md, \"Priorities: interactive ahead of bulk\")")
    call_timeout_s: float = Field(
        60.0, gt=0, description="one model call (a batch), and the longest it waits for a "
        "free worker; past it its requests get 503. A replica whose workers are all stuck "
        "in calls longer than this refuses new work (503) and reports itself unhealthy, "
        "so Serve replaces it")
    load_timeout_s: float = Field(
        600.0, gt=0, description="one model load (download, ONNX build or cpu_backend auto "
        "measurement in a child process, warmup; a first ONNX build takes ~30-60 s); past "
        "it its requests get 424 (remembered for load_failure_ttl_s), its child process is "
        "killed, and a load thread still running reports the replica unhealthy. Loads "
        "run one at a time, so those queued behind it get 503")
    load_failure_ttl_s: float = Field(
        30.0, ge=0, description="a failed model load is answered 424 at once this long")
    torch_threads: int | None = Field(
        None, ge=1, description="intra-op threads of one model call (torch and onnxruntime); "
        "unset: torch's own default. A replica uses up to torch_threads x workers cores")
    workers: int | Literal["auto"] = Field(
        "auto", description="model calls a replica runs at once, each on a worker "
        "thread of its own (1-16): on a CPU, 1-thread calls side by side serve more texts/s "
        "than one call on all the threads (docs/benchmarks-history.md, \"Round four\"). "
        "`auto`: sized from the node's cores (docs/operations.md, \"Scaling\"): on 2 cores "
        "the CPU pool runs 2, a GPU pool 2")
    sparse_token_budget: int = Field(
        8192, ge=1, description="tokens (padding included) in one model call of a sparse "
        "model, which holds tokens x vocabulary logits: 8192 x BERT's 30,522 is 0.5 GiB in "
        "fp16 (other models: max_batch_tokens)")
    max_batch_tokens: int | None = Field(
        None, ge=1, description="tokens (padding included) in one model call, TEI's "
        "`--max-batch-tokens`, for every model on this pool that sets none of its own; "
        "either is capped by what the pool's memory allows. Unset: derived per model from "
        "its size and the memory (docs/models.md, \"Token budgets and memory\"): 512 on "
        "a CPU, up to 65,536 on a GPU")
    memory_bytes: int | None = Field(
        None, ge=1, description="bytes the models of one replica may use, weights plus the "
        "activations of each model's largest batch (x workers); models are evicted least "
        "recently used first until a new one fits, and one that cannot fit alone is refused "
        "(507, naming the sizes). Unset: the GPU's memory x memory_fraction; on a CPU the "
        "replica's `ray_actor_options.memory` claim, else the container's or machine's "
        "memory x memory_fraction / the CPU replicas sized for the node")
    memory_fraction: float = Field(
        0.9, gt=0, le=1, description="the share of the device's memory an unset "
        "memory_bytes stands for (the rest: the CUDA context, the runtime, the allocator)")
    preload: list[str] = Field(
        default_factory=list,
        description="model ids each replica loads before it takes traffic (Serve starts "
        "routing to it, and /ready answers, only after); at most "
        f"{MAX_MODELS_PER_REPLICA}, the models a replica holds")
    deployment: dict[str, Any] = Field(
        default_factory=dict, description="Ray Serve deployment options, in Serve's own "
        "names and nesting (`autoscaling_config`, `ray_actor_options`, "
        "`max_ongoing_requests`, `max_queued_requests`, `graceful_shutdown_timeout_s`, "
        "`max_surge_percent`, ...), merged over Blitz's defaults (below) and handed to "
        "Serve; a key Serve does not know fails the deploy, naming it")

    @model_validator(mode="before")
    @classmethod
    def _deployment_defaults(cls, value: Any) -> Any:
        if isinstance(value, dict):
            value = {**value, "deployment": merge_options(POOL_DEPLOYMENT,
                                                          value.get("deployment") or {})}
        return value

    @model_validator(mode="after")
    def _check(self) -> PoolSettings:
        if isinstance(self.workers, int) and not 1 <= self.workers <= 16:
            raise ValueError("workers must be from 1 to 16, or auto")
        self.deployment.setdefault("ray_actor_options", {})
        if self.workers != AUTO:
            self.claim_default()
        look_back = self.deployment.get("autoscaling_config", {}).get("look_back_period_s")
        if look_back is not None and look_back <= AUTOSCALING_METRICS_PUSH_S:
            raise ValueError(f"autoscaling_config.look_back_period_s must be over Ray's "
                             f"{AUTOSCALING_METRICS_PUSH_S:g} s metrics push interval")
        if self.max_queued_texts < self.max_batch_size:
            raise ValueError("max_queued_texts must be at least max_batch_size")
        if len(set(self.preload)) != len(self.preload):
            raise ValueError("preload lists a model twice")
        if len(self.preload) > MAX_MODELS_PER_REPLICA:
            raise ValueError(f"preload lists {len(self.preload)} models; a replica holds at "
                             f"most {MAX_MODELS_PER_REPLICA}, so the last loads would evict "
                             "the first")
        return self

    def claim_default(self) -> None:
        """Claim workers x torch_threads CPUs unless the config says how many."""
        self.deployment["ray_actor_options"].setdefault("num_cpus", self.cpus_used)

    @property
    def worker_count(self) -> int:
        """``workers`` once sized (``BlitzSettings`` replaces ``auto``)."""
        if not isinstance(self.workers, int):
            raise ValueError("workers is still auto: size the settings first")
        return self.workers

    @property
    def cpus_used(self) -> int:
        """Cores a replica's model calls use at once: workers x torch_threads."""
        return self.worker_count * (self.torch_threads or 1)

    @property
    def num_cpus(self) -> float:
        return float(self.deployment["ray_actor_options"].get("num_cpus", 1))

    @property
    def num_gpus(self) -> float:
        return float(self.deployment["ray_actor_options"].get("num_gpus", 0))

    @property
    def min_replicas(self) -> int:
        return _replicas(self.deployment, "min_replicas")

    @property
    def max_replicas(self) -> int:
        return _replicas(self.deployment, "max_replicas")

    def cpu_claim_problem(self, section: str) -> str | None:
        """Why this pool's CPU claim is below what its model calls use, if it is (a pool
        with a GPU runs its calls there, so its claim may be a fraction)."""
        if self.num_gpus or self.num_cpus >= self.cpus_used:
            return None
        return (f"{section} claims num_cpus {self.num_cpus:g} but runs workers "
                f"{self.workers} x torch_threads {self.torch_threads or 1} = "
                f"{self.cpus_used} cores at once: Ray will pack it with other work on "
                f"those cores. Leave {section}.deployment.ray_actor_options.num_cpus out "
                "(it then claims workers x torch_threads), or lower workers or torch_threads")


def _replicas(deployment: dict[str, Any], bound: str) -> int:
    """A replica bound: the autoscaling one, else the fixed ``num_replicas``."""
    if "autoscaling_config" in deployment:
        return int(deployment["autoscaling_config"].get(bound, 1))
    fixed = deployment.get("num_replicas", 1)
    return fixed if isinstance(fixed, int) else 1
