"""The app builder: serve_config.yaml ``args`` -> typed settings -> bound deployments."""

from __future__ import annotations

import logging
from typing import Any

import ray
from ray.serve import Application

from blitz.config import BlitzSettings, IngressSettings, PoolSettings
from deployments.ingress import Ingress
from deployments.pool import ModelPool

logger = logging.getLogger("ray.serve")


def cluster_has_gpus() -> bool:
    return ray.is_initialized() and ray.cluster_resources().get("GPU", 0) > 0


def _pool_options(name: str, pool: PoolSettings) -> dict[str, Any]:
    autoscaling = {"min_replicas": pool.min_replicas, "max_replicas": pool.max_replicas,
                   "target_ongoing_requests": pool.target_ongoing_requests,
                   "upscale_delay_s": pool.upscale_delay_s,
                   "downscale_delay_s": pool.downscale_delay_s,
                   "downscale_to_zero_delay_s": pool.downscale_to_zero_delay_s,
                   "look_back_period_s": pool.look_back_period_s}
    if pool.initial_replicas is not None:
        autoscaling["initial_replicas"] = pool.initial_replicas
    actor: dict[str, Any] = {"num_cpus": pool.num_cpus}
    if pool.num_gpus:
        actor["num_gpus"] = pool.num_gpus
    if pool.resources:
        actor["resources"] = pool.resources
    return {"name": name, "ray_actor_options": actor, "autoscaling_config": autoscaling,
            "max_ongoing_requests": pool.max_ongoing_requests,
            "max_queued_requests": pool.max_queued_requests,
            "graceful_shutdown_timeout_s": pool.graceful_shutdown_timeout_s,
            "graceful_shutdown_wait_loop_s": pool.graceful_shutdown_wait_loop_s,
            "max_surge_percent": pool.max_surge_percent}


def _ingress_options(ingress: IngressSettings) -> dict[str, Any]:
    actor: dict[str, Any] = {"num_cpus": ingress.num_cpus}
    if ingress.resources:
        actor["resources"] = ingress.resources
    return {"name": "Ingress", "num_replicas": ingress.num_replicas,
            "ray_actor_options": actor,
            "max_ongoing_requests": ingress.max_ongoing_requests,
            "max_queued_requests": ingress.max_queued_requests,
            "graceful_shutdown_timeout_s": ingress.graceful_shutdown_timeout_s,
            "graceful_shutdown_wait_loop_s": ingress.graceful_shutdown_wait_loop_s,
            "max_surge_percent": ingress.max_surge_percent}


def build_app(args: dict[str, Any] | None = None) -> Application:
    """Bind the ingress, the CPU pool and, when the cluster has GPUs (or ``gpu: on``), the
    GPU pool. A pool asking for a GPU on a cluster without one would wait forever, so
    ``gpu: auto`` binds it only when ``ray.cluster_resources()`` lists GPUs."""
    settings = BlitzSettings.from_args(args)
    plain = settings.model_dump(mode="json")
    use_gpu = settings.gpu == "on" or (settings.gpu == "auto" and cluster_has_gpus())
    cpu_pool = ModelPool.options(**_pool_options("CPUPool", settings.cpu_pool)).bind(plain, "cpu")
    gpu_pool = (ModelPool.options(**_pool_options("GPUPool", settings.gpu_pool)).bind(plain, "gpu")
                if use_gpu else None)
    logger.info("blitz: %d model(s), GPU pool %s", len(settings.models),
                "bound" if use_gpu else "not bound")
    return Ingress.options(**_ingress_options(settings.ingress)).bind(plain, cpu_pool, gpu_pool)


app = build_app  # `serve run deployments.app:build_app` and serve_config.yaml both work
