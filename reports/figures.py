"""What each chart of the HTML report draws, as compact data: line panels and per-layer heat maps.

The page builds the charts itself with BokehJS's JS API (``reports/templates/charts.js``) from this data, so the
Python side never imports Bokeh: :class:`FigureBuilder` collects, for one page, each series' display data
(base64 little-endian arrays), its non-finite markers, and one entry per panel (which x range it shares, its
height, colour, log range). Text from the logs never reaches a Bokeh text property (Bokeh parses ``$$...$$``
as TeX): the page's script puts only numbers and fixed words there.
"""

from __future__ import annotations

import base64
import gzip
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from reports._common import layer_bins
from reports.chart_data import Superseded, display_data, markers, superseded, superseded_display, use_log

if TYPE_CHECKING:
    from forensics.model import Analysis, RunData, Series

HEATMAP_BINS = 400
"""Step bins of a per-layer heat map."""
_COLORS = {
    "loss": "#1f5fa8", "lr": "#2e7d32", "grad_norm": "#8e44ad", "loss_scale": "#b9770e",
    "update_ratio": "#00838f", "attn_logit_max": "#ad1457", "log_z": "#5d4037",
}


def b64(values: np.ndarray, dtype: str) -> str:
    """An array as base64 of its gzip-compressed little-endian bytes (``dtype`` ``"<f8"`` or ``"<f4"``).

    NaN kept bit for bit; gzip at level 2 with a fixed mtime, as Bokeh's own embedding writes arrays (its
    ``compression_level`` default), so the page decodes them with BokehJS's ``base64_to_buffer``.
    """
    raw = np.ascontiguousarray(values, dtype=dtype).tobytes()
    return base64.b64encode(gzip.compress(raw, compresslevel=2, mtime=1)).decode("ascii")


_LOG10_MIN, _LOG10_MAX = -323.0, 308.25
"""Decimal exponents of a log axis's ends, inside float64 (5e-324 is its smallest subnormal, 1.8e308 its max)."""


def log_range(values: np.ndarray) -> list[float]:
    """The log y axis's ``[lo, hi]``: the positive finite values padded 4% in log10 space, always finite.

    The padding is computed on the exponents and clamped to :data:`_LOG10_MIN`..:data:`_LOG10_MAX`, so a
    series spanning 1e-200..1e200, or reaching 1e308, gives finite ends (``1.0, 10.0`` without positive values).
    """
    pos = values[np.isfinite(values) & (values > 0)]
    if not pos.size:
        return [1.0, 10.0]
    e_lo, e_hi = float(np.log10(pos.min())), float(np.log10(pos.max()))
    if e_hi <= e_lo:
        e_lo, e_hi = e_lo - 0.3, e_hi + 0.3
    pad = 0.04 * (e_hi - e_lo)
    e_lo, e_hi = max(_LOG10_MIN, e_lo - pad), min(_LOG10_MAX, e_hi + pad)
    return [min(float(10.0 ** e_lo), float(pos.min())), max(float(10.0 ** e_hi), float(pos.max()))]


_F32_MAX, _F32_TINY = float(np.finfo(np.float32).max), float(np.finfo(np.float32).tiny)


def float_dtype(values: np.ndarray) -> str:
    """``"<f4"`` when float32 holds every finite value (no overflow, no non-zero underflow), else ``"<f8"``."""
    mag = np.abs(values[np.isfinite(values)])
    mag = mag[mag > 0]
    return "<f4" if not mag.size or (float(mag.max()) <= _F32_MAX and float(mag.min()) >= _F32_TINY) else "<f8"


def _padded(window: tuple[int, int]) -> list[float]:
    """The onset window's x range, 2% (at least half a step) wider each side: an onset at its edge stays visible."""
    pad = max(0.5, 0.02 * (window[1] - window[0]))
    return [window[0] - pad, window[1] + pad]


