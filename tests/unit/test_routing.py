from __future__ import annotations

import pytest

from blitz.config import RoutingSettings
from blitz.routing import choose_pool

BOTH, CPU_ONLY = {"cpu", "gpu"}, {"cpu"}
DEFAULT = RoutingSettings()


@pytest.mark.parametrize(("kind", "n", "pools", "policy", "expected"), [
    ("embedding", 1, BOTH, DEFAULT, "cpu"),
    ("embedding", 9, BOTH, DEFAULT, "cpu"),
    ("embedding", 10, BOTH, DEFAULT, "gpu"),
    ("embedding", 5000, BOTH, DEFAULT, "gpu"),
    ("embedding", 5000, CPU_ONLY, DEFAULT, "cpu"),
    ("cross-encoder", 1, BOTH, DEFAULT, "gpu"),
    ("cross-encoder", 100, BOTH, DEFAULT, "gpu"),
    ("cross-encoder", 100, CPU_ONLY, DEFAULT, "cpu"),
    ("cross-encoder", 100, BOTH, RoutingSettings(cross_encoder_pool="cpu"), "cpu"),
    ("embedding", 30, BOTH, RoutingSettings(gpu_min_batch=32), "cpu"),
    ("embedding", 32, BOTH, RoutingSettings(gpu_min_batch=32), "gpu"),
    ("embedding", 1, BOTH, RoutingSettings(gpu_min_batch=1), "gpu"),
])
def test_routing_table(kind, n, pools, policy, expected):
    assert choose_pool(kind, n, pools, policy) == expected
