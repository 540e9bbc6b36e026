"""Scaling and shutdown settings: defaults, checks, and the Serve options they become
(validated by Ray Serve's own config models, without starting Ray)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from blitz.encoders import fake
from blitz.loading.load import load_encoder
from blitz.settings.config import BlitzSettings
from blitz.settings.registry import ModelSpec
from deployments.app import _ingress_options, _pool_options, build_app
from deployments.ingress import Ingress
from deployments.pool import ModelPool


def test_defaults_scale_the_gpu_pool_to_zero_after_five_idle_minutes():
    settings = BlitzSettings.from_args(None)
    cpu, gpu = settings.cpu_pool, settings.gpu_pool
    gpu_auto = gpu.deployment["autoscaling_config"]
    # the CPU pool: fixed replicas sized from the node (`num_replicas: auto`) unless the
    # config asks for Serve's autoscaling, which then starts from Blitz's delays
    assert isinstance(cpu.deployment["num_replicas"], int)
    assert "autoscaling_config" not in cpu.deployment
    scaled = BlitzSettings.from_args(
        {"cpu_pool": {"deployment": {"autoscaling_config": {"max_replicas": 3}}}}).cpu_pool
    cpu_auto = scaled.deployment["autoscaling_config"]
    assert "num_replicas" not in scaled.deployment
    assert (cpu_auto["min_replicas"], cpu_auto["max_replicas"], cpu_auto["upscale_delay_s"],
            cpu_auto["downscale_delay_s"]) == (1, 3, 5, 300)
    assert gpu_auto["min_replicas"] == 0 and gpu_auto["downscale_to_zero_delay_s"] == 300
    # a pool replica may finish a whole call (call_timeout_s) before it is stopped
    assert cpu.deployment["graceful_shutdown_timeout_s"] >= cpu.call_timeout_s
    assert gpu.deployment["graceful_shutdown_timeout_s"] >= gpu.call_timeout_s
    # a stopping ingress outlives its longest pool call, so every request gets an answer
    ingress = settings.ingress
    assert ingress.deployment["graceful_shutdown_timeout_s"] > ingress.pool_timeout_s
    assert ingress.deployment["max_surge_percent"] == 100
    assert cpu.deployment["max_surge_percent"] == 0


def test_a_look_back_window_within_rays_metrics_push_is_rejected():
    with pytest.raises(ValidationError, match="look_back_period_s must be over"):
        BlitzSettings.from_args(
            {"cpu_pool": {"deployment": {"autoscaling_config": {"look_back_period_s": 10}}}})


@pytest.mark.parametrize("bad", [
    {"cpu_pool": {"deployment": {"autoscaling_config": {"upscale_delay_s": -1}}}},
    {"gpu_pool": {"deployment": {"autoscaling_config": {"target_ongoing_requests": 0}}}},
    {"cpu_pool": {"deployment": {"graceful_shutdown_wait_loop_s": -1}}},
    {"ingress": {"deployment": {"max_surge_percent": 101}}},
    {"cpu_pool": {"deployment": {"autoscaling_config": {"min_replicas": 2}}}},  # > max
])
def test_invalid_scaling_settings_are_rejected_by_serves_schema(bad):
    with pytest.raises(ValueError):
        build_app({"gpu": "off", **bad})


def test_pool_settings_become_serve_autoscaling_and_shutdown_options():
    settings = BlitzSettings.from_args({"gpu_pool": {"deployment": {
        "autoscaling_config": {"upscale_delay_s": 1, "downscale_delay_s": 2,
                               "downscale_to_zero_delay_s": 3, "look_back_period_s": 12,
                               "max_replicas": 2},
        "graceful_shutdown_timeout_s": 40, "graceful_shutdown_wait_loop_s": 0.25,
        "max_surge_percent": 50}}})
    config = ModelPool.options(**_pool_options("gpu", settings.gpu_pool))._deployment_config
    auto = config.autoscaling_config
    assert (auto.min_replicas, auto.max_replicas) == (0, 2)
    assert (auto.upscale_delay_s, auto.downscale_delay_s, auto.downscale_to_zero_delay_s,
            auto.look_back_period_s) == (1, 2, 3, 12)
    assert (config.graceful_shutdown_timeout_s, config.graceful_shutdown_wait_loop_s,
            config.max_surge_percent) == (40, 0.25, 50)


def test_ingress_settings_become_serve_shutdown_and_rollout_options():
    ingress = BlitzSettings.from_args(
        {"ingress": {"deployment": {"graceful_shutdown_timeout_s": 150}}}).ingress
    config = Ingress.options(**_ingress_options(ingress))._deployment_config
    assert (config.graceful_shutdown_timeout_s, config.graceful_shutdown_wait_loop_s,
            config.max_surge_percent) == (150, 0.5, 100)


def test_fake_source_takes_a_load_delay_and_a_batch_delay(monkeypatch):
    assert ModelSpec(id="f", source="fake:8").fake_params() == (8, 0.0, 0.0)
    assert ModelSpec(id="f", source="fake:8:1.5:0.25").fake_params() == (8, 1.5, 0.25)
    assert ModelSpec(id="f", source="fake:8:1:2:3").fake_batches_at_once() == 3
    assert ModelSpec(id="f", source="fake:8:1:2").fake_batches_at_once() is None
    for bad in ("fake:8:1:2:0", "fake:8:1:2:3:4", "fake:8:1:2:1.5"):
        with pytest.raises(ValidationError):
            ModelSpec(id="f", source=bad)
    slept: list[float] = []
    monkeypatch.setattr(fake.time, "sleep", slept.append)
    encoder = load_encoder(ModelSpec(id="f", source="fake:8:0:0.25"), "cpu")
    encoder.warmup()
    assert slept == [0.0]  # the load's delay (none); warm-up is not a batch
    results = encoder.embed_many([(["a", "b"], True, True), (["c"], True, True)])
    assert [r.values.shape for r in results] == [(2, 8), (1, 8)]
    assert slept == [0.0, 0.25]  # one delay per batch, not per request


def test_a_partial_gpu_pool_keeps_the_gpu_defaults():
    two = {"deployment": {"autoscaling_config": {"max_replicas": 2}}}
    gpu = BlitzSettings.from_args({"gpu_pool": two}).gpu_pool
    assert (gpu.min_replicas, gpu.max_replicas, gpu.num_gpus, gpu.max_batch_size) == \
        (0, 2, 1.0, 1024)
    cpu = BlitzSettings.from_args({"cpu_pool": two}).cpu_pool
    assert (cpu.min_replicas, cpu.num_gpus, cpu.max_batch_size) == (1, 0.0, 128)
