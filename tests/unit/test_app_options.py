"""Settings -> Serve deployment options (deployments/app.py), without starting Ray."""

from __future__ import annotations

import logging
import re

import pytest

from blitz.settings.config import BlitzSettings
from deployments.app import (
    _ingress_options,
    _pool_options,
    build_app,
    fit_surge,
    surge_fits,
    with_cpu_claim,
)


def test_custom_resources_pin_pools_and_ingress_to_nodes_that_have_them():
    on = {"head": 0.01}
    settings = BlitzSettings.from_args({
        "cpu_pool": {"workers": 1, "deployment": {"ray_actor_options": {"resources": on}}},
        "gpu_pool": {"deployment": {"ray_actor_options": {"resources": {"gpu_node": 1}}}},
        "ingress": {"deployment": {"ray_actor_options": {"resources": on}}},
    })
    cpu = _pool_options("cpu", settings.cpu_pool)["ray_actor_options"]
    gpu = _pool_options("gpu", settings.gpu_pool)["ray_actor_options"]
    ingress = _ingress_options(settings.ingress)["ray_actor_options"]
    assert cpu == {"num_cpus": 1, "resources": {"head": 0.01}}
    assert gpu == {"num_cpus": 0.5, "num_gpus": 1, "resources": {"gpu_node": 1}}
    assert ingress == {"num_cpus": 0.5, "resources": {"head": 0.01}}


def test_no_custom_resources_by_default():
    settings = BlitzSettings()
    assert "resources" not in _pool_options("cpu", settings.cpu_pool)["ray_actor_options"]
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
    pinned = _pool_options("cpu", BlitzSettings.from_args({"cpu_pool": {"deployment": {
        "max_surge_percent": 100, "ray_actor_options": {"resources": {"head": 1}}}}}).cpu_pool)
    assert not surge_fits(pinned, {"CPU": 8})  # no `head` resource free
    assert surge_fits(_pool_options("cpu", settings.cpu_pool), {})  # no surge asked


@pytest.mark.parametrize(("block", "message"), [
    ({"cpu_pool": {"deployment": {"max_ongoing_request": 8}}},
     "cpu_pool.deployment.max_ongoing_request is not a Ray Serve deployment option "
     "(did you mean 'max_ongoing_requests'?)"),
    ({"gpu_pool": {"deployment": {"autoscaling_config": {"min_replica": 0}}}},
     "gpu_pool.deployment.autoscaling_config.min_replica is not"),
    ({"ingress": {"deployment": {"ray_actor_options": {"num_cpu": 1}}}},
     "ingress.deployment.ray_actor_options.num_cpu is not"),
    ({"ingress": {"deployment": {"max_surge_percent": 101}}}, "ingress.deployment:"),
])
def test_a_deployment_block_serve_does_not_take_fails_the_build_naming_the_key(block, message):
    """Checked against Serve's own schema, bound or not (the GPU pool here is not bound)."""
    with pytest.raises(ValueError, match=re.escape(message)):
        build_app({"gpu": "off", **block})


def test_deployment_blocks_pass_through_merged_over_blitz_defaults():
    settings = BlitzSettings.from_args({"cpu_pool": {"deployment": {
        "autoscaling_config": {"max_replicas": 3}, "health_check_period_s": 2}}})
    options = _pool_options("cpu", settings.cpu_pool)
    assert options["autoscaling_config"]["max_replicas"] == 3  # given
    assert options["autoscaling_config"]["min_replicas"] == 1  # Blitz's default kept
    assert options["health_check_period_s"] == 2  # an option Blitz never spells
    assert settings.cpu_pool.max_replicas == 3  # what Blitz reads itself
    fixed = BlitzSettings.from_args({"cpu_pool": {"deployment": {"num_replicas": 2}}})
    assert "autoscaling_config" not in fixed.cpu_pool.deployment  # Serve takes one of them
    assert (fixed.cpu_pool.min_replicas, fixed.cpu_pool.max_replicas) == (2, 2)


