"""The child process of ``blitz.loading.children``: one ONNX build, or one ``cpu_backend:
auto`` choice printed on stdout.

    python -m blitz.loading.child build SPEC_JSON PATH [CACHE_DIR]
    python -m blitz.loading.child choose SPEC_JSON THREADS [CACHE_DIR]
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from blitz.loading.children import CHOICE_MARK
from blitz.settings.registry import ModelSpec


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    kind, spec, argument = argv[0], ModelSpec.model_validate_json(argv[1]), argv[2]
    cache_dir = argv[3] if len(argv) > 3 else None
    if kind == "build":
        from blitz.loading.onnx_export import prepare_onnx

        prepare_onnx(spec, Path(argument), cache_dir)
        return 0
    from blitz.loading.auto import measure_choice
    from blitz.loading.load import load_encoder
    from blitz.runtime import model_threads

    model_threads.configure(int(argument))
    choice, _ = measure_choice(spec, lambda name: load_encoder(
        spec.model_copy(update={"cpu_backend": name}), "cpu", cache_dir))
    print(CHOICE_MARK + choice.to_json(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
