"""``auto`` sizes from a node's cores and GPUs (blitz.settings.sizing), and the settings that
use them."""

from __future__ import annotations

import pytest

from blitz.settings.config import BlitzSettings
from blitz.settings.doc import render
from blitz.settings.sizing import MAX_WORKERS_PER_REPLICA, NodeShape, size_for


@pytest.mark.parametrize("cpus, gpus, ingress, workers, replicas", [
    (1, 0, 1, 1, 1),
    (2, 0, 1, 2, 1),    # today's measured 2-core shape, unchanged
    (2, 1, 1, 1, 1),    # the GPU pool's tokenizing keeps a core: 1 + 0.5 claimed of 2
    (4, 0, 1, 3, 1),
    (8, 0, 2, 6, 1),
    (16, 0, 4, 6, 2),   # 12 model cores, at most 8 workers a replica
    (16, 1, 4, 5, 2),   # 16 - 4 for HTTP - 2 for the GPU's tokenizing
    (64, 0, 16, 8, 6),
])
def test_auto_sizes_follow_the_node(cpus, gpus, ingress, workers, replicas):
    sizing = size_for(NodeShape(cpus, gpus), gpu_pool=gpus > 0)
    assert (sizing.ingress_replicas, sizing.cpu_workers, sizing.cpu_replicas) == (
        ingress, workers, replicas)
    assert sizing.cpu_workers <= MAX_WORKERS_PER_REPLICA
    assert sizing.gpu_workers == 2


@pytest.mark.parametrize("cpus, gpus", [(1, 0), (2, 0), (2, 1), (3, 1), (16, 1), (96, 8)])
def test_auto_claims_fit_the_node(cpus, gpus):
    """What the shipped config claims (ingress 0 CPUs, CPU pool workers x 1, GPU pool 0.5
    CPU + 1 GPU) fits the node, so every pool it binds can be placed."""
    args = {"gpu": "on" if gpus else "off", "cpu_pool": {"torch_threads": 1},
            "ingress": {"deployment": {"ray_actor_options": {"num_cpus": 0}}}}
    settings = BlitzSettings.from_args(args, node=NodeShape(cpus, gpus))
    cpu = settings.cpu_pool
    claimed = cpu.num_cpus * cpu.deployment["num_replicas"]
    if gpus:
        claimed += settings.gpu_pool.num_cpus
    assert claimed <= cpus
    assert cpu.cpu_claim_problem("cpu_pool") is None


def test_auto_becomes_numbers_in_the_settings_replicas_get():
    settings = BlitzSettings.from_args({}, node=NodeShape(16, 0))
    assert (settings.cpu_pool.workers, settings.gpu_pool.workers) == (6, 2)
    assert settings.cpu_pool.deployment["num_replicas"] == 2
    assert "autoscaling_config" not in settings.cpu_pool.deployment
    assert settings.cpu_pool.num_cpus == 6  # workers x torch_threads
    assert settings.ingress.deployment["num_replicas"] == 4
    assert settings.gpu_pool.deployment["autoscaling_config"]["min_replicas"] == 0  # untouched
    again = BlitzSettings.from_args(settings.model_dump(mode="json"), node=NodeShape(2, 0))
    assert again.cpu_pool.workers == 6  # a replica keeps what the builder sized


def test_numbers_given_are_kept_and_autoscaling_replaces_auto_replicas():
    settings = BlitzSettings.from_args(
        {"cpu_pool": {"workers": 3, "deployment": {"autoscaling_config": {"max_replicas": 4}}},
         "ingress": {"deployment": {"num_replicas": 2}}}, node=NodeShape(64, 0))
    assert settings.cpu_pool.workers == 3
    assert "num_replicas" not in settings.cpu_pool.deployment
    assert settings.cpu_pool.max_replicas == 4
    assert settings.ingress.deployment["num_replicas"] == 2


def test_in_process_ingress_replicas_are_the_cpu_pool_replicas():
    settings = BlitzSettings.from_args({"ingress": {"cpu_pool": "in_process"}},
                                       node=NodeShape(32, 0))
    sizing = settings.sizing
    assert sizing is not None
    assert settings.ingress.deployment["num_replicas"] == sizing.cpu_replicas


def test_workers_out_of_range_are_refused():
    with pytest.raises(ValueError, match="workers must be from 1 to 16"):
        BlitzSettings.from_args({"cpu_pool": {"workers": 17}})


def test_the_settings_tables_show_auto_not_this_machine():
    assert "| `workers` | `\"auto\"` | `\"auto\"` |" in render()