class FigureBuilder:
    """Collects the chart data of one page: sources (one per series, shared by its panels and overlays) and panels."""

    def __init__(self, analysis: Analysis, run: RunData, window: tuple[int, int] | None) -> None:
        self.run, self.window = run, window
        self.onset = int(analysis.onset["step"]) if analysis.onset else None
        col = run.metrics.get_column("step")
        first, last = int(col.min()), int(col.max())  # type: ignore[arg-type]
        pad = max(1.0, 0.01 * (last - first))
        bounds = sorted((s, v) for s, v in run.segment_starts().items() if s > 0)
        self.sources: dict[str, dict[str, Any]] = {}
        self.shown: dict[str, int] = {}
        self.superseded: dict[str, tuple[Superseded, int]] = {}  # rows the timeline left out, and how many drawn
        self.panels: list[dict[str, Any]] = []
        self.spec: dict[str, Any] = {
            "x": {"main": [first - pad, last + pad], "zoom": _padded(window or (first, last))}, "steps": [first, last],
            "onset": self.onset, "bounds": [[int(g), float(v)] for g, v in bounds],
            "sources": self.sources, "panels": self.panels, "overlay": [], "window": list(window) if window else None,
        }

    def source(self, s: Series, *, panel: bool = True) -> dict[str, Any]:
        """The display data of one series (made once, shared by its panels and overlays).

        ``panel=False``: a series only offered as an overlay (made after every panel's own): no smoothed line.
        """
        if s.metric not in self.sources:
            data = display_data(s, self.window, self.onset, smoothed=panel)
            self.shown[s.metric] = int(data["x"].size)
            self.sources[s.metric] = {"x": b64(data["x"], "<f8"), "y": b64(data["y"], "<f8"), "marks": markers(s)}
            if panel:
                dtype = float_dtype(data["ys"])  # float64 beyond float32 (1e300 would be inf, 1e-300 zero)
                self.sources[s.metric].update(ys=b64(data["ys"], dtype), ysF64=dtype == "<f8")
                self._superseded(s)
        return self.sources[s.metric]

    def _superseded(self, s: Series) -> None:
        """The rows a later segment superseded, drawn grey one line per segment (QA s7 F3: they were dropped)."""
        rows = superseded(self.run, s)
        if rows is None:
            return
        sup = superseded_display(rows) if rows.steps.size else None
        drawn = 0 if sup is None else int(np.isfinite(sup["seg"]).sum())
        self.superseded[s.metric] = (rows, drawn)
        if sup is not None:
            self.sources[s.metric]["sup"] = {k: b64(v, "<f8") for k, v in sup.items()}

    def line_panel(self, s: Series, pid: str, x_range: str, *, height: int = 210) -> bool:
        """A line panel over the ``"main"`` or ``"zoom"`` x range; returns whether it starts in log scale."""
        self.source(s)
        log = use_log(s.values)
        rows = self.superseded.get(s.metric)
        every = s.values if rows is None else np.concatenate([s.values, rows[0].values])  # the grey rows in range too
        self.commit({"id": pid, "kind": "line", "metric": s.metric, "x": x_range, "height": height,
                     "color": _COLORS.get(s.metric, "#37474f"), "isLog": log, "logRange": log_range(every),
                     "finite": bool(np.isfinite(s.values).any()),
                     "nonPositive": bool((s.values <= 0).any())})  # none: a fixed 0..1 y axis for the markers
        return log

    def commit(self, panel: dict[str, Any]) -> None:
        """Add a panel once its data and its series' data are plain JSON (no NaN/inf); raises ``ValueError``."""
        json.dumps([panel, self.sources.get(panel["metric"])], allow_nan=False)
        self.panels.append(panel)

    def heat_panel(self, base: str, layers: Sequence[Series], pid: str) -> str:
        """A per-layer heat map (max per step bin); returns its caption."""
        edges, grid, bad, seen = layer_bins(layers, HEATMAP_BINS)
        fin_vals = grid[np.isfinite(grid)]
        vmin = float(fin_vals.min()) if fin_vals.size else 0.0
        vmax = float(fin_vals.max()) if fin_vals.size else 1.0
        log = vmin > 0 and vmax / max(vmin, 1e-300) > 100
        below = vmin / 10 if log else vmin - 1.0
        high = vmax if log or vmax > vmin else vmin + 1
        img = np.where(np.isfinite(grid), grid, below)
        img[bad] = np.nan
        img[~seen] = below
        dtype = float_dtype(img)
        self.commit({
            "id": pid, "kind": "heat", "metric": base, "x": "main", "height": int(110 + 9 * min(len(layers), 48)),
            "image": b64(img, dtype), "f64": dtype == "<f8", "rows": len(layers), "cols": int(img.shape[1]),
            "x0": float(edges[0]),
            "dw": float(edges[-1] - edges[0]), "log": bool(log), "low": vmin, "high": high,
            "ticks": list(range(0, len(layers), max(1, len(layers) // 12))),
        })
        return (f"max per bin over {grid.shape[1]} step bins; red: non-finite values in the bin; grey: not logged"
                + ("; log colour scale" if log else "") + "; rows by layer index: "
                + ", ".join(f"{i}={s.metric.partition('/')[2]}" for i, s in enumerate(layers[:24]))
                + (f", +{len(layers) - 24} more" if len(layers) > 24 else ""))
