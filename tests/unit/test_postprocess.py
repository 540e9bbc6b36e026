from __future__ import annotations

import numpy as np
import pytest

from blitz.encoders.postprocess import quantize, truncate_dimensions
from blitz.errors import InvalidValue


def unit_rows(n=4, d=16, seed=0):
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_matryoshka_truncation():
    x = unit_rows()
    cut = truncate_dimensions(x, 8, normalize=True)
    assert cut.shape == (4, 8) and np.allclose(np.linalg.norm(cut, axis=1), 1, atol=1e-6)
    assert np.allclose(truncate_dimensions(x, 8, normalize=False), x[:, :8])
    assert truncate_dimensions(x, None, True) is x
    with pytest.raises(InvalidValue, match="dimensions=17.*16"):
        truncate_dimensions(x, 17, True)


def test_quantization_is_batch_independent_and_keeps_similarity():
    x = unit_rows(8, 64)
    q = quantize(x, "int8")
    assert q.dtype == np.int8 and np.array_equal(quantize(x[:1], "int8"), q[:1])
    cos = (q[0].astype(np.float32) @ q[1]) / np.linalg.norm(q[0]) / np.linalg.norm(q[1])
    assert abs(cos - float(x[0] @ x[1])) < 0.02


def test_quantization_scales_rounds_and_clips():
    x = np.array([[-1.3, -1.0, -0.5, 0.0, 0.25, 0.5, 1.0, 1.2]], dtype=np.float32)
    assert quantize(x, "int8").tolist() == [[-127, -127, -64, 0, 32, 64, 127, 127]]
    assert quantize(x, "uint8").tolist() == [[0, 0, 64, 128, 159, 191, 255, 255]]
    half = quantize(x, "float16")
    assert half.dtype == np.float16 and half[0, 1:7].tolist() == [-1, -0.5, 0, 0.25, 0.5, 1]
    assert abs(float(half[0, 0]) + 1.3) < 1e-3
    with pytest.raises(InvalidValue, match="dtype 'int4'"):
        quantize(x, "int4")


def test_binary_packs_sign_bits():
    x = np.array([[1, -1, 1, -1, 1, -1, 1, -1, 1]], dtype=np.float32)
    ub = quantize(x, "ubinary")
    assert ub.shape == (1, 2) and ub[0, 0] == 0b10101010 and ub[0, 1] == 0b10000000
    assert quantize(x, "binary")[0, 0] == 0b10101010 - 128
