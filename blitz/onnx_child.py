"""Build an ONNX model into the cache in a child process, so a server's memory stays its own.

An export and quantization in a long-lived process leave it far larger than the model it
then serves: glibc keeps the freed heap. Measured on a CPU pool replica's first start
(BENCHMARKS.md, "Memory per process"): 1395 MiB idle after building ``minilm-int8`` in
process, 625 MiB when the build was already cached. ``build_in_child`` runs the build in
``python -m blitz.onnx_child`` and returns once the cache holds it; the caller then opens
the cached build as usual.

    python -m blitz.onnx_child SPEC_JSON PATH [CACHE_DIR]
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from blitz import model_cache
from blitz.child_process import run_child
from blitz.registry import ModelSpec

logger = logging.getLogger("blitz.onnx_export")

STDERR_KEPT = 2000  # characters of the child's stderr quoted when it fails


def is_cached(spec: ModelSpec, path: Path, cache_dir: str | Path | None) -> bool:
    """True when ``spec``'s ONNX build from ``path`` is in the cache with its files whole."""
    from blitz.onnx_export import AREA, onnx_cache_key

    key, _ = onnx_cache_key(spec, path)
    entry = model_cache.find_entry(model_cache.cache_root(cache_dir), AREA, key)
    return entry is not None and model_cache.entry_problem(entry) is None


def build_in_child(spec: ModelSpec, path: Path, cache_dir: str | Path | None) -> bool:
    """Build ``spec``'s ONNX model into the cache in a child process unless it is there.

    True when the cache holds the build afterwards. A child that fails is logged and
    False returned: the caller's own load then builds in process, or finds the failed
    build's record, and raises the error it always raised (the accuracy guard's, say).
    """
    if is_cached(spec, path, cache_dir):
        return True
    command = [sys.executable, "-m", "blitz.onnx_child", spec.model_dump_json(), str(path)]
    if cache_dir is not None:
        command.append(str(cache_dir))
    logger.info("model %r: building its %s model in a child process", spec.id,
                spec.cpu_backend)
    done = run_child(command)  # killed past the load deadline, or with this process
    if done.returncode != 0:
        logger.warning("model %r: the child build failed (exit %s); building in process:\n%s",
                       spec.id, done.returncode, done.stderr[-STDERR_KEPT:])
        return False
    return is_cached(spec, path, cache_dir)


def main(argv: list[str]) -> int:
    from blitz.onnx_export import prepare_onnx

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    spec = ModelSpec.model_validate_json(argv[0])
    prepare_onnx(spec, Path(argv[1]), argv[2] if len(argv) > 2 else None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
