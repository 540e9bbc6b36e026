"""What the CPU can do: the int8 configuration and native bf16, read from its flags."""

from __future__ import annotations

import pytest

from blitz.runtime import cpu_features


@pytest.mark.parametrize(("flags", "machine", "expected"), [
    ({"avx2", "avx512f", "avx512bw", "avx512_vnni"}, "x86_64", "avx512_vnni"),
    ({"avx2", "avx512f", "avx512bw"}, "x86_64", "avx512"),
    ({"avx2", "fma"}, "x86_64", "avx2"),
    ({"sse4_2"}, "x86_64", "avx2"),
    ({"asimd", "bf16"}, "aarch64", "arm64"),
])
def test_quantization_target_follows_the_cpu(flags, machine, expected):
    assert cpu_features.quantization_target(frozenset(flags), machine) == expected


def test_bf16_support_is_read_from_the_flags():
    assert cpu_features.cpu_supports_bf16(frozenset({"avx512f", "avx512_bf16"}))
    assert cpu_features.cpu_supports_bf16(frozenset({"amx_bf16"}))
    assert not cpu_features.cpu_supports_bf16(frozenset({"avx2", "avx512f"}))


