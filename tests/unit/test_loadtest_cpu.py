"""The load generator's CPU probes (loadtest.cpu)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from loadtest.cpu import machine_cpu_s, process_tree_cpu_s

BURNER = """
import time
start = time.process_time()
while time.process_time() - start < 0.4:
    pass
print("ready", flush=True)
time.sleep(60)
"""


def test_cpu_probe_counts_descendants_and_the_machine():
    # a parent process whose child burns 0.4 CPU seconds, then waits
    parent = subprocess.Popen(
        [sys.executable, "-c",
         f"import subprocess, sys; subprocess.run([sys.executable, '-c', {BURNER!r}])"],
        stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        busy0, total0 = machine_cpu_s()
        assert parent.stdout is not None and parent.stdout.readline() == "ready\n"
        busy1, total1 = machine_cpu_s()
        assert 0.35 <= process_tree_cpu_s([parent.pid]) < 2  # the child's burn
        assert busy1 - busy0 >= 0.35 and total1 - total0 >= busy1 - busy0
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.communicate(timeout=10)
    assert process_tree_cpu_s([parent.pid]) == 0  # gone
