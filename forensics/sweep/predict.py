"""The largest stable lr at a target size, predicted from the measured sizes of one family."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from forensics.sweep.runs import TREND_SIGNALS

WEAK_SEPARATION = 0.1
"""Below this gap (nats) between stable and unstable runs' log max, a signal threshold is called weak (our choice)."""
MIN_SIZES = 3
"""Fewest measured sizes (points of a line) that leave a residual to estimate the fit's error from (a line through
two points fits them exactly; standard least squares: n - 2 degrees of freedom)."""
FAR_EXTRAPOLATION = 4
"""A target more than 4x the largest measured size gets a note that the power law is assumed (our choice)."""


def fit_line(x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """Least-squares line y = a + b x with the residual standard error (None with two points)."""
    b, a = np.polyfit(x, y, 1)
    se = None
    if x.size >= MIN_SIZES:
        res = y - (a + b * x)
        se = float(math.sqrt(float(np.sum(res ** 2)) / (x.size - 2)))
    return {"a": float(a), "b": float(b), "se": se}




def predict_stable_lr(members: list[dict[str, Any]], size_key: str, target: float | None) -> dict[str, Any]:
    """Predict the largest stable lr at the target size from the measured sizes of one family.

    Two predictions: (a) ``direct``: a line through log(largest stable lr) against log(size), extrapolated and
    snapped to the lr grid; (b) ``signal``: for the trend signal whose log max best separates the stable from
    the unstable runs at the measured sizes (a threshold c between the largest value of a stable run and the
    smallest of an unstable one), the log max at each lr extrapolated to the target size (one line per lr),
    and the largest lr of the grid whose predicted value stays below c with every smaller lr below it too.
    (b) is used when a separating signal exists, else (a). The uncertainty: with three or more sizes the fits'
    residual standard error moves the prediction over the grid (the lr range it spans); with two sizes each
    line passes through both points and there is no error estimate (``too_few_sizes``), so the prediction is
    given with +- one lr grid step and the note says so.

    Returns:
        ``{"target_size", "predicted_largest_stable_lr", "method", "interval": [lo, hi], "direct", "signal",
        "grid", "too_few_sizes", "notes"}``.
    """
    members = sorted(members, key=lambda g: g["key"][size_key])
    sizes = np.array([float(g["key"][size_key]) for g in members])
    grid = sorted(set.intersection(*(set(g["lrs"]) for g in members)))
    notes: list[str] = []
    few = sizes.size < MIN_SIZES
    if few:
        notes.append(f"{sizes.size} sizes: each fit is a line through {sizes.size} points, with no error estimate; "
                     "the prediction is given +- one lr grid step; add a third size to estimate its uncertainty")
    out: dict[str, Any] = {"target_size": target, "size_key": size_key, "grid": grid, "too_few_sizes": few,
                           "measured": {str(int(s)): g["largest_stable_lr"]
                                        for s, g in zip(sizes, members, strict=True)},
                           "notes": notes, "direct": None, "signal": None, "predicted_largest_stable_lr": None,
                           "method": None, "interval": None}
    if target is None or not grid:
        if target is None:
            notes.append("no target size given (--target-width / --target-params): nothing extrapolated")
        return out
    lx, tx = np.log(sizes), math.log(target)
    out["direct"] = _direct(members, lx, tx, grid, size_key)
    best = _separating_signal(members, sizes, grid)
    if best is not None:
        out["signal"], interval = _signal_prediction(best, grid, tx, size_key, target)
        signal, gap = best[0], best[1]
        if gap < WEAK_SEPARATION:
            notes.append(f"max {signal} separates the stable from the unstable runs by only {gap:.3g} nats: a weak "
                         "threshold, read the prediction with the direct one beside it")
        centre = out["signal"]["predicted_largest_stable_lr"]
        if centre is not None:
            out["predicted_largest_stable_lr"], out["method"] = centre, f"signal ({signal})"
            out["interval"] = interval
    if out["predicted_largest_stable_lr"] is None and out["direct"] is not None:
        d = out["direct"]
        out["predicted_largest_stable_lr"], out["method"] = d["snapped"], "direct"
        out["interval"] = _direct_interval(grid, d)
    if out["predicted_largest_stable_lr"] is None:
        notes.append("no prediction: no signal separates stable from unstable runs and some size has no stable lr")
    elif target > sizes.max() * FAR_EXTRAPOLATION:
        notes.append(f"extrapolating {target / sizes.max():.3g}x beyond the largest measured size: the power law "
                     "is an assumption, not a measurement")
    return out


def _snap(grid: list[float], lr: float) -> float:
    """The lr of the grid nearest ``lr`` on the log scale."""
    return min(grid, key=lambda g: abs(math.log(g) - math.log(lr)))


def _step_of(grid: list[float], lr: float, k: int) -> float:
    """The lr ``k`` grid steps from ``lr`` (clamped to the grid)."""
    i = grid.index(lr)
    return grid[min(len(grid) - 1, max(0, i + k))]


def _direct(members: list[dict[str, Any]], lx: np.ndarray, tx: float, grid: list[float],
            size_key: str) -> dict[str, Any] | None:
    """Prediction (a): log(largest stable lr) against log(size), extrapolated; ``None`` when a size has none."""
    stab = [g["largest_stable_lr"] for g in members]
    if not all(s is not None for s in stab):
        return None
    f = fit_line(lx, np.log(np.array(stab, dtype=float)))
    raw = math.exp(f["a"] + f["b"] * tx)
    return {"fit": f, "raw": raw, "snapped": _snap(grid, raw), "exponent": f["b"],
            "why": f"largest stable lr ~ {size_key}^{f['b']:.3g}"}


def _direct_interval(grid: list[float], d: dict[str, Any]) -> list[float]:
    """The direct prediction's range: +- 2 residual se on the log scale, snapped; else +- one grid step."""
    se = d["fit"]["se"]
    if se is not None:
        return [_snap(grid, math.exp(math.log(d["raw"]) - 2 * se)), _snap(grid, math.exp(math.log(d["raw"]) + 2 * se))]
    return [_step_of(grid, d["snapped"], -1), _step_of(grid, d["snapped"], 1)]


def _separating_signal(members: list[dict[str, Any]], sizes: np.ndarray,
                       grid: list[float]) -> tuple[str, float, float, list[tuple[float, float, float, bool]]] | None:
    """The trend signal whose log max best separates stable from unstable runs: (signal, gap, threshold, points).

    Points are ``(size, lr, log max, stable)``; the threshold is halfway between the largest log max of a
    stable run and the smallest of an unstable one; ``None`` when no signal separates them.
    """
    best = None
    for signal in TREND_SIGNALS:
        pts = []
        for s, g in zip(sizes, members, strict=True):
            for r in g["runs"]:
                v = r["signatures"].get(f"{signal}_max")
                if v is None or not (v > 0) or r["lr"] not in grid:
                    continue
                stable = r["lr"] in g["stable_lrs"]
                pts.append((s, r["lr"], math.log(v), stable))
        st = [logmax for _s, _lr, logmax, stable in pts if stable]
        un = [logmax for _s, _lr, logmax, stable in pts if not stable]
        if not st or not un or max(st) >= min(un):
            continue
        gap = min(un) - max(st)
        if best is None or gap > best[1]:
            best = (signal, gap, (max(st) + min(un)) / 2, pts)
    return best


def _signal_prediction(best: tuple[str, float, float, list[tuple[float, float, float, bool]]], grid: list[float],
                       tx: float, size_key: str, target: float) -> tuple[dict[str, Any], list[float] | None]:
    """Prediction (b): each lr's log max extrapolated to the target size; the largest lr that stays below.

    Returns:
        (the ``signal`` entry, the interval ``[lo, hi]`` or ``None`` without a prediction).
    """
    signal, gap, c, pts = best
    pred, ses = {}, []
    for lr in grid:
        xs = np.array([math.log(p[0]) for p in pts if p[1] == lr])
        ys = np.array([p[2] for p in pts if p[1] == lr])
        if xs.size < 2 or len(set(xs.tolist())) < 2:
            continue
        f = fit_line(xs, ys)
        pred[lr] = f["a"] + f["b"] * tx
        if f["se"] is not None:
            ses.append(f["se"])

    def largest(shift: float) -> float | None:
        ok = None
        for lr in grid:
            if lr not in pred or pred[lr] + shift >= c:
                break
            ok = lr
        return ok

    centre = largest(0.0)
    se = float(np.sqrt(np.mean(np.square(ses)))) if ses else None
    entry = {"signal": signal, "threshold_log": c, "threshold": math.exp(c), "separation": gap,
             "predicted_log_max": {repr(k): v for k, v in pred.items()},
             "predicted_largest_stable_lr": centre, "residual_se": se,
             "why": (f"stable runs at the measured sizes keep max {signal} below {math.exp(c):.4g} "
                     f"(separation {gap:.3g} nats); at {size_key} {target:g} the extrapolated max "
                     f"{signal} stays below it up to lr {centre}")}
    if centre is None:
        return entry, None
    if se is not None:
        lo, hi = largest(2 * se), largest(-2 * se)
        return entry, [lo if lo is not None else grid[0], hi if hi is not None else centre]
    return entry, [_step_of(grid, centre, -1), _step_of(grid, centre, 1)]
