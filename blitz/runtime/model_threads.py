"""How many intra-op threads one model call uses, for every runtime in the process.

A pool replica sets the count once (``torch_threads``, a name kept from when torch was
the only runtime), before it loads models. onnxruntime sessions read it when they are
opened; torch is told only when a torch model is opened (``torch_module``); ``onnx_session``
opens a graph at the count, so a replica
whose models all run on onnxruntime never imports torch (~210 MiB and ~1.5 s of import,
docs/benchmarks-history.md "Idle memory").
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

_lock = threading.Lock()
_configured: int | None = None


def configure(threads: int | None) -> None:
    """Use ``threads`` intra-op threads per model call from now on (None: the default).
    Applied to torch at once when torch is already imported."""
    global _configured
    with _lock:
        _configured = threads
    if threads and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)


def count() -> int:
    """The configured count; else torch's own (when torch is imported) or this process's
    usable cores."""
    if _configured:
        return _configured
    if "torch" in sys.modules:
        return int(sys.modules["torch"].get_num_threads())
    return max(len(os.sched_getaffinity(0)), 1)


def torch_module() -> Any:
    """``torch``, imported now if need be, running the configured thread count."""
    import torch

    if _configured and torch.get_num_threads() != _configured:
        torch.set_num_threads(_configured)
    return torch


def onnx_session(file: Any) -> Any:
    """The ONNX graph at ``file`` on onnxruntime's CPU provider, with ``count()`` intra-op
    threads. Idle threads do not spin: a replica holds several models, and spinning threads
    of one slow down the others (onnxruntime spins by default)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = count()
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(file), options, providers=["CPUExecutionProvider"])
