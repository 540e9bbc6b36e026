"""A pool replica Ray cannot place: the claim, what is free, and when it is reported
(blitz/ingress/placement.py, deployments/placement.py's ``PlacementWatch.update``)."""

from __future__ import annotations

import pytest

from blitz.ingress.placement import short_of, unplaced_message


def test_the_message_names_the_claim_what_is_free_and_what_is_short():
    # a 2-core node: the CPU pool holds both cores, the GPU pool wants 0.5 of one
    claim = {"CPU": 0.5, "GPU": 1.0}
    free = {"CPU": 0.0, "GPU": 1.0, "memory": 2**33}
    assert short_of(claim, free) == ["CPU"]
    message = unplaced_message("gpu_pool", "GPUPool", claim, free, 41.2)
    assert message.startswith("GPUPool (gpu_pool) has a replica Ray has not placed for "
                              "41 s: it claims CPU 0.5, GPU 1 and the cluster has CPU 0, "
                              "GPU 1 free (short of CPU)")
    assert "gpu_pool.deployment.ray_actor_options" in message
    fits = unplaced_message("cpu_pool", "CPUPool", {"CPU": 1.0}, {"CPU": 2.0}, 30)
    assert "yet no node takes it" in fits


class FakeGauge:
    def __init__(self):
        self.values: dict[str, float] = {}

    def set(self, value, tags):
        self.values[tags["pool"]] = value


@pytest.fixture
def watch(monkeypatch):
    from deployments import placement

    gauge = FakeGauge()
    monkeypatch.setattr(placement.metrics, "pool_unplaced", gauge, raising=False)
    watch = placement.PlacementWatch("blitz", {"cpu": "CPUPool", "gpu": "GPUPool"},
                                     after_s=30)
    return watch, gauge


def test_a_replica_is_unplaced_only_after_waiting_and_placed_again_clears_it(watch, caplog):
    watch, gauge = watch
    free = {"CPU": 0.0, "GPU": 1.0}
    pending = {("blitz", "GPUPool"): {"CPU": 0.5, "GPU": 1.0},
               ("other-app", "CPUPool"): {"CPU": 2.0}}  # another app's: not ours
    watch.update(pending, free, now=100.0)  # a worker starting: not yet
    assert watch.problems == {} and gauge.values == {"cpu": 0, "gpu": 0}
    with caplog.at_level("WARNING", logger="ray.serve"):
        watch.update(pending, free, now=131.0)
        watch.update(pending, free, now=141.0)
    assert list(watch.problems) == ["gpu"] and "41 s: it claims CPU 0.5, GPU 1" in (
        watch.problems["gpu"])
    assert gauge.values == {"cpu": 0, "gpu": 1}
    assert len([r for r in caplog.records if "has not placed" in r.message]) == 1  # once
    watch.update({}, free, now=150.0)
    assert watch.problems == {} and gauge.values["gpu"] == 0
    watch.update(pending, free, now=151.0)  # a new wait starts from zero
    assert watch.problems == {}
