"""Unit tests of the statistics behind the detectors (constructed inputs with known answers)."""

from __future__ import annotations

import numpy as np

from forensics.detectors.data_ordering_shift import level_shift
from forensics.detectors.precursor_drift import hinge_onset
from forensics.stats import EXACT_LIMIT, trailing_robust_z


def test_rolling_z_matches_exact_on_a_spike() -> None:
    """The polars rolling path (long runs) and the exact path agree on where a spike is."""
    rng = np.random.default_rng(0)
    x = rng.normal(0.0, 1.0, 60_000)
    x[50_000] = 12.0
    assert x.size * 128 > EXACT_LIMIT  # the rolling path
    z, med, sig = trailing_robust_z(x, window=128)
    assert z[50_000] > 8
    assert np.nanmax(np.abs(z[1000:49_000])) < 7
    z_exact, _, _ = trailing_robust_z(x[49_000:50_001], window=128)
    assert abs(z_exact[-1] - z[50_000]) / z_exact[-1] < 0.2


def test_hinge_finds_the_start_of_a_ramp() -> None:
    """A noisy series that starts ramping at step 1000 gets an onset at or shortly after 1000."""
    rng = np.random.default_rng(1)
    steps = np.arange(1, 1401)
    v = 0.5 * (1 + rng.normal(0, 0.05, steps.size))
    v[steps >= 1000] *= 1 + (steps[steps >= 1000] - 1000) / 100
    onset = hinge_onset(steps, v, detected=1150)
    assert onset is not None and 1000 <= onset <= 1040


def test_level_shift_with_trend() -> None:
    """A 2% step on a decaying curve is found at its step with a large t-statistic."""
    rng = np.random.default_rng(2)
    s = np.arange(0, 1000, 10.0)
    y = 3.0 - 0.0004 * s + rng.normal(0, 0.005, s.size)
    y[s >= 600] += 0.06
    t, d, tstat = level_shift(s, y)
    assert t == 600 and abs(d - 0.06) < 0.01 and tstat > 10


def test_level_shift_equals_one_least_squares_fit_per_split() -> None:
    """DO01's O(n) level-shift scan equals a full OLS fit ``y ~ 1 + x + x^2 + d [step >= t]`` per split.

    It used to run that fit per split (O(n^2): minutes at 200k steps with an eval loss logged).
    """
    from forensics.detectors.data_ordering_shift import level_shift

    def brute(s: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
        x = (s - s.mean()) / s.std()
        best = None
        for tt in s[5:len(s) - 5]:
            a = np.column_stack([np.ones(len(s)), x, x * x, (s >= tt).astype(float)])
            coef, *_ = np.linalg.lstsq(a, y, rcond=None)
            r = y - a @ coef
            se = np.sqrt(r @ r / (len(s) - 4) * np.linalg.inv(a.T @ a)[3, 3])
            if best is None or coef[3] / se > best[2]:
                best = (float(tt), float(coef[3]), float(coef[3] / se))
        return best

    rng = np.random.default_rng(1)
    for n in (13, 40, 300):
        s = np.sort(rng.choice(np.arange(1, 10 * n), n, replace=False)).astype(float)
        y = np.exp(-s / n) + rng.normal(0, 0.05, n) + 0.2 * (s >= s[n // 2])
        got, want = level_shift(s, y), brute(s, y)
        assert got[0] == want[0] and np.allclose(got[1:], want[1:], rtol=1e-6)
