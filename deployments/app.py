"""The app builder: serve_config.yaml ``args`` -> typed settings -> bound deployments."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import ray
from ray.serve import Application

from blitz.settings.config import BlitzSettings, IngressSettings, PoolSettings
from blitz.settings.sizing import NodeShape
from deployments.batches import BatchRunnerDeployment
from deployments.ingress import Ingress, IngressWithCpuPool
from deployments.pool import ModelPool
from deployments.ray_token import keep_ray_token_private
from deployments.serve_options import deployment_options

logger = logging.getLogger("ray.serve")


# Serve's fast request path: both set in the environment of the process that starts Ray.
FAST_PATH_ENV = ("RAY_SERVE_THROUGHPUT_OPTIMIZED", "RAY_SERVE_ENABLE_HA_PROXY")
FAST_PATH_WARNING = (
    "blitz: Ray runs without Serve's fast request path ({missing} unset), so HTTP goes "
    "through Serve's default Python proxy: without HAProxy the node serves fewer "
    "single-text requests/s at more CPU per request (BENCHMARKS.md, \"Entry points\", "
    "measures the cost). "
    "Fix: give the config serve_config.yaml's `controller_options` block (or `source "
    "scripts/fast-path.env.sh` before `ray start`), then start Serve anew")


def cluster_has_gpus() -> bool:
    return ray.is_initialized() and ray.cluster_resources().get("GPU", 0) > 0


def fast_path_warning(environ: Mapping[str, str]) -> str | None:
    """The WARNING for an app whose Ray runs Serve's default proxy, or None. Replicas and
    this builder inherit the environment Ray was started with."""
    missing = [name for name in FAST_PATH_ENV if environ.get(name, "0") in ("", "0")]
    if not missing:
        return None
    return FAST_PATH_WARNING.format(missing=" and ".join(missing))


def _alive_nodes() -> int:
    return sum(1 for n in ray.nodes() if n.get("Alive")) if ray.is_initialized() else 1


def node_shape() -> NodeShape:
    """The node replicas are sized for: the alive node with the most CPUs Ray offers (a
    replica runs on one node), with its GPUs; this machine when Ray is not running."""
    if not ray.is_initialized():
        return NodeShape.local()
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    if not nodes:
        return NodeShape.local()
    largest = max(nodes, key=lambda r: (r.get("CPU", 0), r.get("GPU", 0)))
    return NodeShape(cpus=max(1, int(largest.get("CPU", 0))), gpus=int(largest.get("GPU", 0)))


def batch_storage_warning(settings: BlitzSettings, nodes: int) -> str | None:
    """The WARNING for a batch API kept in a local folder on a cluster of several nodes:
    the ingress that takes an upload and the runner and actors that read it may each be
    on another node's disk. None when it is off, shared (a URI) or one node."""
    if not settings.batches.enabled or nodes < 2:
        return None
    storage = settings.batches.storage
    if storage is not None and "://" in storage:
        return None
    return (f"blitz: batches.storage is a local folder ({storage or 'the default, in '}"
            f"{'' if storage else 'cache_dir'}) on a cluster of {nodes} nodes: uploads and "
            "batches land on whichever node's disk takes them, and the runner may not find "
            "them. Set batches.storage to an object store prefix (s3://bucket/blitz-batches) "
            "or a folder every node shares (docs/batches.md, \"Storage\")")


def _pool_options(pool: str, settings: PoolSettings) -> dict[str, Any]:
    """The Serve options of pool ``pool`` ("cpu" or "gpu"); a WARNING when it claims fewer
    CPUs than its model calls use."""
    problem = settings.cpu_claim_problem(f"{pool}_pool")
    if problem:
        logger.warning("blitz: %s", problem)
    return deployment_options(f"{pool}_pool", f"{pool.upper()}Pool", settings.deployment)


def _ingress_options(ingress: IngressSettings) -> dict[str, Any]:
    return deployment_options("ingress", "Ingress", ingress.deployment)


def surge_fits(options: dict[str, Any], available: dict[str, float]) -> bool:
    """Whether the extra replicas ``options`` start during a redeploy (``max_surge_percent``
    of its replicas, rounded up, as Serve counts them) fit in ``available`` resources."""
    percent = options.get("max_surge_percent", 0)
    if percent <= 0:
        return True
    scaling = options.get("autoscaling_config") or {}
    replicas = options.get("num_replicas") or max(scaling.get("initial_replicas") or 0,
                                                  scaling.get("min_replicas", 1), 1)
    surge = (percent * replicas + 99) // 100
    actor = options.get("ray_actor_options", {})
    needs = {"CPU": actor.get("num_cpus", 0), "GPU": actor.get("num_gpus", 0),
             **actor.get("resources", {})}
    return all(surge * amount <= available.get(name, 0.0) + 1e-9
               for name, amount in needs.items() if amount)


