"""scripts/lifecycle.py: BLITZ_CONSOLE_LOGS=1 brings the replicas' logs to the console on
the fast path (its throughput-optimized mode keeps them off stderr)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from lifecycle import console_log_env  # noqa: E402


def test_console_logs_turn_on_the_replicas_stderr_unless_set():
    assert console_log_env({"BLITZ_CONSOLE_LOGS": "1"})["RAY_SERVE_LOG_TO_STDERR"] == "1"
    kept = console_log_env({"BLITZ_CONSOLE_LOGS": "1", "RAY_SERVE_LOG_TO_STDERR": "0"})
    assert kept["RAY_SERVE_LOG_TO_STDERR"] == "0"
    assert "RAY_SERVE_LOG_TO_STDERR" not in console_log_env({"PATH": "/bin"})
