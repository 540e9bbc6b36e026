"""The load generator's reply checks (loadtest.verify)."""

from __future__ import annotations

import numpy as np
import pytest

from loadtest.verify import ReplyChecker, VerificationError


def test_checker_catches_count_dimension_and_nonfinite():
    checker = ReplyChecker()
    checker.check(np.ones((3, 4), np.float32), 3)
    assert checker.dimension == 4
    cases = [(np.ones((2, 4), np.float32), "count"), (np.ones((3, 5), np.float32), "dimension"),
             (np.ones(3, np.float32), "malformed")]
    for bad_value in (np.nan, np.inf):
        array = np.ones((3, 4), np.float32)
        array[1, 2] = bad_value
        cases.append((array, "nonfinite"))
    for array, reason in cases:
        with pytest.raises(VerificationError) as info:
            checker.check(array, 3)
        assert info.value.kind == f"verify_{reason}"
    with pytest.raises(VerificationError, match="dimension"):
        ReplyChecker(dimension=8).check(np.ones((1, 4), np.float32), 1)
