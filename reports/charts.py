"""Charts for the HTML report: matplotlib figures rendered to inline SVG.

Display only: long series are reduced to the min and max of each of :data:`BUCKETS` buckets,
with full resolution kept around the onset. Detection never sees these arrays.
matplotlib is imported inside the functions (``import reports`` stays light); figures are built
with :class:`matplotlib.figure.Figure` directly, so no pyplot global state is touched.
"""

from __future__ import annotations

import io
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from reports._common import layer_bins

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from forensics.model import RunData, Series

BUCKETS = 2000
"""Display buckets per chart (min and max of each kept)."""
MAX_FULL_RES = 4000
"""At most this many full-resolution points around the onset per chart."""
MAX_MARKERS = 600
"""Non-finite markers per chart after merging markers closer than 1/1000 of the x range."""
HEATMAP_BINS = 400
"""Step bins of a per-layer heat map."""
LAYER_HEATMAP_MIN = 4
"""From this many layers on, a per-layer metric is drawn as a heat map instead of small multiples."""

DEFAULT_METRICS = ("loss", "lr", "grad_norm", "loss_scale", "update_ratio", "attn_logit_max", "log_z")
ZOOM_METRICS = ("loss", "grad_norm")

_COLORS = {
    "loss": "#1f5fa8", "lr": "#2e7d32", "grad_norm": "#8e44ad", "loss_scale": "#b9770e",
    "update_ratio": "#00838f", "attn_logit_max": "#ad1457", "log_z": "#5d4037",
}
_ONSET = "#c62828"
_RC = {
    "svg.fonttype": "none",
    "svg.hashsalt": "train-forensics",
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans", "Verdana", "Arial", "Helvetica"],
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.edgecolor": "#888888",
    "axes.grid": True,
    "grid.color": "#e6e6e6",
    "grid.linewidth": 0.6,
    "xtick.color": "#444444",
    "ytick.color": "#444444",
    "path.simplify": True,
    "text.parse_math": False,  # names from run folders are text, never mathtext ("attn/$\\x$": issue 16)
}


_LOCK = threading.Lock()


@contextmanager
def _style() -> Iterator[None]:
    """Chart rc settings; serialised, since rcParams are process-global (safe under a threaded service)."""
    import matplotlib

    with _LOCK, matplotlib.rc_context(_RC):
        yield


@dataclass(frozen=True)
class Chart:
    """One rendered chart.

    Attributes:
        id: Stable element id (``chart-loss``, ``zoom-grad_norm``, ``layers-attn_logit_max``).
        title: Caption title.
        caption: One line on what is drawn (downsampling, markers).
        svg: The ``<svg>`` element, ids prefixed so several charts can share a page.
    """

    id: str
    title: str
    caption: str
    svg: str


@dataclass(frozen=True)
class Marks:
    """What every chart marks: the onset and the segment boundaries."""

    onset_step: int | None
    onset_segment: int | None
    boundaries: tuple[tuple[int, int], ...]  # (segment, first step)


def marks_for(onset: Mapping[str, Any] | None, run: RunData) -> Marks:
    """Onset and restart boundaries (segments after the first) of a run."""
    starts = run.segment_starts()
    bounds = tuple((s, v) for s, v in sorted(starts.items()) if s > 0)
    if onset and onset.get("step") is not None:
        seg = onset.get("segment")
        return Marks(int(onset["step"]), None if seg is None else int(seg), bounds)
    return Marks(None, None, bounds)


# ----------------------------------------------------------------------------------- downsampling


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
    nb = -(-n // size)
    pad = nb * size - n
    finite = np.isfinite(values)
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


# ----------------------------------------------------------------------------------- drawing


def _figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


_ID_RE = re.compile(r'(\bid="|href="#|url\(#)([^")]+)')


def to_svg(fig: Figure, prefix: str, label: str = "") -> str:
    """Serialise a figure to an inline ``<svg>`` element (no XML header, no metadata, ids prefixed).

    Args:
        fig: The figure.
        prefix: Unique prefix for every id inside (several SVGs share one HTML document).
        label: ``aria-label`` text (escaped here).

    Returns:
        The SVG markup.
    """
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.S)
    text = _ID_RE.sub(lambda m: f"{m.group(1)}{prefix}-{m.group(2)}", text)
    # inline SVG in HTML5 needs no namespace declarations (the parser knows svg and xlink:href)
    end = text.index(">") + 1
    text = re.sub(r'\s+xmlns(?::xlink)?="[^"]*"', "", text[:end], count=2) + text[end:]
    text = _visible_controls(text)  # a bidi override in a metric name must not reorder the chart's text
    esc = label.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;")
    esc = _visible_controls(esc)
    text = re.sub(
        r'^<svg([^>]*?) width="[^"]*" height="[^"]*"',
        lambda m: f'<svg{m.group(1)} role="img" aria-label="{esc}"',
        text, count=1,
    )
    return text.strip()


