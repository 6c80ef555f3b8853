"""Shapes of a learning-rate schedule across a resume: extrapolation, replay, constant scale, linear horizons.

What :class:`forensics.detectors.lr_schedule_reset.LRScheduleReset` (LR01, docs/detectors.md#lr01) compares the lr
after a resume with. Every function takes polars frames with ``step`` and ``value`` columns (lr units).
"""

from __future__ import annotations

import numpy as np
import polars as pl

TREND_POINTS = 6
"""Last logged points of the segment before a resume that :func:`extrapolate` continues (our choice: enough to
average a step's noise, few enough to follow a decaying schedule's local slope; docs/detectors.md#lr01)."""
MIN_POINTS = 3
"""Fewest points a shape is judged on: the compared points of a replay, the overlap of a constant scale, the
points of a linear fit (our choice: two points always fit a line)."""
REPLAY_STARTS = 5
"""A replay may begin at any of the first segment's first logged steps up to its sixth (the resumed process may
log from its first schedule step or a later one; our choice)."""
REL_FLOOR = 1e-30
"""Floor of |lr| when a replay is compared relatively (keeps an lr of exactly 0 comparable; not a threshold)."""
SCALE_MIN_CHANGE = 0.05
"""A constant scale counts when it is more than 5% away from 1 (our choice, the same 5% as LR01's ``rel_tol``)."""
SCALE_SPREAD = 0.01
"""A constant scale needs every overlapping ratio within 1% of their median (our choice: printed lr rounding)."""
HORIZON_POINTS = 8
"""Points on each side of the resume that the linear decays are fitted on (our choice)."""
LINEAR_RESID = 0.02
"""A side decays linearly when no residual exceeds 2% of its largest lr (our choice)."""
HORIZON_MIN_SHIFT = 0.05
"""The two zero crossings must differ by more than 5% to be two horizons (as ``SCALE_MIN_CHANGE``; our choice)."""


def extrapolate(prev: pl.DataFrame, step: int) -> float:
    """Expected lr at ``step`` continuing the last points of ``prev`` linearly (per step)."""
    st = prev.get_column("step").to_numpy()[-TREND_POINTS:].astype(float)
    v = prev.get_column("value").to_numpy()[-TREND_POINTS:].astype(float)
    ok = np.isfinite(v)
    st, v = st[ok], v[ok]
    if v.size == 0:
        return float("nan")
    if v.size < 2 or st[-1] == st[0]:
        return float(v[-1])
    slope = (v[-1] - v[0]) / (st[-1] - st[0])
    return float(max(v[-1] + slope * (step - st[-1]), 0.0))


def replays(first: pl.DataFrame, cur: pl.DataFrame, points: int = 6, tol: float = 0.02) -> tuple[float, float] | None:
    """(step matched, first step) of the first segment when ``cur``'s first lr values repeat it (None: no replay).

    The k-th logged point after the resume is compared with the first segment's lr at the same distance
    from its first step (within ``tol``, 2%); at least 3 of the first ``points`` must be compared and all
    must agree, and the resumed lr must not equal the first segment's lr at the same steps (a resume that
    simply continues a schedule is not a replay). The step returned is the first segment's step matched by
    the resume's first logged point: its first logged step for a warm-up replayed, later for a schedule
    restarted at its peak (no warm-up).
    """
    if first.height < MIN_POINTS or cur.height < MIN_POINTS:
        return None
    fs = first.get_column("step").to_numpy()
    fv = first.get_column("value").to_numpy().astype(float)
    cs = cur.get_column("step").to_numpy()[:points]
    cv = cur.get_column("value").to_numpy().astype(float)[:points]
    s0 = int(cs[0])
    same_step = np.flatnonzero(np.isin(fs, cs))
    continues = same_step.size >= 2 and bool(np.allclose(fv[same_step], cv[np.isin(cs, fs)], rtol=tol))
    if continues:
        return None
    # the resumed process may log its first schedule step or a later one (and another log phase): try
    # offsets that put the resume's first logged point near the first segment's first steps, reading the
    # first segment's lr by linear interpolation between its logged points
    ok_f = np.isfinite(fv)
    fs_f, fv_f = fs[ok_f].astype(float), fv[ok_f]
    if fs_f.size < MIN_POINTS:
        return None
    for cand in range(int(fs_f[0]), int(fs_f[min(REPLAY_STARTS, fs_f.size - 1)]) + 1):
        off = s0 - cand
        if off <= 0:
            continue
        at = cs.astype(float) - off
        inside = (at >= fs_f[0]) & (at <= fs_f[-1]) & np.isfinite(cv)
        if inside.sum() < MIN_POINTS:
            continue
        ref = np.interp(at[inside], fs_f, fv_f)
        if bool(np.all(np.abs(cv[inside] - ref) <= tol * np.maximum(np.abs(ref), REL_FLOOR))):
            return float(s0 - off), float(fs_f[0])
    return None


def constant_scale(prev: pl.DataFrame, cur: pl.DataFrame) -> float | None:
    """The factor r when cur's lr is r x prev's lr at every overlapping step (>= 3), else None."""
    j = cur.select("step", "value").join(prev.select("step", pl.col("value").alias("old")), on="step")
    if j.height < MIN_POINTS:
        return None
    r = (j.get_column("value") / j.get_column("old")).to_numpy()
    r = r[np.isfinite(r)]
    if r.size < MIN_POINTS:
        return None
    m = float(np.median(r))
    if abs(m - 1) > SCALE_MIN_CHANGE and float(np.max(np.abs(r - m))) <= SCALE_SPREAD * abs(m):
        return m
    return None


def horizons(prev: pl.DataFrame, cur: pl.DataFrame) -> tuple[float, float, float, float] | None:
    """Where the linear decays of both sides reach zero, when both sides decay linearly.

    Returns (end step before, end step after, slope before, slope after) or None.
    """
    fits = []
    for df in (prev.tail(HORIZON_POINTS), cur.head(HORIZON_POINTS)):
        st = df.get_column("step").to_numpy().astype(float)
        v = df.get_column("value").to_numpy().astype(float)
        ok = np.isfinite(v)
        st, v = st[ok], v[ok]
        if v.size < MIN_POINTS or st[-1] == st[0]:
            return None
        slope, icpt = np.polyfit(st, v, 1)
        resid = v - (slope * st + icpt)
        if slope >= 0 or np.max(np.abs(resid)) > LINEAR_RESID * np.max(np.abs(v)):
            return None
        fits.append((-icpt / slope, slope))
    (t_prev, s_prev), (t_cur, s_cur) = fits
    if abs(t_cur - t_prev) <= HORIZON_MIN_SHIFT * abs(t_prev):
        return None
    return float(t_prev), float(t_cur), float(s_prev), float(s_cur)
