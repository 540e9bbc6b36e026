"""Ray Serve's own deployment options, as Blitz passes them through: Blitz's default for
each deployment, why it is what it is, and the merge of a config's ``deployment:`` over it.

Plain dicts in Serve's names and nesting (``autoscaling_config``, ``ray_actor_options``,
...): ``deployments/serve_options.py`` checks them against Serve's schema (``blitz/``
never imports Ray).
"""

from __future__ import annotations

import copy
import logging
from typing import Any

logger = logging.getLogger("blitz.config")

# Serve deployment options (Serve's own names and nesting) Blitz starts each deployment
# from; a section's `deployment:` is merged over them, dict by dict, and handed to
# `.options()` as it is. deployments/serve_options.py checks it against Serve's schema.
POOL_DEPLOYMENT: dict[str, Any] = {
    "autoscaling_config": {
        "min_replicas": 1, "max_replicas": 1, "target_ongoing_requests": 8,
        "upscale_delay_s": 5, "downscale_delay_s": 300, "downscale_to_zero_delay_s": 300,
        "look_back_period_s": 30},
    "ray_actor_options": {},  # num_cpus: workers x torch_threads unless given
    "max_ongoing_requests": 128, "max_queued_requests": 256,
    "graceful_shutdown_timeout_s": 60, "graceful_shutdown_wait_loop_s": 0.5,
    "max_surge_percent": 0, "logging_config": {"enable_access_log": False},
    "health_check_period_s": 2}
INGRESS_DEPLOYMENT: dict[str, Any] = {
    "num_replicas": "auto", "ray_actor_options": {"num_cpus": 0.5},
    "max_ongoing_requests": 256, "max_queued_requests": 1024,
    "graceful_shutdown_timeout_s": 130, "graceful_shutdown_wait_loop_s": 0.5,
    "max_surge_percent": 100, "health_check_period_s": 2}
# Why Blitz's defaults are what they are (docs/configuration.md's settings tables show
# these beside them).
DEPLOYMENT_NOTES: dict[str, str] = {
    "num_replicas": "fixed replicas (replaces `autoscaling_config`); `auto`: sized from "
    "the node's cores when the app is built (docs/operations.md, \"Scaling\")",
    "autoscaling_config.min_replicas": "fewest replicas; 0: none while idle (a request "
    "wakes one)",
    "autoscaling_config.max_replicas": "most replicas; the ingress sizes its pool-call "
    "queues (calls in flight) from it",
    "ray_actor_options.num_gpus": "GPUs each replica claims",
    "max_ongoing_requests": "calls one replica takes at once (the rest queue at the caller)",
    "graceful_shutdown_wait_loop_s": "how often a stopping replica checks whether its work "
    "is done",
    "autoscaling_config.target_ongoing_requests": "pool calls in flight per replica the "
    "autoscaler aims for",
    "autoscaling_config.upscale_delay_s": "load above target this long before a replica is "
    "added",
    "autoscaling_config.downscale_delay_s": "load below target this long before a replica is "
    "removed (down to one)",
    "autoscaling_config.downscale_to_zero_delay_s": "with min_replicas 0: idle this long "
    "before the last replica stops",
    "autoscaling_config.look_back_period_s": "window the load is averaged over; longer than "
    "Ray's 10 s metrics push interval",
    "ray_actor_options.num_cpus": "CPUs each replica claims; a CPU pool claims workers x "
    "torch_threads (1 per worker when torch_threads is unset) unless given, and a lower "
    "claim logs a WARNING",
    "max_queued_requests": "-1: unbounded",
    "health_check_period_s": "how often Serve checks a replica: a killed replica is "
    "noticed (and replaced) within about this long; Serve's default is 10 s",
    "logging_config.enable_access_log": "a line per call in the replica's log; off for the "
    "pools (the ingress logs each HTTP request), saving ~0.1 CPU-ms per pool call",
    "graceful_shutdown_timeout_s": "a stopping replica (scale-down, redeploy, shutdown) "
    "finishes the work it holds for at most this long, then is killed: pools a whole "
    "call_timeout_s, the ingress past pool_timeout_s",
    "max_surge_percent": "extra replicas started during a redeploy so old ones serve until "
    "the new ones are ready; needs room in the cluster (0: stop, then start)",
}
# Ray Serve 2.60 pushes autoscaling metrics every 10 s (AutoscalingConfig's deprecated
# metrics_interval_s); a look-back window must be longer than that.
AUTOSCALING_METRICS_PUSH_S = 10.0
# The old flat spelling of Serve's options -> where each lives in `deployment:`.
_AUTOSCALING = ("min_replicas", "max_replicas", "initial_replicas", "target_ongoing_requests",
                "upscale_delay_s", "downscale_delay_s", "downscale_to_zero_delay_s",
                "look_back_period_s")
