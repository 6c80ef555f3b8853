"""The HTML report's smoothed line (``reports.chart_data.smooth``) equals the filter it replaced.

The definition, written here as it was in the report: the debiased first-order IIR filter
``lfilter([alpha], [1, alpha - 1], x) / (1 - (1 - alpha)**k)`` over the values with every non-finite value
replaced by the last finite one (``k``: points since the first finite value; NaN before it). The report now
computes it with polars' ``ewm_mean(adjust=True)`` (no ``scipy.signal`` import): the same numbers to rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

from reports.chart_data import smooth

SEEDS = range(40)


def _by_lfilter(values: np.ndarray, span: int | None = None) -> np.ndarray:
    """The definition (the report's code before: ``scipy.signal.lfilter``)."""
    from scipy.signal import lfilter

    n = values.size
    if n == 0:
        return values.astype(np.float64)
    span = span or max(5, n // 100)
    alpha = 2.0 / (span + 1.0)
    idx = np.where(np.isfinite(values), np.arange(n), -1)
    np.maximum.accumulate(idx, out=idx)
    filled = np.where(idx >= 0, values[np.maximum(idx, 0)], 0.0)
    started = idx >= 0
    k = np.cumsum(started)
    ema = lfilter([alpha], [1.0, -(1.0 - alpha)], np.where(started, filled, 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        out = ema / (1.0 - (1.0 - alpha) ** np.maximum(k, 1))
    out[~started] = np.nan
    return out


def _same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == np.float64 and got.shape == want.shape
    assert np.array_equal(np.isnan(got), np.isnan(want))
    m = ~np.isnan(want)
    np.testing.assert_allclose(got[m], want[m], rtol=1e-12, atol=0)


@pytest.mark.parametrize("seed", SEEDS)
def test_smooth_equals_the_debiased_iir_filter(seed: int) -> None:
    """Random series (scales 1e-8 to 1e8, either sign), NaN/+inf/-inf inside, a non-finite prefix in some."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 200_000 if seed % 8 == 0 else 3_000))
    values = np.exp(rng.normal(size=n) * rng.uniform(0, 3)).cumsum() * rng.choice([1.0, -1.0, 1e-8, 1e8])
    for _ in range(int(rng.integers(0, 5))):
        values[rng.integers(0, n)] = rng.choice([np.nan, np.inf, -np.inf])
    if seed % 3 == 0:
        values[: int(rng.integers(0, n)) + 1] = np.nan
    span = None if seed % 2 else int(rng.integers(1, 50))
    _same(smooth(values, span), _by_lfilter(values, span))


@pytest.mark.parametrize("values", [np.array([]), np.array([np.nan]), np.array([np.inf, -np.inf]),
                                    np.array([3.0]), np.array([np.nan, 2.0, np.nan, 4.0]),
                                    np.full(10, 1.5), np.arange(7, dtype=np.float64)])
def test_smooth_edge_cases(values: np.ndarray) -> None:
    """Empty, all non-finite, one point, constant: the same as the definition."""
    _same(smooth(values), _by_lfilter(values))
