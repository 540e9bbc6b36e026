"""What this CPU can do fast: its feature flags, the int8 configuration that suits it,
and whether it computes bf16 natively."""

from __future__ import annotations

import os
import platform
import re
from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU feature flags (``/proc/cpuinfo`` flags on x86, Features on ARM)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    match = re.search(r"^(?:flags|Features)\s*:\s*(.*)$", text, re.MULTILINE)
    return frozenset(match.group(1).split()) if match else frozenset()


def quantization_target(flags: frozenset[str] | None = None,
                        machine: str | None = None) -> str:
    """The int8 quantization config that suits this CPU, best first.

    ``avx512_vnni`` (and AVX-VNNI) has int8 dot-product instructions; ``avx512`` and
    ``avx2`` use reduced-range weights; ARM gets ``arm64``. An x86 CPU older than AVX2
    gets ``avx2`` too: onnxruntime still runs it, only without the fast kernels.
    """
    flags = cpu_flags() if flags is None else flags
    machine = (machine or platform.machine()).lower()
    if machine in ("arm64", "aarch64") or machine.startswith("armv8"):
        return "arm64"
    if "avx512_vnni" in flags or "avx512vnni" in flags:
        return "avx512_vnni"
    if "avx512f" in flags and "avx512bw" in flags:
        return "avx512"
    return "avx2"


def cpu_supports_bf16(flags: frozenset[str] | None = None) -> bool:
    """Whether the CPU computes bf16 natively (AVX512-BF16, AMX, or ARM BF16)."""
    flags = cpu_flags() if flags is None else flags
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


# flags that name instruction sets a model runtime may use (not, say, "hypervisor")
_ISA_FLAG = re.compile(r"^(avx|amx|fma|f16c|sse|ssse|vnni|bf16|i8mm|asimd|sve|fp16|dotprod)")


@lru_cache(maxsize=1)
def cpu_model_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``; the platform's processor string elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    match = re.search(r"^model name\s*:\s*(.*)$", text, re.MULTILINE)
    return match.group(1).strip() if match else platform.processor()


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask where there is one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cpu_identity(flags: frozenset[str] | None = None) -> dict[str, object]:
    """What about this CPU decides which backend is fastest: the architecture, the model,
    its instruction-set flags (AVX2, AVX512, VNNI, BF16, AMX, ...) and the usable cores."""
    flags = cpu_flags() if flags is None else flags
    return {"machine": platform.machine().lower(), "model": cpu_model_name(),
            "isa": sorted(flag for flag in flags if _ISA_FLAG.match(flag)),
            "cores": usable_cores()}