def _visible_controls(text: str) -> str:
    """Bidi and invisible format characters shown as ``&lt;U+202E&gt;`` (XML-safe; see :mod:`reports.escape`)."""
    if text.isascii():
        return text
    from reports.escape import INVISIBLE

    return "".join(f"&lt;U+{ord(c):04X}&gt;" if ord(c) in INVISIBLE else c for c in text)


def save_png(fig: Figure, path: str) -> None:
    """Write a figure as PNG (for looking at a chart outside the report)."""
    fig.savefig(path, format="png", dpi=110)


def _use_log(values: np.ndarray) -> bool:
    fin = values[np.isfinite(values)]
    return bool(fin.size) and float(fin.min()) > 0 and float(fin.max()) / float(fin.min()) > 100.0


def _dedupe(xs: np.ndarray, lo: float, hi: float) -> np.ndarray:
    if xs.size <= MAX_MARKERS:
        return xs
    width = max(hi - lo, 1.0) / 1000.0
    _, first = np.unique(np.floor((xs - lo) / width), return_index=True)
    return xs[np.sort(first)][:MAX_MARKERS]


def _draw_marks(
    ax: Axes, marks: Marks, xlo: float, xhi: float, label_onset: bool = True, boundary: str = "#555555",
) -> None:
    trans = ax.get_xaxis_transform()
    for seg, step in marks.boundaries:
        if xlo <= step <= xhi:
            ax.axvline(step, color=boundary, lw=1.0, ls=(0, (4, 3)), zorder=2)
            ax.text(step, 0.02, f" seg {seg}", transform=trans, fontsize=7, color=boundary,
                    ha="left", va="bottom")
    if marks.onset_step is not None and xlo <= marks.onset_step <= xhi:
        ax.axvline(marks.onset_step, color=_ONSET, lw=1.2, zorder=4)
        if label_onset:
            seg = "" if marks.onset_segment is None else f" (seg {marks.onset_segment})"
            frac = (marks.onset_step - xlo) / max(xhi - xlo, 1e-12)
            ha = "right" if frac > 0.85 else "left" if frac < 0.15 else "center"
            ax.text(marks.onset_step, 1.0, f"onset {marks.onset_step:,}{seg}", transform=trans,
                    fontsize=8, color=_ONSET, ha=ha, va="bottom", fontweight="bold")
    _step_axis(ax)


def _step_axis(ax: Axes) -> None:
    """Step ticks as 1,200 / 250k / 1.5M instead of a 1e6 offset."""
    from matplotlib.ticker import FuncFormatter

    def fmt(x: float, _pos: int) -> str:
        a = abs(x)
        if a >= 1e6:
            return f"{x / 1e6:g}M"
        if a >= 1e5:
            return f"{x / 1e3:g}k"
        return f"{x:,.0f}"

    ax.xaxis.set_major_formatter(FuncFormatter(fmt))


