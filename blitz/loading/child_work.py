"""Model work run in a child process, so a long-lived process keeps only what it serves.

A replica or bulk actor that exports, quantizes or times models in process stays far
larger than the model it then serves: glibc keeps the freed heap, and closed candidates
do not give all their memory back. Measured (docs/benchmarks-history.md, "Memory per
process"): 1395
MiB idle after building ``minilm-int8`` in process against 625 MiB when the build was
cached; ~170 MiB more when ``cpu_backend: auto`` chose in process. Two kinds of work,
one runner (``blitz.runtime.child_process.run_child``: killed past the load's deadline, which
the caller passes as ``timeout_s``, and with its parent):

- ``build_in_child``: an ONNX build into the cache (``prepare_onnx``); the caller then
  opens the cached build as usual.
- ``choose_in_child``: ``cpu_backend: auto`` opens every candidate from the folder the
  caller resolved and checked (``open_backend``, the loader's one opener) and times them
  (``measure_choice``) with the caller's thread count, and prints its ``AutoChoice``; the
  caller then opens only the winner (its ONNX build is cached by then).

The child is ``python -m blitz.loading.child_main`` (its own module: it imports the loader,
which imports this one).

A child that fails is logged and reported (False, None): the caller then does the work in
process and raises what it always raised (the accuracy guard's error, say).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from blitz.loading.auto import AutoChoice
from blitz.runtime.child_process import run_child
from blitz.settings.registry import ModelSpec
from blitz.sources import model_cache

build_log = logging.getLogger("blitz.onnx_export")
choose_log = logging.getLogger("blitz.encoders.auto")

STDERR_KEPT = 2000  # characters of the child's stderr quoted when it fails
CHOICE_MARK = "blitz-auto-choice "  # the line of the child's stdout that holds its choice


def _command(kind: str, spec: ModelSpec, path: Path, cache_dir: str | Path | None,
             *extra: str) -> list[str]:
    return [sys.executable, "-m", "blitz.loading.child_main", kind, spec.model_dump_json(),
            str(path), "" if cache_dir is None else str(cache_dir), *extra]


def is_cached(spec: ModelSpec, path: Path, cache_dir: str | Path | None) -> bool:
    """True when ``spec``'s ONNX build from ``path`` is in the cache with its files whole."""
    from blitz.loading.onnx_export import AREA, onnx_cache_key

    key, _ = onnx_cache_key(spec, path)
    entry = model_cache.find_entry(model_cache.cache_root(cache_dir), AREA, key)
    return entry is not None and model_cache.entry_problem(entry) is None


def build_in_child(spec: ModelSpec, path: Path, cache_dir: str | Path | None, *,
                   timeout_s: float) -> bool:
    """Build ``spec``'s ONNX model into the cache in a child process unless it is there;
    True when the cache holds the build afterwards. The child is killed past
    ``timeout_s`` (``ChildTimedOut``)."""
    if is_cached(spec, path, cache_dir):
        return True
    build_log.info("model %r: building its %s model in a child process", spec.id,
                   spec.cpu_backend)
    command = _command("build", spec, path, cache_dir)
    done = run_child(command, timeout_s)
    if done.returncode != 0:
        build_log.warning("model %r: the child build failed (exit %s); building in "
                          "process:\n%s", spec.id, done.returncode, done.stderr[-STDERR_KEPT:])
        return False
    return is_cached(spec, path, cache_dir)


def choose_in_child(spec: ModelSpec, path: Path, cache_dir: str | Path | None, *,
                    threads: int, timeout_s: float) -> AutoChoice | None:
    """The choice ``measure_choice`` makes for ``spec`` (its weights in ``path``) with
    ``threads`` intra-op threads, made in a child process; None (logged) when the child
    fails. The child is killed past ``timeout_s`` (``ChildTimedOut``)."""
    choose_log.info("model %r: cpu_backend auto measures its candidates in a child process",
                    spec.id)
    command = _command("choose", spec, path, cache_dir, str(threads), repr(timeout_s))
    done = run_child(command, timeout_s)
    lines = [line for line in done.stdout.splitlines() if line.startswith(CHOICE_MARK)]
    if done.returncode != 0 or not lines:
        choose_log.warning("model %r: the cpu_backend auto child failed (exit %s); measuring "
                           "in process:\n%s", spec.id, done.returncode,
                           done.stderr[-STDERR_KEPT:])
        return None
    return AutoChoice.from_json(lines[-1][len(CHOICE_MARK):])
