"""Unit tests never start Ray: any test that does fails."""

from __future__ import annotations

import os
import sys

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _ray_running() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and getattr(ray, "is_initialized", lambda: False)()


@pytest.fixture(autouse=True)
def _no_ray():
    before = _ray_running()
    yield
    if _ray_running() and not before:
        pytest.fail("a unit test started Ray; move it to tests/integration")
