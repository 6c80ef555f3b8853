"""DB02's centred excursion: the sorting-network median equals the per-row ``np.nanmedian`` it replaced."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from forensics.detectors import data_recurring_batch as db
from forensics.stats import MAD_TO_SIGMA


def _reference(lx: np.ndarray, k: int) -> np.ndarray:
    """The definition: (x - nanmedian of the k finite-or-not neighbours on each side) / sigma, per row."""
    n = lx.shape[0]
    ok = np.isfinite(lx)
    if ok.sum() < 2 * k + 1:
        return np.full(n, np.nan)
    d = np.diff(lx[ok])
    sigma = max(MAD_TO_SIGMA * float(np.median(np.abs(d - np.median(d)))) / db.DIFF_NOISE, db.SIGMA_FLOOR)
    pad = np.concatenate([np.full(k, np.nan), lx, np.full(k, np.nan)])
    win = np.lib.stride_tricks.sliding_window_view(pad, 2 * k + 1)
    sides = np.concatenate([win[:, :k], win[:, k + 1:]], axis=1)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        has = np.isfinite(win[:, :k]).any(axis=1) & np.isfinite(win[:, k + 1:]).any(axis=1)
        med = np.nanmedian(np.where(has[:, None], sides, 0.0), axis=1)
        return np.where(ok & has, (lx - med) / sigma, np.nan)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("k", [3, 2])
def test_centred_excursion_equals_the_per_row_median(seed: int, k: int) -> None:
    """Random logs with NaN gaps and ties: the same excursion, value for value (k=3: the network; k=2: the rest)."""
    rng = np.random.default_rng(seed)
    for _ in range(10):
        n = int(rng.integers(0, 2000))
        lx = rng.normal(size=n).round(int(rng.integers(0, 4)))  # rounding: ties, as a loss logged with few digits
        if n:
            lx[rng.random(n) < rng.random() * 0.3] = np.nan
        np.testing.assert_array_equal(db.centred_excursion(lx, k), _reference(lx, k))
