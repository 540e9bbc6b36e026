"""Settings -> Serve deployment options (deployments/app.py), without starting Ray."""

from __future__ import annotations

import logging

from blitz.config import BlitzSettings
from deployments.app import _ingress_options, _pool_options, fit_surge, surge_fits


def test_custom_resources_pin_pools_and_ingress_to_nodes_that_have_them():
    settings = BlitzSettings.from_args({
        "cpu_pool": {"resources": {"head": 0.01}},
        "gpu_pool": {"num_gpus": 1, "resources": {"gpu_node": 1}},
        "ingress": {"resources": {"head": 0.01}},
    })
    cpu = _pool_options("CPUPool", settings.cpu_pool)["ray_actor_options"]
    gpu = _pool_options("GPUPool", settings.gpu_pool)["ray_actor_options"]
    ingress = _ingress_options(settings.ingress)["ray_actor_options"]
    assert cpu == {"num_cpus": 1.0, "resources": {"head": 0.01}}
    assert gpu == {"num_cpus": 0.5, "num_gpus": 1, "resources": {"gpu_node": 1}}
    assert ingress == {"num_cpus": 0.5, "resources": {"head": 0.01}}


def test_no_custom_resources_by_default():
    settings = BlitzSettings()
    assert "resources" not in _pool_options("CPUPool", settings.cpu_pool)["ray_actor_options"]
    assert "resources" not in _ingress_options(settings.ingress)["ray_actor_options"]


def test_surge_replicas_that_do_not_fit_the_cluster_become_an_in_place_replacement(caplog):
    """A redeploy on a full cluster (the old replicas hold every CPU) must not wait forever
    for room for the ingress's surge replica: the builder replaces it in place, and says so."""
    settings = BlitzSettings()  # ingress: 1 replica, 0.5 CPU, 100% surge; pools: no surge
    ingress = _ingress_options(settings.ingress)
    assert ingress["max_surge_percent"] == 100
    assert fit_surge(ingress, {"CPU": 0.5, "GPU": 0.0}) == ingress  # room: unchanged
    with caplog.at_level(logging.WARNING, logger="ray.serve"):
        full = fit_surge(ingress, {"CPU": 0.25})
    assert full == {**ingress, "max_surge_percent": 0}
    assert "replaced in place" in caplog.text and "Ingress" in caplog.text
    two = {**ingress, "num_replicas": 3, "max_surge_percent": 50}  # 2 surge replicas
    assert not surge_fits(two, {"CPU": 0.9}) and surge_fits(two, {"CPU": 1.0})
    pinned = _pool_options("CPUPool", BlitzSettings.from_args(
        {"cpu_pool": {"max_surge_percent": 100, "resources": {"head": 1}}}).cpu_pool)
    assert not surge_fits(pinned, {"CPU": 8})  # no `head` resource free
    assert surge_fits(_pool_options("CPUPool", settings.cpu_pool), {})  # no surge asked