_TOP = ("max_ongoing_requests", "max_queued_requests", "graceful_shutdown_timeout_s",
        "graceful_shutdown_wait_loop_s", "max_surge_percent")
FLAT_POOL_KEYS: dict[str, str | None] = {
    **dict.fromkeys(_AUTOSCALING, "autoscaling_config"), **dict.fromkeys(_TOP),
    **dict.fromkeys(("num_cpus", "num_gpus", "resources"), "ray_actor_options")}
FLAT_INGRESS_KEYS: dict[str, str | None] = {
    **dict.fromkeys((*_TOP, "num_replicas")),
    **dict.fromkeys(("num_cpus", "resources"), "ray_actor_options")}


def merge_options(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` merged over ``base``, dict by dict. Serve takes either a fixed
    ``num_replicas`` or an ``autoscaling_config``: the one ``over`` sets replaces the other."""
    merged = copy.deepcopy(base)
    if over.get("num_replicas") is not None:
        merged.pop("autoscaling_config", None)
    if "autoscaling_config" in over and "num_replicas" not in over:
        merged.pop("num_replicas", None)
    for key, value in over.items():
        merged[key] = (merge_options(merged[key], value)
                       if isinstance(value, dict) and isinstance(merged.get(key), dict)
                       else value)
    return merged


def lift_flat_keys(section: str, value: Any, flat: dict[str, str | None]) -> Any:
    """Old configs spelled Serve's options flat (``cpu_pool.num_cpus``): move them into
    ``deployment`` (what ``deployment`` sets itself wins), with one WARNING per section."""
    if not isinstance(value, dict) or not flat.keys() & value.keys():
        return value
    value = dict(value)
    names = sorted(flat.keys() & value.keys())
    lifted: dict[str, Any] = {}
    for name in names:
        option = value.pop(name)
        if option is None:
            continue
        parent = flat[name]
        (lifted.setdefault(parent, {}) if parent else lifted)[name] = option
    logger.warning("%s: %s now go under %s.deployment, in Ray Serve's own names and "
                   "nesting; write them as deployment: %s (the flat spelling still works, "
                   "for now)", section, ", ".join(names), section, lifted)
    value["deployment"] = merge_options(lifted, value.get("deployment") or {})
    return value


# The CPU pool's own defaults: fixed replicas, as many as the node's cores call for.
CPU_POOL_DEFAULTS: dict[str, Any] = {"deployment": {"num_replicas": "auto"}}
# The GPU pool's own defaults; a partial ``gpu_pool`` in the args keeps those it leaves out.
GPU_POOL_DEFAULTS: dict[str, Any] = {
    "max_batch_size": 1024, "max_queued_texts": 16384, "deployment": {
        "autoscaling_config": {"min_replicas": 0},
        "ray_actor_options": {"num_cpus": 0.5, "num_gpus": 1},
        "max_ongoing_requests": 1024}}


def size_replicas(deployment: dict[str, Any], replicas: int) -> None:
    """``num_replicas: auto`` -> ``replicas``, fixed (``autoscaling_config`` is how a config
    asks for Serve's autoscaling instead)."""
    if deployment.get("num_replicas") == "auto":
        deployment["num_replicas"] = replicas
        deployment.pop("autoscaling_config", None)