def fit_surge(options: dict[str, Any], available: dict[str, float]) -> dict[str, Any]:
    """``options``, with ``max_surge_percent`` 0 (replace in place) when its surge replicas
    do not fit the cluster's free resources now. A redeploy on a full cluster would otherwise
    wait for room forever, the old config still serving; replaced in place, its requests
    wait for the new replica instead (or get 503 + Retry-After)."""
    if surge_fits(options, available):
        return options
    logger.warning(
        "blitz: no room in the cluster for %s's extra replicas during a redeploy (%d%% surge; "
        "free now: %s): it is replaced in place, so its requests wait for the new replica. "
        "Free resources (or lower max_surge_percent) to keep the old replica serving "
        "meanwhile", options["name"], options["max_surge_percent"],
        {k: round(v, 2) for k, v in sorted(available.items())  # not Ray's own bookkeeping
         if k in ("CPU", "GPU") or not (k.startswith(("node:", "memory", "object_store"))
                                        or "_group_" in k)})
    return {**options, "max_surge_percent": 0}


def _available_resources() -> dict[str, float]:
    return dict(ray.available_resources()) if ray.is_initialized() else {}


def build_app(args: dict[str, Any] | None = None) -> Application:
    """Bind the ingress, the CPU pool and, when the cluster has GPUs (or ``gpu: on``), the
    GPU pool. A pool asking for a GPU on a cluster without one would wait forever, so
    ``gpu: auto`` binds it only when ``ray.cluster_resources()`` lists GPUs."""
    keep_ray_token_private()  # `serve run` on a fresh machine: Ray made it 0644
    node = node_shape()
    settings = BlitzSettings.from_args(args, node=node)
    warning = fast_path_warning(os.environ)
    if warning:
        logger.warning(warning)
    storage_warning = batch_storage_warning(settings, _alive_nodes())
    if storage_warning:
        logger.warning(storage_warning)
    if settings.sizing is not None:
        logger.info("blitz: sized for a node of %d CPU(s) and %d GPU(s) (auto settings): %s",
                    node.cpus, node.gpus, settings.sizing.describe())
    # every block is checked against Serve's schema, bound or not
    options = {"cpu": _pool_options("cpu", settings.cpu_pool),
               "gpu": _pool_options("gpu", settings.gpu_pool),
               "ingress": _ingress_options(settings.ingress),
               "batches": deployment_options("batches", "BatchRunner",
                                             settings.batches.deployment)}
    plain = settings.model_dump(mode="json")
    use_gpu = settings.gpu == "on" or (settings.gpu == "auto" and cluster_has_gpus())
    free = _available_resources()  # on a redeploy, the old replicas hold theirs
    # mypy keeps a class's own type under a class decorator: these are Deployments
    gpu_pool = (ModelPool.options(  # type: ignore[attr-defined]
        **fit_surge(options["gpu"], free)).bind(plain, "gpu") if use_gpu else None)
    # the batch runner, bound where the batch API is on: handed to the ingress so it is in
    # the app (it calls the ingress by name: deployments/batches.py)
    runner = (BatchRunnerDeployment.options(  # type: ignore[attr-defined]
        **fit_surge(options["batches"], free)).bind(plain, options["ingress"]["name"])
        if settings.batches.enabled else None)
    in_process = settings.ingress.cpu_pool == "in_process"
    logger.info("blitz: %d model(s), CPU pool %s, GPU pool %s", len(settings.models),
                "in the ingress" if in_process else "in replicas of its own",
                "bound" if use_gpu else "not bound")
    if in_process:
        ingress = with_cpu_claim(options["ingress"], settings.cpu_pool)
        return IngressWithCpuPool.options(**fit_surge(ingress, free)).bind(  # type: ignore[attr-defined]
            plain, gpu_pool, runner)
    cpu_pool = ModelPool.options(  # type: ignore[attr-defined]
        **fit_surge(options["cpu"], free)).bind(plain, "cpu")
    return Ingress.options(**fit_surge(options["ingress"], free)).bind(  # type: ignore[attr-defined]
        plain, cpu_pool, gpu_pool, runner)


def with_cpu_claim(ingress: dict[str, Any], cpu_pool: PoolSettings) -> dict[str, Any]:
    """The ingress's Serve options when the CPU pool runs inside it: the CPUs it claims
    itself plus the CPU pool's claim, under the ingress's deployment name."""
    actor = dict(ingress.get("ray_actor_options") or {})
    actor["num_cpus"] = float(actor.get("num_cpus", 0)) + cpu_pool.num_cpus
    return {**ingress, "ray_actor_options": actor}

app = build_app  # `serve run deployments.app:build_app` and serve_config.yaml both work
