"""The Locust alternative (loadtest/locustfile.py), headless against the naive baseline
server."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.loadtest_fakes import DIM

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("locust", path=str(Path(sys.executable).parent)) is None,
                    reason="locust is not installed (the bench extra)")
def test_locustfile_runs_headless(naive_url, tmp_path):
    locust = Path(sys.executable).parent / "locust"
    proc = subprocess.run(
        [str(locust), "-f", str(ROOT / "loadtest" / "locustfile.py"), "--headless",
         "-u", "2", "-r", "2", "-t", "2s", "--host", naive_url, "--embed-api", "openai-float",
         "--embed-model", "fake", "--texts-per-request", "4", "--embed-dimension", str(DIM),
         "--only-summary", "--csv", str(tmp_path / "l")],
        capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    stats = (tmp_path / "l_stats.csv").read_text().splitlines()
    row = next(line for line in stats if "openai-float x4" in line).split(",")
    requests, failures = int(row[2]), int(row[3])
    assert requests > 0 and failures == 0
