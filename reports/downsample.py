"""Display downsampling of long series: the min and max of each bucket, full resolution around the onset.

Display only: detection never sees these arrays; the full data is in the JSON/Parquet outputs.
"""

from __future__ import annotations

import numpy as np

BUCKETS = 2000
"""Display buckets per chart (min and max of each kept)."""
MAX_FULL_RES = 4000
"""At most this many full-resolution points around the onset per chart."""
MAX_MARKERS = 600
"""Non-finite markers per chart after merging markers closer than 1/1000 of the x range."""


def minmax_indices(values: np.ndarray, buckets: int = BUCKETS) -> np.ndarray:
    """Indices that keep the min and max finite value of each bucket (display downsampling).

    A bucket with non-finite values also keeps its first non-finite point, so the drawn line
    breaks there. The first and last points are always kept.

    Args:
        values: float64 values in step order.
        buckets: Number of equal-count buckets.

    Returns:
        Sorted unique indices into ``values``.
    """
    n = int(values.shape[0])
    if n <= 2 * buckets:
        return np.arange(n)
    size = -(-n // buckets)
    finite = np.isfinite(values)
    if finite.all():  # the common case: the full buckets as a view, the last (partial) one apart, no copy
        full = (n // size) * size
        body = values[:full].reshape(-1, size)
        base = np.arange(body.shape[0]) * size
        parts = [body.argmin(axis=1) + base, body.argmax(axis=1) + base, [0, n - 1]]
        if full < n:
            parts.append([full + int(values[full:].argmin()), full + int(values[full:].argmax())])
        return np.unique(np.concatenate(parts))
    return _minmax_padded(values, finite, size)


def _minmax_padded(values: np.ndarray, finite: np.ndarray, size: int) -> np.ndarray:
    """:func:`minmax_indices` of a series with non-finite values: buckets of ``size`` padded to a rectangle."""
    n = int(values.shape[0])
    nb = -(-n // size)
    pad = nb * size - n
    lo = np.concatenate([np.where(finite, values, np.inf), np.full(pad, np.inf)]).reshape(nb, size)
    hi = np.concatenate([np.where(finite, values, -np.inf), np.full(pad, -np.inf)]).reshape(nb, size)
    bad = np.concatenate([~finite, np.zeros(pad, dtype=bool)]).reshape(nb, size)
    base = np.arange(nb) * size
    ok = np.isfinite(lo.min(axis=1))
    imin = (lo.argmin(axis=1) + base)[ok]
    imax = (hi.argmax(axis=1) + base)[ok]
    has_bad = bad.any(axis=1)
    ibad = (bad.argmax(axis=1) + base)[has_bad]
    idx = np.concatenate([imin, imax, ibad, [0, n - 1]])
    return np.unique(idx[idx < n])


def display_indices(
    steps: np.ndarray, values: np.ndarray, window: tuple[int, int] | None, onset: int | None,
    buckets: int = BUCKETS,
) -> np.ndarray:
    """Downsampled indices plus full resolution inside ``window`` (capped around the onset).

    Args:
        steps: int64 steps, increasing.
        values: float64 values.
        window: ``(lo, hi)`` steps kept at full resolution, or ``None``.
        onset: Onset step (centre of the cap when the window holds too many points).
        buckets: Display buckets.

    Returns:
        Sorted unique indices into the series.
    """
    idx = minmax_indices(values, buckets)
    if window is None or steps.size == 0:
        return idx
    a = int(np.searchsorted(steps, window[0], side="left"))
    b = int(np.searchsorted(steps, window[1], side="right"))
    if b - a > MAX_FULL_RES:
        c = int(np.searchsorted(steps, onset if onset is not None else steps[(a + b) // 2]))
        a, b = max(a, c - MAX_FULL_RES // 2), min(b, c + MAX_FULL_RES // 2)
    return np.union1d(idx, np.arange(a, b))


def zoom_window(steps: np.ndarray, onset: int) -> tuple[int, int]:
    """Onset +- max(50, 10% of the run's step span)."""
    span = int(steps[-1] - steps[0]) if steps.size else 0
    half = max(50, span // 10)
    return onset - half, onset + half


