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


def test_an_onnx_session_runs_the_configured_count_without_spinning(tmp_path):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    from blitz.runtime import model_threads

    value = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [value],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # one every onnxruntime reads
    onnx.save(model, tmp_path / "g.onnx")
    model_threads.configure(3)
    try:
        session = model_threads.onnx_session(tmp_path / "g.onnx")
    finally:
        model_threads.configure(None)
    options = session.get_session_options()
    assert options.intra_op_num_threads == 3 and options.inter_op_num_threads == 1
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert session.get_providers() == ["CPUExecutionProvider"]
    assert session.run(None, {"x": np.ones(2, np.float32)})[0].tolist() == [1.0, 1.0]
