"""The child process of ``blitz.loading.child_work``: one ONNX build (a dual encoder's:
``blitz.loading.dual_export``), or one ``cpu_backend: auto`` choice printed on stdout.

    python -m blitz.loading.child_main build SPEC_JSON PATH CACHE_DIR
    python -m blitz.loading.child_main choose SPEC_JSON PATH CACHE_DIR THREADS TIMEOUT_S

``PATH`` is the model's folder, resolved and checked by the parent; ``CACHE_DIR`` may be
empty (the default cache). A choice opens each candidate through the loader's one opener
(``blitz.loading.opening.open_backend``) with what is left of the parent's deadline.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

from blitz.loading.child_work import CHOICE_MARK
from blitz.settings.kinds import kind_of
from blitz.settings.registry import ModelSpec


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    kind, spec, path = argv[0], ModelSpec.model_validate_json(argv[1]), Path(argv[2])
    cache_dir = argv[3] or None
    if kind == "build":
        if kind_of(spec.kind).opens == "two-towers":
            from blitz.loading.dual_export import prepare_dual_onnx

            prepare_dual_onnx(spec, path, cache_dir)
        else:
            from blitz.loading.onnx_export import prepare_onnx

            prepare_onnx(spec, path, cache_dir)
        return 0
    from blitz.loading.auto import measure_choice
    from blitz.loading.opening import Load, open_backend
    from blitz.runtime import model_threads

    threads, timeout_s = int(argv[4]), float(argv[5])
    model_threads.configure(threads)
    load = Load(spec, "cpu", cache_dir, time.monotonic() + timeout_s)
    choice, _ = measure_choice(spec, lambda name: open_backend(load, path, name))
    print(CHOICE_MARK + choice.to_json(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
