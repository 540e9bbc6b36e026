"""The Dockerfile's image, built and run with podman by scripts/image.sh (docs/operations.md,
"The image, built and run with podman"): it builds, answers /embed, /ready and gRPC Embed,
and on SIGTERM (`podman stop`) drains: a request in flight gets its answer and the
container exits 0. Skipped where podman is not on PATH (CI's clean machines) or
this is not root; the first build takes many minutes, a rebuild from podman's layer cache
seconds. No Ray in this process: Ray runs inside the container."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_image_builds_serves_http_and_grpc_and_stops_cleanly():
    if shutil.which("podman") is None:
        pytest.skip("podman is not on PATH (apt-get install podman runc debootstrap)")
    if os.geteuid() != 0:
        pytest.skip("scripts/image.sh needs root (rootful podman, debootstrap)")
    env = {**os.environ,
           "BLITZ_IMAGE_CONTAINER": f"blitz-image-test-{os.getpid()}",
           "BLITZ_IMAGE_HTTP_PORT": str(free_port()),
           "BLITZ_IMAGE_GRPC_PORT": str(free_port())}
    done = subprocess.run(["bash", "scripts/image.sh"], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=3600)
    log = done.stdout + done.stderr
    if done.returncode != 0:  # a failed run leaves no container of its own behind
        subprocess.run(["bash", "scripts/image.sh", "stop"], cwd=ROOT, env=env, timeout=120)
    assert done.returncode == 0, log[-4000:]
    assert re.search(r"build: \d+ s; image \S+: \d+ MB", log), log[-4000:]
    assert re.search(r"run: /ready 200 after [\d.]+ s", log), log[-4000:]
    assert "check: /embed 384 values, /ready 200, gRPC Embed 384 values" in log
    # `podman stop` with a request in flight: the image drains (scripts/lifecycle.py), so
    # that request gets its vectors after SIGTERM, and the container exits 0 by itself
    assert re.search(r"stop: the request in flight \(\d+ texts\): 200, answered [\d.]+ s "
                     r"after SIGTERM", log), log[-4000:]
    assert re.search(r"stop: exit status 0 after [\d.]+ s", log), log[-4000:]
    assert "check: passed" in log
