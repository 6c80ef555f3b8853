"""What the interactive charts draw: the causal chain and its window, constant series, display reduction, markers.

Display only: long series are reduced to the min and max of each bucket with every non-finite point kept
(:func:`reports.downsample.display_indices`), at full resolution over the causal chain's window. Detection never
sees these arrays.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
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

    Returns ``x`` (steps), ``y`` and, with ``smoothed``, ``ys`` (the smoothed line), all float64 (a series drawn
    only as another panel's overlay needs no ``ys``; :class:`reports.figures.FigureBuilder` encodes ``ys`` as
    float32 when float32 holds it); the page derives the log line (``y`` where positive) itself.
    """
    idx = display_indices(series.steps, series.values, window, onset, BUCKETS)
    v = series.values[idx]
    out = {"x": series.steps[idx].astype(np.float64), "y": np.where(np.isfinite(v), v, np.nan)}
    if smoothed:
        out["ys"] = smooth(series.values)[idx]
    return out


@dataclass(frozen=True)
class Superseded:
    """The rows of one metric that its effective timeline does not hold (QA s7 F3: they were dropped silently).

    Attributes:
        steps, values, segments: The rows a later segment superseded (a restart from a lower step, TensorBoard's
            purge rule, or a repeated step), in read order (float64 steps and values, int64 segments).
        logged: Rows of the metric in the series' own files (effective plus superseded).
        other_files: Rows of the metric in other files, not drawn (the series is read from one source group).
    """

    steps: np.ndarray
    values: np.ndarray
    segments: np.ndarray
    logged: int
    other_files: int


def superseded(run: RunData, series: Series) -> Superseded | None:
    """The rows of ``series.metric`` its effective timeline left out, or ``None`` when it holds every row.

    A row is on the timeline when the series has its step from its segment (the last such row of a repeated step);
    every other row of the series' source group is superseded. One column's row count first: a log without
    restarts costs one slice of the frame (the usual case).
    """
    import polars as pl

    if run.raw(series.metric, ["step"]).height <= len(series):
        return None
    raw = run.raw(series.metric, ["source", "step", "segment", "value"])
    if raw.get_column("value").null_count():
        raw = raw.filter(pl.col("value").is_not_null())
    total = raw.height
    groups = run.meta.get("source_groups") or {}
    mine = groups.get(series.source, series.source)
    names = raw.get_column("source").unique().cast(pl.String).to_list()  # a few names, not one string per row
    if len(names) > 1:
        raw = raw.filter(pl.col("source").is_in([n for n in names if groups.get(n, n) == mine]))
    if raw.height <= len(series):
        return None if raw.height == total else Superseded(np.empty(0), np.empty(0), np.empty(0, np.int64),
                                                           raw.height, total - raw.height)
    # a 10M-row metric: each temporary goes as soon as it is used (the report's peak memory, tests/test_hostile.py)
    steps = raw.get_column("step").to_numpy()
    segs = raw.get_column("segment").to_numpy()
    if len(series):
        at = np.searchsorted(series.steps, steps)
        np.clip(at, 0, len(series) - 1, out=at)
        on = series.steps[at] == steps
        on &= series.segments[at] == segs
        del at
    else:
        on = np.zeros(steps.size, bool)
    rows = np.flatnonzero(on)
    del on
    _, last = np.unique(steps[rows][::-1], return_index=True)  # a repeated step: its last row is the one kept
    gone = np.ones(steps.size, dtype=bool)
    gone[rows[rows.size - 1 - last]] = False
    del rows, last
    idx = np.flatnonzero(gone)
    del gone
    vals = raw.get_column("value").gather(idx).cast(pl.Float64).fill_null(float("nan")).to_numpy()
    return Superseded(steps[idx].astype(np.float64), vals, segs[idx].astype(np.int64), raw.height,
                      total - raw.height)


def superseded_display(rows: Superseded, buckets: int = BUCKETS) -> dict[str, np.ndarray]:
    """The superseded rows as drawn: one line per segment (NaN between segments and where a step goes back).

    Long ones are reduced to the min and max of each bucket (:func:`reports.downsample.minmax_indices`); the breaks
    are placed after the reduction, so segments never join. Returns ``x``, ``y``, ``seg`` (NaN at a break).
    """
    from reports.downsample import minmax_indices

    idx = minmax_indices(rows.values, buckets)
    x, y, seg = rows.steps[idx], rows.values[idx], rows.segments[idx].astype(np.float64)
    brk = np.flatnonzero((seg[1:] != seg[:-1]) | (x[1:] < x[:-1])) + 1
    nan = np.full(brk.size, np.nan)
    return {"x": np.insert(x, brk, nan), "y": np.insert(np.where(np.isfinite(y), y, np.nan), brk, nan),
            "seg": np.insert(seg, brk, nan)}


def superseded_caption(rows: Superseded | None, drawn: int) -> str:
    """What a panel shows of the rows its timeline left out (``""`` when there are none)."""
    if rows is None:
        return ""
    parts = []
    n = int(rows.steps.size)
    if n:
        segs = int(np.unique(rows.segments).size)
        parts.append(f"{rows.logged:,} rows logged, {n:,} of them superseded by later segments (from {segs:,} "
                     f"segment(s); drawn in grey, one line per segment"
                     + (f", {drawn:,} points: min/max per bucket" if drawn < n else "") + ")")
    if rows.other_files:
        parts.append(f"{rows.other_files:,} rows from other files not drawn (the series is read from one source)")
    return "; ".join(parts)


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


def log_note(values: np.ndarray) -> tuple[bool, str]:
    """Whether a log y axis can show anything of a series, and what it leaves out (the log toggle's tooltip).

    Returns ``(False, why)`` without a positive finite value; ``(True, "N non-positive values not shown on a log
    axis")`` when some are zero or negative; ``(True, "")`` otherwise.
    """
    fin = values[np.isfinite(values)]
    n_pos, n_bad = int((fin > 0).sum()), int((fin <= 0).sum())
    if n_pos == 0:
        return False, "log y unavailable: no positive values (a log axis cannot show zero or negative values)"
    return True, f"{n_bad:,} non-positive values not shown on a log axis" if n_bad else ""


def counts_caption(series: Series, shown: int) -> str:
    """One line on what a panel draws: points logged, drawn, and non-finite."""
    v = series.values
    parts = [f"{len(series):,} points"]
    if shown < len(series):
        parts.append(f"{shown:,} drawn (min/max per bucket, full resolution near the onset)")
    bad = [f"{int(n):,} {k}" for k, n in (("NaN", np.isnan(v).sum()), ("+inf", np.isposinf(v).sum()),
                                           ("-inf", np.isneginf(v).sum())) if n]
    if bad and not np.isfinite(v).any():
        parts.append("no finite values: " + ", ".join(bad) + " (markers at the edge; y axis 0 to 1)")
    elif bad:
        parts.append("non-finite: " + ", ".join(bad) + " (markers at the edge)")
    return "; ".join(parts)


def slug(name: str) -> str:
    """A metric name as an element id part (letters, digits, ``_.-``)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "metric"


# ----------------------------------------------------------------------------------- figures

