"""Unit tests never start Ray: any test that does fails."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.loadtest_fakes import naive_server
from tests.tiny_models import build_tiny_bi_encoder

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Property-based tests (tests/unit/test_fuzz_*.py): few examples by default, so the unit
# tier stays quick; HYPOTHESIS_PROFILE=long runs many more.
settings.register_profile("default", max_examples=50, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=20_000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


def _ray_running() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and getattr(ray, "is_initialized", lambda: False)()


@pytest.fixture(autouse=True)
def _no_ray():
    before = _ray_running()
    yield
    if _ray_running() and not before:
        pytest.fail("a unit test started Ray; move it to tests/integration")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    """A tiny random bi-encoder, built once per test module."""
    return build_tiny_bi_encoder(tmp_path_factory.mktemp("tiny") / "bi")


@pytest.fixture(scope="module")
def naive_url() -> Iterator[str]:
    """The naive baseline server over real TCP, for the load generator's tests."""
    with naive_server() as url:
        yield url


@pytest.fixture
def no_home_cache(tmp_path, monkeypatch):
    """Anything that forgets to pass a cache dir lands in tmp, never in ~/.cache."""
    monkeypatch.setenv("BLITZ_CACHE_DIR", str(tmp_path / "default-cache"))
