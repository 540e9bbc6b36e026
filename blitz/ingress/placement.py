"""Why a pool replica waits for the cluster: what it claims against what is free.

A replica Serve cannot place waits without a word from Serve (``serve status`` says only
"Upscaling"); the ingress watches for one (``deployments/placement.py``) and says why in
these words: in a WARNING, in ``/ready`` and ``/models``.
"""

from __future__ import annotations

from collections.abc import Mapping


def short_of(claim: Mapping[str, float], free: Mapping[str, float]) -> list[str]:
    """The resources ``claim`` needs more of than ``free`` has."""
    return [name for name, amount in claim.items() if amount > free.get(name, 0.0) + 1e-9]


def _amounts(resources: Mapping[str, float], names: list[str]) -> str:
    def one(name: str) -> str:
        amount = resources.get(name, 0.0)
        if name == "memory":
            return f"memory {amount / 2**30:.1f} GiB"
        return f"{name} {amount:g}"

    return ", ".join(one(name) for name in names) or "nothing"


def unplaced_message(section: str, deployment: str, claim: Mapping[str, float],
                     free: Mapping[str, float], waited_s: float) -> str:
    """One sentence an operator can act on: the deployment (``section`` of the config:
    ``cpu_pool``, ``gpu_pool``, ``ingress``), what its replica claims, what is free."""
    names = list(claim)
    short = short_of(claim, free)
    head = (f"{deployment} ({section}) has a replica Ray has not placed for "
            f"{waited_s:.0f} s: it claims {_amounts(claim, names)} and the cluster has "
            f"{_amounts(free, names)} free")
    if short:
        return (f"{head} (short of {', '.join(short)}). Free that much (another pool's "
                f"claim, a bigger node) or lower {section}.deployment.ray_actor_options")
    return (f"{head}, yet no node takes it: check the node's custom resources and labels "
            "in `ray status`")


SECTIONS = {"CPUPool": "cpu_pool", "GPUPool": "gpu_pool", "Ingress": "ingress",
            "IngressWithCpuPool": "ingress"}
"""Each of Blitz's deployments: the config section whose ``deployment:`` block it takes."""
