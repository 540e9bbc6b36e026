"""Settings -> Serve deployment options (deployments/app.py), without starting Ray."""

from __future__ import annotations

from blitz.config import BlitzSettings
from deployments.app import _ingress_options, _pool_options


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
