"""Scaling and shutdown settings: defaults, checks, and the Serve options they become
(validated by Ray Serve's own config models, without starting Ray)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from blitz.config import BlitzSettings
from blitz.encoders import fake
from blitz.encoders.loading import load_encoder
from blitz.registry import ModelSpec
from deployments.app import _ingress_options, _pool_options
from deployments.ingress import Ingress
from deployments.pool import ModelPool


def test_defaults_scale_the_gpu_pool_to_zero_after_five_idle_minutes():
    settings = BlitzSettings.from_args(None)
    cpu, gpu = settings.cpu_pool, settings.gpu_pool
    assert (cpu.min_replicas, cpu.upscale_delay_s, cpu.downscale_delay_s) == (1, 5.0, 300.0)
    assert gpu.min_replicas == 0 and gpu.downscale_to_zero_delay_s == 300.0
    # a pool replica may finish a whole call (call_timeout_s) before it is stopped
    assert cpu.graceful_shutdown_timeout_s >= cpu.call_timeout_s
    assert gpu.graceful_shutdown_timeout_s >= gpu.call_timeout_s
    # a stopping ingress outlives its longest pool call, so every request gets an answer
    assert settings.ingress.graceful_shutdown_timeout_s > settings.ingress.pool_timeout_s
    assert settings.ingress.max_surge_percent == 100 and cpu.max_surge_percent == 0


@pytest.mark.parametrize("bad", [
    {"cpu_pool": {"look_back_period_s": 10}},  # not longer than Ray's metrics push
    {"cpu_pool": {"upscale_delay_s": -1}},
    {"gpu_pool": {"downscale_to_zero_delay_s": -1}},
    {"cpu_pool": {"graceful_shutdown_wait_loop_s": 0}},
    {"ingress": {"max_surge_percent": 101}},
])
def test_invalid_scaling_settings_are_rejected(bad):
    with pytest.raises(ValidationError):
        BlitzSettings.from_args(bad)


def test_pool_settings_become_serve_autoscaling_and_shutdown_options():
    settings = BlitzSettings.from_args({"gpu_pool": {
        "upscale_delay_s": 1, "downscale_delay_s": 2, "downscale_to_zero_delay_s": 3,
        "look_back_period_s": 12, "graceful_shutdown_timeout_s": 40,
        "graceful_shutdown_wait_loop_s": 0.25, "max_surge_percent": 50, "max_replicas": 2}})
    config = ModelPool.options(**_pool_options("GPUPool", settings.gpu_pool))._deployment_config
    auto = config.autoscaling_config
    assert (auto.min_replicas, auto.max_replicas) == (0, 2)
    assert (auto.upscale_delay_s, auto.downscale_delay_s, auto.downscale_to_zero_delay_s,
            auto.look_back_period_s) == (1, 2, 3, 12)
    assert (config.graceful_shutdown_timeout_s, config.graceful_shutdown_wait_loop_s,
            config.max_surge_percent) == (40, 0.25, 50)


def test_ingress_settings_become_serve_shutdown_and_rollout_options():
    ingress = BlitzSettings.from_args({"ingress": {"graceful_shutdown_timeout_s": 150}}).ingress
    config = Ingress.options(**_ingress_options(ingress))._deployment_config
    assert (config.graceful_shutdown_timeout_s, config.graceful_shutdown_wait_loop_s,
            config.max_surge_percent) == (150, 0.5, 100)


def test_fake_source_takes_a_load_delay_and_a_batch_delay(monkeypatch):
    assert ModelSpec(id="f", source="fake:8").fake_params() == (8, 0.0, 0.0)
    assert ModelSpec(id="f", source="fake:8:1.5:0.25").fake_params() == (8, 1.5, 0.25)
    with pytest.raises(ValidationError):
        ModelSpec(id="f", source="fake:8:1:2:3")
    slept: list[float] = []
    monkeypatch.setattr(fake.time, "sleep", slept.append)
    encoder = load_encoder(ModelSpec(id="f", source="fake:8:0:0.25"), "cpu")
    encoder.warmup()
    assert slept == [0.0]  # the load's delay (none); warm-up is not a batch
    results = encoder.embed_many([(["a", "b"], True, True), (["c"], True, True)])
    assert [r.values.shape for r in results] == [(2, 8), (1, 8)]
    assert slept == [0.0, 0.25]  # one delay per batch, not per request


def test_a_partial_gpu_pool_keeps_the_gpu_defaults():
    gpu = BlitzSettings.from_args({"gpu_pool": {"max_replicas": 2}}).gpu_pool
    assert (gpu.min_replicas, gpu.max_replicas, gpu.num_gpus, gpu.max_batch_size) == \
        (0, 2, 1.0, 1024)
    cpu = BlitzSettings.from_args({"cpu_pool": {"max_replicas": 2}}).cpu_pool
    assert (cpu.min_replicas, cpu.num_gpus, cpu.max_batch_size) == (1, 0.0, 128)