def draw_series(
    ax: Axes, series: Series, marks: Marks, *, color: str, window: tuple[int, int] | None = None,
    xlim: tuple[int, int] | None = None, label_onset: bool = True, ylabel: str | None = None,
) -> dict[str, int]:
    """Draw one series on an axis: line, log-y when apt, onset, restarts, non-finite markers.

    Args:
        ax: Target axes.
        series: The metric's effective timeline.
        marks: Onset and segment boundaries.
        color: Line colour.
        window: Steps kept at full resolution.
        xlim: Restrict to these steps (zoom view).
        label_onset: Write the onset label above the axis.
        ylabel: Y-axis label (default: the metric name).

    Returns:
        Counts: ``points`` drawn, ``total`` points, ``nan``, ``posinf``, ``neginf`` in view.
    """
    steps, values = series.steps, series.values
    if xlim is not None:
        a = int(np.searchsorted(steps, xlim[0], side="left"))
        b = int(np.searchsorted(steps, xlim[1], side="right"))
        steps, values = steps[a:b], values[a:b]
    idx = display_indices(steps, values, window, marks.onset_step)
    xs = steps[idx].astype(np.float64)
    ys = np.where(np.isfinite(values[idx]), values[idx], np.nan)
    ax.plot(xs, ys, lw=0.9, color=color, zorder=3)
    if _use_log(values):
        ax.set_yscale("log")
    if xlim is not None:
        ax.set_xlim(*xlim)
    elif steps.size:
        pad = max(1.0, 0.01 * float(steps[-1] - steps[0]))
        ax.set_xlim(float(steps[0]) - pad, float(steps[-1]) + pad)
    xlo, xhi = ax.get_xlim()
    counts = {"points": int(idx.size), "total": int(steps.size)}
    trans = ax.get_xaxis_transform()
    kinds = (("nan", np.isnan(values), "x", _ONSET, 0.97), ("posinf", np.isposinf(values), "^", _ONSET, 0.97),
             ("neginf", np.isneginf(values), "v", "#6a1b9a", 0.03))
    for key, mask, marker, mcolor, ypos in kinds:
        counts[key] = int(mask.sum())
        if counts[key]:
            mx = _dedupe(steps[mask].astype(np.float64), xlo, xhi)
            name = {"nan": "NaN", "posinf": "+inf", "neginf": "-inf"}[key]
            ax.scatter(mx, np.full(mx.size, ypos), transform=trans, marker=marker, s=18, color=mcolor,
                       linewidths=1.0, zorder=5, clip_on=False, label=f"{name} ({counts[key]:,})")
    if counts["nan"] or counts["posinf"] or counts["neginf"]:
        ax.legend(loc="upper left", fontsize=7, frameon=True, framealpha=0.85, edgecolor="none",
                  handletextpad=0.2)
    _draw_marks(ax, marks, xlo, xhi, label_onset)
    ax.set_ylabel(ylabel or series.metric, fontsize=8)
    ax.margins(x=0)
    return counts


def _caption(counts: dict[str, int]) -> str:
    parts = [f"{counts['total']:,} points"]
    if counts["points"] < counts["total"]:
        parts.append(f"{counts['points']:,} drawn (min/max per bucket, full resolution near the onset)")
    names = (("nan", "NaN"), ("posinf", "+inf"), ("neginf", "-inf"))
    bad = [f"{counts[k]:,} {n}" for k, n in names if counts[k]]
    if bad:
        parts.append("non-finite: " + ", ".join(bad) + " (marked at the axis edge)")
    return "; ".join(parts)


def metric_chart(series: Series, marks: Marks, *, index: int) -> tuple[Chart, Figure]:
    """The full-run chart of one metric.

    Args:
        series: The metric's effective timeline.
        marks: Onset and restarts.
        index: Running number (unique SVG id prefix).

    Returns:
        The chart and its figure (the caller may save the figure as PNG too).
    """
    with _style():
        fig = _figure(9.5, 2.5)
        ax = fig.add_subplot()
        window = None
        if marks.onset_step is not None and series.steps.size:
            window = zoom_window(series.steps, marks.onset_step)
        counts = draw_series(ax, series, marks, color=_COLORS.get(series.metric, "#37474f"), window=window)
        ax.set_xlabel("step", fontsize=8)
        svg = to_svg(fig, f"c{index}", f"{series.metric} over the run")
    chart = Chart(f"chart-{_slug(series.metric)}", series.metric, _caption(counts), svg)
    return chart, fig


