"""The output check (`tuner.gpu.checks.check_output`) with NumPy standing in for CuPy: matches, mismatches, NaNs,
relative tolerance and shapes."""

from __future__ import annotations

import numpy as np
import pytest

from tuner.gpu import checks


def test_check_output_accepts_an_exact_match():
    ref = np.linspace(-3, 3, 101)
    check = checks.check_output(np, "y", ref.astype(np.float32), ref, 1e-6)
    assert check.ok and check.max_abs_error < 1e-6


def test_check_output_counts_mismatches_and_nans():
    ref = np.arange(10, dtype=np.float64)
    out = ref.astype(np.float32)
    out[3] = 100.0
    out[7] = np.nan
    check = checks.check_output(np, "y", out, ref, 1e-4)
    assert not check.ok
    assert (check.mismatches, check.nan_count) == (2, 1)
    assert check.max_abs_error == pytest.approx(97.0)
    assert check.max_rel_error == pytest.approx(97.0 / 3.0)
    text = check.describe()
    assert "2 of 10" in text and "max abs error 97" in text and "max rel error" in text and "1 NaN" in text


def test_check_output_tolerance_is_relative_to_large_values():
    ref = np.array([1e6, 1.0])
    out = np.array([1e6 + 50.0, 1.0])  # 5e-5 relative
    assert checks.check_output(np, "y", out, ref, 1e-4).ok
    assert not checks.check_output(np, "y", out, ref, 1e-5).ok


def test_check_output_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match="shape"):
        checks.check_output(np, "y", np.zeros((4, 4)), np.zeros(16), 0.0)
