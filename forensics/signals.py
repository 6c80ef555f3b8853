"""Shared departure analysis used by several detectors (computed once per run and metric).

A *departure* of a positive series (loss, grad norm, update ratio) is a point whose robust z
on the log scale against the trailing window reaches ``spike_z`` (OLMo-core: 6 sigma over the
last 128 values, ``stability_monitor.py``), or a non-finite value; its onset is found by
walking back while z >= ``onset_z`` (3; docs/detectors.md#onset-backtracking).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from forensics.model import RunData, Series
from forensics.rolling import rolling_median, shifted
from forensics.stats import MAD_TO_SIGMA, backtrack_onset, to_log, trailing_robust_z

SPIKE_Z = 6.0
"""Spike threshold in robust sigmas (OLMo-core StabilityMonitorCallback, 6 sigma / 128 steps)."""
ONSET_Z = 3.0
"""Back-tracking threshold in robust sigmas (docs/detectors.md#conventions)."""
WINDOW = 128
"""Trailing window length in logged points (OLMo-core default)."""
MIN_REL_JUMP = 0.10
"""A spike must also exceed the trailing median by 10% (log 1.1): guards over-smooth series. Our choice."""
MIN_Z_POINTS = 8
"""Fewest logged points of a metric for any z at all (our choice: fewer is no history to compare with)."""
MIN_WINDOW_POINTS = 12
"""Finite points the trailing window needs before a z is defined (docs/detectors.md#conventions)."""
SIGMA_FLOOR = 0.01
"""Floor of the spread in log units, so a perfectly smooth series gives no huge z (docs/detectors.md#conventions)."""


@dataclass(frozen=True)
class Departure:
    """One departure of a series from its own trailing band.

    Attributes:
        metric: canonical metric.
        index: position of the detection point in the series.
        step: step of the detection point (first point with z >= SPIKE_Z or non-finite).
        onset_step: first step of the excursion (back-tracked while z >= ONSET_Z).
        onset_index: its position.
        z: robust z at the detection point (inf for a non-finite value).
        value: value at the detection point.
        baseline: trailing median at the detection point (linear units).
        peak: largest finite value within the excursion.
        recovered_step: first step after the detection where the series is back inside
            2 sigma of the pre-spike median and stays there for 10 points; None if never.
        nonfinite: True when the detection point is NaN/inf.
    """

    metric: str
    index: int
    step: int
    onset_step: int
    onset_index: int
    z: float
    value: float
    baseline: float
    peak: float
    recovered_step: int | None
    nonfinite: bool


def zscores(run: RunData, metric: str) -> tuple[Series, np.ndarray, np.ndarray, np.ndarray] | None:
    """Robust z (log scale) of a positive metric against its trailing window, cached per run."""
    return run.cached(f"__z__{metric}", lambda: _zscores(run, metric))


def _zscores(run: RunData, metric: str) -> tuple[Series, np.ndarray, np.ndarray, np.ndarray] | None:
    """:func:`zscores`, not cached."""
    s = run.series(metric)
    if s is None or len(s) < MIN_Z_POINTS:
        return None
    lx = to_log(s.values)
    z, med, sig = trailing_robust_z(lx, window=WINDOW, min_points=MIN_WINDOW_POINTS, abs_floor=SIGMA_FLOOR)
    if metric == "loss":  # the objective falls fast early on; grad norms keep their trailing band
        z = _trend_robust_z(lx, z, med, sig)
    return s, lx, z, np.exp(med)


LOCAL = 16
"""Points of the short trailing median that centres the trend-robust z (our choice)."""
LOCAL_MIN_POINTS = 8
"""Finite points the short trailing median needs (half of :data:`LOCAL`; our choice)."""
NOISE_MIN_POINTS = 10
"""Finite differences the trailing noise of first differences needs (our choice)."""
TREND_Z_MIN_POINTS = 24
"""Fewest finite points for the trend-robust z (our choice: twice the :data:`MIN_WINDOW_POINTS` a trailing z needs)."""


def _trend_robust_z(lx: np.ndarray, z: np.ndarray, med: np.ndarray, sig: np.ndarray) -> np.ndarray:
    """The larger of the trailing z and a trend-robust z (log values, shape (n,)).

    While the loss falls fast (the first hundreds of steps), the 128-point MAD measures the trend, not the
    noise, and hides spikes. The trend-robust z centres each point on the median of its last ``LOCAL`` (16)
    finite points and scales by the noise of first differences (1.4826 MAD of diff / sqrt 2 over the trailing
    window; differences cancel a slow trend), floored at 0.01 as the trailing z is. It is only used where it
    is defined (enough history) and only ever raises z for a point ABOVE both medians.
    """
    n = lx.shape[0]
    if n < TREND_Z_MIN_POINTS:
        return z
    ok = np.isfinite(lx)
    idx = np.flatnonzero(ok)
    if idx.size < TREND_Z_MIN_POINTS:
        return z
    import polars as pl

    v = lx[idx]
    # |diff| ending at point j-1 (so the point judged is not in its own noise estimate)
    d = np.concatenate([[np.nan], np.abs(np.diff(v))])
    noise_med = shifted(rolling_median(d, np.isnan(d), WINDOW, NOISE_MIN_POINTS), 2)
    local = pl.Series("v", v).rolling_median(window_size=LOCAL, min_samples=LOCAL_MIN_POINTS).shift(1) \
        .fill_null(float("nan")).to_numpy()
    noise = np.maximum(MAD_TO_SIGMA * noise_med / np.sqrt(2), SIGMA_FLOOR)
    with np.errstate(all="ignore"):
        zt = (v - local) / noise
    out = z.copy()
    m = med[idx]
    better = np.isfinite(zt) & np.isfinite(m) & (v > m) & (v > local) & (~np.isfinite(out[idx]) | (zt > out[idx]))
    better[:MIN_WINDOW_POINTS] = False
    out[idx[better]] = zt[better]
    return out


HELD_POINTS = 10
"""Points a held level shift of the loss spans (our choice: about the steps a changed lr takes to be undone)."""
HELD_START_Z = 4.0
"""Robust z the first point of a held shift reaches (our choice: above the 3 of the onset back-tracking)."""
HELD_Z = 2.0
"""Median robust z of the HELD_POINTS points from there (our choice: ten i.i.d. points hold a median z >= 2
about once in a million windows; on the corpus's healthy runs and the user test's healthy seeds none does)."""


def _held(z: np.ndarray) -> np.ndarray:
    """Points whose z is >= HELD_START_Z and whose next HELD_POINTS z (with it) have a median >= HELD_Z.

    Only the points that reach HELD_START_Z have their window's median taken (few: linear in the points).
    """
    out = np.zeros(z.shape[0], dtype=bool)
    if z.shape[0] < HELD_POINTS:
        return out
    zz = np.where(np.isfinite(z), z, np.nan)
    with np.errstate(all="ignore"):
        starts = np.flatnonzero(zz[:z.shape[0] - HELD_POINTS + 1] >= HELD_START_Z)
    if starts.size:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            held = np.nanmedian(zz[starts[:, None] + np.arange(HELD_POINTS)], axis=1)
        out[starts[held >= HELD_Z]] = True
    return out


def departures(run: RunData, metric: str, limit: int = 20) -> list[Departure]:
    """Departures of ``metric`` in step order (at most ``limit``); [] if the metric is absent."""
    zs = zscores(run, metric)
    if zs is None:
        return []
    s, lx, z, med = zs
    vals = s.values
    scaler = scaler_skips(run, s) if metric == "grad_norm" else None
    with np.errstate(all="ignore"):
        nonfinite = ~np.isfinite(vals) if scaler is None else ~np.isfinite(vals) & ~scaler
        big = np.isfinite(z) & (z >= SPIKE_Z) & np.isfinite(med) & (vals > med * (1 + MIN_REL_JUMP))
        if metric == "loss":  # a level shift held for HELD_POINTS points is a departure too (user test U10)
            big |= _held(z) & np.isfinite(med) & (vals > med * (1 + MIN_REL_JUMP))
    cands = np.flatnonzero(nonfinite | big)
    out: list[Departure] = []
    i = 0
    while len(out) < limit:
        nxt = cands[np.searchsorted(cands, i):][:1]
        if nxt.size == 0:
            break
        i = int(nxt[0])
        onset_i = backtrack_onset(z, i, ONSET_Z)
        k, peak = _recovery(vals, lx, z, med, i, onset_i)
        out.append(
            Departure(
                metric=metric, index=i, step=int(s.steps[i]), onset_step=int(s.steps[onset_i]),
                onset_index=onset_i, z=float("inf") if nonfinite[i] else float(z[i]), value=float(vals[i]),
                baseline=float(med[i]) if np.isfinite(med[i]) else float("nan"), peak=peak,
                recovered_step=int(s.steps[k]) if k is not None else None, nonfinite=bool(nonfinite[i]),
            )
        )
        if k is None:
            break
        i = max(k, i + 1)
    return out


RECOVERY_POINTS = 10
"""Consecutive points back inside the band that make a recovery (our choice, docs/detectors.md#conventions)."""
FALLBACK_SIGMA = 0.05
"""Band half-width (log units, per sigma) when the onset's sigma cannot be read back from its z (our choice)."""


def _recovery(vals: np.ndarray, lx: np.ndarray, z: np.ndarray, med: np.ndarray, i: int,
              onset_i: int) -> tuple[int | None, float]:
    """(index of the recovery after detection point ``i``, peak of the excursion up to it).

    The band is the pre-spike trailing median (log) plus 2 robust sigmas, the sigma read back from the onset's
    z (0.05 when it cannot be); the recovery is the first later point from which :data:`RECOVERY_POINTS`
    points (or all the remaining ones) are finite and inside the band. The peak is the largest finite value
    from ``i`` to the recovery (to the end when there is none; NaN when nothing there is finite).
    """
    n = vals.shape[0]
    base_med, base_sig = med[onset_i], None
    zi = z[onset_i]
    if np.isfinite(zi) and np.isfinite(lx[onset_i]) and zi != 0:
        base_sig = (lx[onset_i] - np.log(base_med)) / zi
    width = base_sig if base_sig and base_sig > 0 else FALLBACK_SIGMA
    k: int | None = None
    if np.isfinite(base_med) and i + 1 < n:
        band = np.log(base_med) + 2 * width
        with np.errstate(invalid="ignore"):
            good = np.isfinite(lx[i + 1:]) & (lx[i + 1:] <= band)
        c = np.concatenate([[0], np.cumsum(good)])
        m = good.shape[0]
        start = np.arange(m)
        stop = np.minimum(start + RECOVERY_POINTS, m)
        ok = good & ((c[stop] - c[start]) == (stop - start))
        if ok.any():
            k = i + 1 + int(np.argmax(ok))
    span = vals[i:(k + 1 if k is not None else n)]
    fin = span[np.isfinite(span)]
    return k, float(fin.max()) if fin.size else float("nan")


IMPROVE_PARTS = 4
"""The loss after a step is split in quarters: the last one's median must be below the first's (our choice)."""


def loss_improves_after(run: RunData, step: int, min_points: int = 8) -> tuple[float, float] | None:
    """(early, late) loss medians after ``step`` when the loss keeps improving to the end, else None.

    The loss from ``step`` on (up to its first non-finite value) is split in quarters; it keeps improving
    when the last quarter's median is below the first quarter's. Evidence AGAINST a slow-growth
    cause: a run whose objective keeps falling is not diverging (STYLE: evidence for and against).

    Args:
        run: The run.
        step: First step considered.
        min_points: Fewest finite points needed after ``step``.

    Returns:
        (early median, late median) in loss units, or None when the loss does not keep improving or is absent.
    """
    s = run.series("loss")
    if s is None or len(s) < min_points:
        return None
    v = s.values[s.steps >= step]
    bad = np.flatnonzero(~np.isfinite(v))
    if bad.size:  # up to the failure: a loss that kept improving until a sudden NaN did not drift there
        v = v[:bad[0]]
    if v.size < min_points:
        return None
    k = max(2, v.size // IMPROVE_PARTS)
    early, late = float(np.median(v[:k])), float(np.median(v[-k:]))
    return (early, late) if late < early else None


def scaler_skips(run: RunData, s: Series) -> np.ndarray | None:
    """Which points of a grad-norm series are a dynamic loss scaler's overflow check (bool, same length).

    An fp16 run with a dynamic scaler (a logged ``loss_scale``) sees an inf/NaN gradient whenever the scaled
    gradients overflow; the scaler then skips the step and halves the scale (torch GradScaler, DeepSpeed,
    Megatron). A non-finite grad norm at a step whose loss is finite, in such a run, is that normal check, not a
    departure (it recurs at calibration and at every growth probe). None when the run has no loss scale.
    """
    if not run.has("loss_scale"):
        return None
    return run.cached(f"__scaler_skips__{s.source}", lambda: _scaler_skips(run, s))


def _scaler_skips(run: RunData, s: Series) -> np.ndarray:
    """:func:`scaler_skips` of a run with a loss scale, not cached."""
    loss = run.series("loss")
    out = ~np.isfinite(s.values)
    if loss is not None and len(loss):
        idx = np.clip(np.searchsorted(loss.steps, s.steps), 0, len(loss) - 1)
        same = loss.steps[idx] == s.steps
        finite_loss = np.where(same, np.isfinite(loss.values[idx]), True)
        out &= finite_loss
    return out