def zoom_chart(series: Series, marks: Marks, *, index: int) -> Chart | None:
    """The onset zoom (onset +- max(50, 10% of the run)) of one metric, or ``None`` without onset."""
    if marks.onset_step is None or series.steps.size == 0:
        return None
    window = zoom_window(series.steps, marks.onset_step)
    window = (max(window[0], int(series.steps[0])), min(window[1], int(series.steps[-1])))
    if window[1] <= window[0]:
        return None
    with _style():
        fig = _figure(9.5, 2.3)
        ax = fig.add_subplot()
        counts = draw_series(ax, series, marks, color=_COLORS.get(series.metric, "#37474f"), window=window,
                             xlim=window)
        ax.set_xlabel("step", fontsize=8)
        svg = to_svg(fig, f"z{index}", f"{series.metric} around the onset")
    title = f"{series.metric} around the onset (steps {window[0]:,} to {window[1]:,})"
    return Chart(f"zoom-{_slug(series.metric)}", title, _caption(counts), svg)


def _layer_key(name: str) -> tuple[Any, ...]:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


def layer_chart(base: str, layers: Sequence[Series], marks: Marks, *, index: int) -> Chart:
    """Per-layer variants of one metric: small multiples below 4 layers, a heat map from 4 on.

    Args:
        base: The metric before the ``/`` (``attn_logit_max``).
        layers: One series per layer (``attn_logit_max/layer0``, ...).
        marks: Onset and restarts.
        index: Running number (unique SVG id prefix).

    Returns:
        The chart.
    """
    layers = sorted(layers, key=lambda s: _layer_key(s.metric))
    names = [s.metric.partition("/")[2] for s in layers]
    with _style():
        if len(layers) < LAYER_HEATMAP_MIN:
            fig = _figure(9.5, 2.2)
            axes = fig.subplots(1, len(layers), sharex=True, squeeze=False)[0]
            for i, (ax, s) in enumerate(zip(axes, layers, strict=True)):
                draw_series(ax, s, marks, color=_COLORS.get(base, "#37474f"), label_onset=i == 0,
                            ylabel=names[i])
                ax.set_xlabel("step", fontsize=8)
            caption = "one panel per layer"
        else:
            caption = _heatmap(fig := _figure(9.5, 0.9 + 0.22 * min(len(layers), 48)), layers, names, marks)
        svg = to_svg(fig, f"l{index}", f"{base} per layer")
    return Chart(f"layers-{_slug(base)}", f"{base} per layer ({len(layers)} layers)", caption, svg)


def _heatmap(fig: Figure, layers: Sequence[Series], names: Sequence[str], marks: Marks) -> str:
    from matplotlib import cm, colors

    edges, grid, bad, seen = layer_bins(layers, HEATMAP_BINS)
    vals = np.where(np.isfinite(grid), grid, np.nan)
    fin = vals[np.isfinite(vals)]
    if fin.size and fin.min() > 0 and fin.max() / fin.min() > 100:
        norm: colors.Normalize = colors.LogNorm(float(fin.min()), float(fin.max()))
    elif fin.size:
        top = float(fin.max()) if fin.max() > fin.min() else float(fin.min()) + 1.0
        norm = colors.Normalize(float(fin.min()), top)
    else:
        norm = colors.Normalize(0.0, 1.0)
    cmap = matplotlib_cmap("viridis")
    rgba = cmap(norm(np.nan_to_num(vals, nan=norm.vmin if norm.vmin is not None else 0.0)))
    rgba[~seen] = (0.93, 0.93, 0.93, 1.0)
    rgba[bad] = (0.85, 0.1, 0.1, 1.0)
    ax = fig.add_subplot()
    ax.imshow(rgba, aspect="auto", interpolation="nearest", origin="lower",
              extent=(float(edges[0]), float(edges[-1]), -0.5, len(layers) - 0.5))
    step = max(1, len(layers) // 16)
    ax.set_yticks(range(0, len(layers), step), [names[i] for i in range(0, len(layers), step)], fontsize=7)
    ax.grid(False)
    ax.set_xlabel("step", fontsize=8)
    fig.colorbar(cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, pad=0.01, fraction=0.03)
    _draw_marks(ax, marks, float(edges[0]), float(edges[-1]), boundary="#ffffff")
    return (f"max per bin over {grid.shape[1]} step bins; red: non-finite values in the bin; grey: not logged"
            + ("; log colour scale" if isinstance(norm, colors.LogNorm) else ""))


def matplotlib_cmap(name: str) -> Any:
    """A registered matplotlib colormap by name."""
    import matplotlib

    return matplotlib.colormaps[name]


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "metric"
