"""What the interactive charts draw: the causal chain and its window, constant series, display reduction, markers.

Display only: long series are reduced to the min and max of each bucket with every non-finite point kept
(:func:`reports.downsample.display_indices`), at full resolution over the causal chain's window. Detection never
sees these arrays.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import numpy as np

from reports._common import fmt_num
from reports.downsample import BUCKETS, MAX_MARKERS, display_indices

if TYPE_CHECKING:
    from forensics.model import Analysis, Finding, RunData, Series

MIN_HALF_WINDOW_POINTS = 30
"""The onset window reaches at least this many logging intervals beyond the causal chain on each side."""


def causal_chain(analysis: Analysis) -> list[Finding]:
    """The findings on the causal chain: every finding with a step at or after the onset.

    The onset is the first departure on the causal path (DESIGN.md section 4); what follows it (the
    cause's findings, its symptoms, the consequences the engine names) is the chain a person checks.
    Empty without an onset (healthy runs).
    """
    if not analysis.onset:
        return []
    onset = int(analysis.onset["step"])
    return [f for f in analysis.findings if f.step is not None and f.step >= onset]


def chain_window(analysis: Analysis, run: RunData) -> tuple[int, int] | None:
    """Steps shown "around the onset": the causal chain's span plus a margin sized to it.

    The margin is a quarter of the chain's span, at least :data:`MIN_HALF_WINDOW_POINTS` logging
    intervals (the loss's median step spacing); the window is clipped to the run. ``None`` without an
    onset.
    """
    if not analysis.onset or run.metrics.height == 0:
        return None
    onset = int(analysis.onset["step"])
    steps = [onset] + [int(f.step) for f in causal_chain(analysis) if f.step is not None]
    lo, hi = min(steps), max(steps)
    s = run.series("loss") or next((run.series(m) for m in run.metric_names if run.series(m) is not None), None)
    dt = 1.0
    if s is not None and len(s) > 1:
        dt = float(max(1.0, np.median(np.diff(s.steps))))
    margin = int(max(0.25 * (hi - lo), MIN_HALF_WINDOW_POINTS * dt))
    col = run.metrics.get_column("step")
    first, last = int(col.min()), int(col.max())  # type: ignore[arg-type]
    return max(first, lo - margin), min(last, hi + margin)


def chain_metrics(analysis: Analysis, run: RunData) -> list[str]:
    """Every series a finding on the causal chain used (the loss first), in chain order."""
    from reports._plain import finding_metrics

    names = run.metric_names
    out: dict[str, None] = {}
    if "loss" in names and analysis.onset:
        out["loss"] = None
    for f in causal_chain(analysis):
        for m in sorted(finding_metrics(f, names), key=lambda m: (m != "loss", m)):
            out.setdefault(m, None)
    return list(out)


def is_constant(series: Series) -> bool:
    """True when every finite value is the same (an fp32 run's loss scale of 1.0) and nothing is non-finite."""
    v = series.values
    fin = np.isfinite(v)
    return bool(fin.all()) and v.size > 0 and float(v.max()) == float(v.min())


def constant_line(series: Series) -> str:
    """``loss_scale: constant 1 over 500 points (steps 0 to 499)``."""
    return (f"{series.metric}: constant {fmt_num(float(series.values[0]))} over {len(series):,} points "
            f"(steps {int(series.steps[0]):,} to {int(series.steps[-1]):,})")


# ----------------------------------------------------------------------------------- data


def smooth(values: np.ndarray, span: int | None = None) -> np.ndarray:
    """Debiased exponential moving average (TensorBoard's smoothing), non-finite values held over.

    The average from the first finite value on is polars' ``ewm_mean(adjust=True)``: the weighted mean
    ``sum((1 - alpha)**i * x[t - i]) / sum((1 - alpha)**i)``, the same numbers as the debiased first-order
    IIR filter (``lfilter([alpha], [1, alpha - 1], x) / (1 - (1 - alpha)**k)``) this replaced, to rounding
    (``tests/test_report_smooth.py``), without importing ``scipy.signal`` (~0.6 s a process).

    Args:
        values: float64 values in step order.
        span: EMA span in points (default: 1% of the series, at least 5); ``alpha = 2 / (span + 1)``.

    Returns:
        float64 array of the same length; NaN where no finite value came yet.
    """
    import polars as pl

    n = values.size
    if n == 0:
        return values.astype(np.float64)
    span = span or max(5, n // 100)
    alpha = 2.0 / (span + 1.0)
    finite = np.isfinite(values)
    if finite.all():  # the common case: nothing to hold over
        return pl.Series(values, dtype=pl.Float64).ewm_mean(alpha=alpha, adjust=True).to_numpy()
    idx = np.where(finite, np.arange(n), -1)
    np.maximum.accumulate(idx, out=idx)  # the last finite value at or before each point (-1: none yet)
    out = np.full(n, np.nan)
    first = int(np.searchsorted(idx, 0))
    if first < n:
        filled = pl.Series(values[idx[first:]], dtype=pl.Float64)
        out[first:] = filled.ewm_mean(alpha=alpha, adjust=True).to_numpy()
    return out


def display_data(series: Series, window: tuple[int, int] | None, onset: int | None, *,
                 smoothed: bool = True) -> dict[str, np.ndarray]:
    """The points drawn of one series (bucket min/max, full resolution in the window), non-finite as NaN.

    Returns ``x`` (steps) and ``y`` as float64 and, with ``smoothed``, ``ys`` (the smoothed line) as float32
    (a series drawn only as another panel's overlay needs none); the page derives the log line (``y`` where
    positive) itself.
    """
    idx = display_indices(series.steps, series.values, window, onset, BUCKETS)
    v = series.values[idx]
    out = {"x": series.steps[idx].astype(np.float64), "y": np.where(np.isfinite(v), v, np.nan)}
    if smoothed:
        out["ys"] = smooth(series.values)[idx].astype(np.float32)
    return out


def markers(series: Series) -> dict[str, list[Any]]:
    """Non-finite points (merged closer than 1/1000 of the range, at most :data:`MAX_MARKERS`)."""
    out: dict[str, list[Any]] = {"x": [], "y": [], "kind": [], "marker": []}
    lo, hi = (float(series.steps[0]), float(series.steps[-1])) if series.steps.size else (0.0, 1.0)
    for name, mask, marker, ypos in (("NaN", np.isnan(series.values), "x", 0.95),
                                     ("+inf", np.isposinf(series.values), "triangle", 0.95),
                                     ("-inf", np.isneginf(series.values), "inverted_triangle", 0.05)):
        xs = series.steps[mask].astype(np.float64)
        if xs.size > MAX_MARKERS:
            width = max(hi - lo, 1.0) / 1000.0
            _, first = np.unique(np.floor((xs - lo) / width), return_index=True)
            xs = xs[np.sort(first)][:MAX_MARKERS]
        out["x"] += xs.tolist()
        out["y"] += [ypos] * xs.size
        out["kind"] += [name] * xs.size
        out["marker"] += [marker] * xs.size
    return out


def use_log(values: np.ndarray) -> bool:
    """Start on a log y axis: every finite value positive and spanning more than a factor 100."""
    fin = values[np.isfinite(values)]
    return bool(fin.size) and float(fin.min()) > 0 and float(fin.max()) / float(fin.min()) > 100.0


def counts_caption(series: Series, shown: int) -> str:
    """One line on what a panel draws: points logged, drawn, and non-finite."""
    v = series.values
    parts = [f"{len(series):,} points"]
    if shown < len(series):
        parts.append(f"{shown:,} drawn (min/max per bucket, full resolution near the onset)")
    bad = [f"{int(n):,} {k}" for k, n in (("NaN", np.isnan(v).sum()), ("+inf", np.isposinf(v).sum()),
                                           ("-inf", np.isneginf(v).sum())) if n]
    if bad:
        parts.append("non-finite: " + ", ".join(bad) + " (markers at the edge)")
    return "; ".join(parts)


def slug(name: str) -> str:
    """A metric name as an element id part (letters, digits, ``_.-``)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "metric"


# ----------------------------------------------------------------------------------- figures