def test_the_cpu_pool_claims_a_cpu_per_model_call_thread_unless_told(caplog):
    derived = BlitzSettings.from_args({"cpu_pool": {"workers": 2, "torch_threads": 3}})
    assert derived.cpu_pool.num_cpus == 6 and derived.cpu_pool.cpu_claim_problem("c") is None
    one = BlitzSettings.from_args({"cpu_pool": {"workers": 1}})
    assert one.cpu_pool.num_cpus == 1  # 1 worker, torch's own threads: 1
    low = BlitzSettings.from_args({"cpu_pool": {"workers": 2, "torch_threads": 1, "deployment":
                                                {"ray_actor_options": {"num_cpus": 1}}}})
    with caplog.at_level(logging.WARNING, logger="ray.serve"):
        _pool_options("cpu", low.cpu_pool)  # a warning, not an error: Ray's claim is no limit
    assert "cpu_pool claims num_cpus 1 but runs workers 2 x torch_threads 1" in caplog.text
    assert BlitzSettings().gpu_pool.cpu_claim_problem("gpu_pool") is None  # runs on its GPU


def test_old_flat_serve_options_still_work_with_one_warning_naming_the_new_spelling(caplog):
    with caplog.at_level(logging.WARNING, logger="blitz.config"):
        old = BlitzSettings.from_args({
            "cpu_pool": {"num_cpus": 2, "min_replicas": 0, "max_replicas": 2,
                         "max_surge_percent": 100, "workers": 2},
            "ingress": {"num_cpus": 0.25, "num_replicas": 2}})
    assert old.cpu_pool.deployment["ray_actor_options"]["num_cpus"] == 2
    assert (old.cpu_pool.min_replicas, old.cpu_pool.max_replicas) == (0, 2)
    assert old.cpu_pool.deployment["max_surge_percent"] == 100
    assert old.ingress.deployment["num_replicas"] == 2
    cpu = [r.getMessage() for r in caplog.records if r.getMessage().startswith("cpu_pool")]
    assert len(cpu) == 1 and "cpu_pool.deployment" in cpu[0] and "autoscaling_config" in cpu[0]
    again = BlitzSettings.model_validate(old.model_dump(mode="json"))  # what replicas get
    assert again == old


def test_an_ingress_holding_the_cpu_pool_claims_its_cpus_besides_its_own():
    settings = BlitzSettings.from_args({
        "ingress": {"cpu_pool": "in_process"},
        "cpu_pool": {"workers": 2, "torch_threads": 1,
                     "deployment": {"ray_actor_options": {"resources": {"head": 0.01}}}}})
    ingress = with_cpu_claim(_ingress_options(settings.ingress), settings.cpu_pool)
    assert ingress["name"] == "Ingress"  # the same deployment name either way
    assert ingress["ray_actor_options"]["num_cpus"] == 0.5 + 2  # its own + workers x threads
    assert _ingress_options(settings.ingress)["ray_actor_options"]["num_cpus"] == 0.5


def test_the_cpu_pool_runs_in_replicas_of_its_own_unless_told():
    assert BlitzSettings().ingress.cpu_pool == "replicas"
    with pytest.raises(ValueError, match="cpu_pool"):
        BlitzSettings.from_args({"ingress": {"cpu_pool": "inside"}})


def test_a_ray_without_the_fast_path_gets_one_warning_naming_the_cost_and_the_fix():
    from deployments.app import fast_path_warning

    fast = {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_ENABLE_HA_PROXY": "1"}
    assert fast_path_warning(fast) is None
    warning = fast_path_warning({"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"})
    assert warning is not None
    assert "RAY_SERVE_ENABLE_HA_PROXY unset" in warning
    assert "controller_options" in warning and "Entry points" in warning
    assert "and" in (fast_path_warning({}) or "").split(" unset")[0]


def test_a_local_batch_store_on_a_cluster_of_several_nodes_is_warned_of():
    from deployments.app import batch_storage_warning

    assert "s3://" in batch_storage_warning(BlitzSettings(), nodes=3)
    assert batch_storage_warning(BlitzSettings(), nodes=1) is None
    shared = BlitzSettings.from_args({"batches": {"storage": "s3://bucket/batches"}})
    assert batch_storage_warning(shared, nodes=3) is None
    off = BlitzSettings.from_args({"batches": {"enabled": False}})
    assert batch_storage_warning(off, nodes=3) is None
