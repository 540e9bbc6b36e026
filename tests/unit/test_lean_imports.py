"""sentence-transformers without scikit-learn and SciPy resident (blitz/runtime/lean_imports.py).

Each test runs in a fresh interpreter: the point is what a new replica process imports."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


@pytest.mark.slow  # two fresh processes importing sentence-transformers: ~12 s
def test_sentence_transformers_loads_without_sklearn_and_answers_the_same():
    out = _run("""
        import sys
        from blitz.runtime.lean_imports import defer_sklearn_metrics, is_deferred
        assert defer_sklearn_metrics()
        import sentence_transformers
        from sentence_transformers.util import similarity
        import torch
        print("sklearn" in sys.modules, is_deferred())
        a = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]]).to_sparse()
        b = torch.tensor([[1.0, 1.0, 1.0]]).to_sparse()
        got = similarity.manhattan_sim(a, b)  # the one caller: imports sklearn now
        dense = similarity.manhattan_sim(a.to_dense(), b.to_dense())  # torch alone
        print("sklearn" in sys.modules, is_deferred(), got.flatten().tolist(),
              dense.flatten().tolist())
    """)
    first, second = out.splitlines()
    assert first == "False True"
    assert second == "True False [-2.0, -4.0] [-2.0, -4.0]"


def test_nothing_is_deferred_once_sklearn_is_imported():
    assert _run("""
        import sklearn.metrics
        from blitz.runtime.lean_imports import defer_sklearn_metrics
        print(defer_sklearn_metrics(), type(sklearn.metrics).__name__)
    """) == "False module"


def test_importing_by_name_later_gets_the_real_module():
    assert _run("""
        from blitz.runtime.lean_imports import defer_sklearn_metrics, real_module
        defer_sklearn_metrics()
        module = real_module()
        import sklearn.metrics
        print(module is sklearn.metrics, hasattr(module, "ndcg_score"))
    """) == "True True"
