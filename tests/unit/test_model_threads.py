"""blitz.runtime.model_threads: one intra-op thread count for torch and onnxruntime, torch told only
when it is used."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_CHILD = """
import sys
from blitz.runtime import model_threads
model_threads.configure(3)
assert model_threads.count() == 3
assert "torch" not in sys.modules  # configuring does not import torch
torch = model_threads.torch_module()
assert torch.get_num_threads() == 3  # the first torch model runs the configured count
torch.set_num_threads(1)
model_threads.configure(2)  # torch already imported: told at once
assert torch.get_num_threads() == 2
model_threads.configure(None)
assert model_threads.count() == torch.get_num_threads()  # unset: torch's own
print("ok")
"""


def test_thread_count_reaches_torch_only_when_torch_is_used():
    run = subprocess.run([sys.executable, "-c", _CHILD], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]
