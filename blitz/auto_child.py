"""The child process of ``cpu_backend: auto`` (``blitz.encoders.auto.choose_in_child``).

Choosing opens every candidate backend (torch, torch-bf16, onnx, onnx-int8) and times
them; closing the losers afterwards does not give all their memory back: a CPU pool
replica that chose in process idled ~170 MiB above one that opened only the winner
(BENCHMARKS.md, "Memory per process"). This process runs ``measure_choice`` with the
caller's thread count and prints the ``AutoChoice``; the caller then opens the winners
(their ONNX builds are cached by then).

    python -m blitz.auto_child SPEC_JSON THREADS [CACHE_DIR]
"""

from __future__ import annotations

import logging
import sys

from blitz.encoders.auto import CHILD_MARK, measure_choice
from blitz.encoders.loading import load_encoder
from blitz.registry import ModelSpec


def main(argv: list[str]) -> int:
    import torch

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    spec = ModelSpec.model_validate_json(argv[0])
    torch.set_num_threads(int(argv[1]))
    cache_dir = argv[2] if len(argv) > 2 else None
    choice, _ = measure_choice(spec, lambda name: load_encoder(
        spec.model_copy(update={"cpu_backend": name}), "cpu", cache_dir))
    print(CHILD_MARK + choice.to_json(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
