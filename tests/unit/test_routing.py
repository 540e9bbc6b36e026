from __future__ import annotations

import pytest

from blitz.ingress.routing import REASONS, Route, choose_pool
from blitz.settings.config import RoutingSettings

BOTH, CPU_ONLY, NONE = {"cpu", "gpu"}, {"cpu"}, set()
DEFAULT = RoutingSettings()
WAIT = RoutingSettings(cold_gpu="wait")
CE_ON_CPU = RoutingSettings(cross_encoder_pool="cpu")


@pytest.mark.parametrize(("kind", "n", "pools", "running", "policy", "expected"), [
    # a warm GPU pool: by size, cross-encoders by kind
    ("embedding", 1, BOTH, BOTH, DEFAULT, Route("cpu", "small")),
    ("embedding", 9, BOTH, BOTH, DEFAULT, Route("cpu", "small")),
    ("embedding", 10, BOTH, BOTH, DEFAULT, Route("gpu", "size")),
    ("embedding", 5000, BOTH, BOTH, DEFAULT, Route("gpu", "size")),
    ("cross-encoder", 1, BOTH, BOTH, DEFAULT, Route("gpu", "kind")),
    ("cross-encoder", 100, BOTH, BOTH, DEFAULT, Route("gpu", "kind")),
    ("cross-encoder", 100, BOTH, BOTH, CE_ON_CPU, Route("cpu", "kind")),
    ("embedding", 30, BOTH, BOTH, RoutingSettings(gpu_min_batch=32), Route("cpu", "small")),
    ("embedding", 32, BOTH, BOTH, RoutingSettings(gpu_min_batch=32), Route("gpu", "size")),
    ("embedding", 1, BOTH, BOTH, RoutingSettings(gpu_min_batch=1), Route("gpu", "size")),
    # no GPU pool: everything on the CPU pool, whatever its state
    ("embedding", 5000, CPU_ONLY, CPU_ONLY, DEFAULT, Route("cpu", "no_gpu")),
    ("cross-encoder", 100, CPU_ONLY, CPU_ONLY, DEFAULT, Route("cpu", "no_gpu")),
    ("embedding", 5000, CPU_ONLY, NONE, WAIT, Route("cpu", "no_gpu")),
    # a GPU pool with no running replica: what would go there is served on the CPU pool
    ("embedding", 10, BOTH, CPU_ONLY, DEFAULT, Route("cpu", "cold_gpu")),
    ("embedding", 5000, BOTH, NONE, DEFAULT, Route("cpu", "cold_gpu")),
    ("cross-encoder", 1, BOTH, CPU_ONLY, DEFAULT, Route("cpu", "cold_gpu")),
    ("embedding", 9, BOTH, CPU_ONLY, DEFAULT, Route("cpu", "small")),  # small stays small
    ("cross-encoder", 100, BOTH, CPU_ONLY, CE_ON_CPU, Route("cpu", "kind")),
    # ... unless the policy says to wait for the cold start
    ("embedding", 5000, BOTH, CPU_ONLY, WAIT, Route("gpu", "size")),
    ("cross-encoder", 1, BOTH, CPU_ONLY, WAIT, Route("gpu", "kind")),
    ("embedding", 9, BOTH, CPU_ONLY, WAIT, Route("cpu", "small")),
])
def test_routing_table(kind, n, pools, running, policy, expected):
    route = choose_pool(kind, n, pools, running, policy)
    assert route == expected
    assert route.reason in REASONS  # the metric's label set is closed


def test_the_default_policy_serves_rather_than_waits_for_a_cold_gpu_pool():
    assert DEFAULT.cold_gpu == "cpu"
    with pytest.raises(ValueError, match="cold_gpu"):
        RoutingSettings(cold_gpu="never")
