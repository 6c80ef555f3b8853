"""The Bokeh figures of the HTML report: line panels (hover, zoom, log/smooth/overlay toolbar) and per-layer heat maps.

All figures of one page are built in one document by :class:`FigureBuilder` (shared x ranges need one
document); :func:`reports.interactive.build` lays them out. Text from the logs never goes into a Bokeh text
property (Bokeh parses ``$$...$$`` as TeX).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from reports._common import layer_bins
from reports.chart_data import display_data, markers, use_log

if TYPE_CHECKING:
    from forensics.model import Analysis, RunData, Series

HEATMAP_BINS = 400
"""Step bins of a per-layer heat map."""
_COLORS = {
    "loss": "#1f5fa8", "lr": "#2e7d32", "grad_norm": "#8e44ad", "loss_scale": "#b9770e",
    "update_ratio": "#00838f", "attn_logit_max": "#ad1457", "log_z": "#5d4037",
}
MARK_MODELS = 50
"""Segment starts drawn as one Span and Label each up to this many; more share one glyph and one label set
(issue 16: a run of 1,000 segments made 4,000 Bokeh models, seconds to build and megabytes of page; ours)."""
_ONSET = "#c62828"
_OVERLAY = "#e67e22"


class FigureBuilder:
    """Builds every Bokeh model of one page in one document (shared ranges need one document)."""

    def __init__(self, analysis: Analysis, run: RunData, window: tuple[int, int] | None) -> None:
        from bokeh.models import ColumnDataSource, Range1d

        self.a, self.run, self.window = analysis, run, window
        self.onset = int(analysis.onset["step"]) if analysis.onset else None
        col = run.metrics.get_column("step")
        first, last = int(col.min()), int(col.max())  # type: ignore[arg-type]
        pad = max(1.0, 0.01 * (last - first))
        self.x_main = Range1d(first - pad, last + pad, name="x-main")
        self.x_zoom = Range1d(*(window or (first, last)), name="x-zoom")
        self.bounds = sorted((s, v) for s, v in run.segment_starts().items() if s > 0)
        self.sources: dict[str, Any] = {}
        self.marker_sources: dict[str, Any] = {}
        self.bounds_source: Any = None
        self.shown: dict[str, int] = {}
        self.cds = ColumnDataSource
        self.value_formatter = _value_formatter()  # one model shared by every value axis
        self.config: dict[str, Any] = {"panels": {}, "sources": {}, "x": {"main": self.x_main.id,
                                                                      "zoom": self.x_zoom.id}}

    def source(self, s: Series) -> Any:
        """The display data source of one series (made once, shared by its panels and overlays)."""
        if s.metric not in self.sources:
            data = display_data(s, self.window, self.onset)
            self.shown[s.metric] = int(data["x"].size)
            self.sources[s.metric] = self.cds(data=data, name=f"src-{s.metric}")
            self.marker_sources[s.metric] = self.cds(data=markers(s))
            self.config["sources"][s.metric] = self.sources[s.metric].id
        return self.sources[s.metric]

    def _marks(self, p: Any, pid: str) -> None:
        from bokeh.models import Label, LabelSet, Span

        if len(self.bounds) > MARK_MODELS:  # one glyph and one label set for all (a run of 1,000 segments)
            if self.bounds_source is None:  # one source, shared by every panel
                self.bounds_source = self.cds(data={
                    "x": [float(v) for _, v in self.bounds], "text": [f" seg {g}" for g, _ in self.bounds]})
            src = self.bounds_source
            r = p.segment(x0="x", y0=0, x1="x", y1=1, source=src, y_range_name="edge", line_color="#555555",
                          line_dash="dashed", line_width=1)
            r.nonselection_glyph = None
            r.muted_glyph = None
            p.add_layout(LabelSet(x="x", y=0.88, y_range_name="edge", text="text", source=src, text_font_size="8pt",
                                  text_color="#555555", text_baseline="top"))
        for seg, step in self.bounds if len(self.bounds) <= MARK_MODELS else ():
            p.add_layout(Span(location=step, dimension="height", line_color="#555555", line_dash="dashed",
                              line_width=1))
            p.add_layout(Label(x=step, y=0.88, y_range_name="edge", text=f" seg {seg}", text_font_size="8pt",
                               text_color="#555555", text_baseline="top"))
        if self.onset is not None:
            p.add_layout(Span(location=self.onset, dimension="height", line_color=_ONSET, line_width=2))
            p.add_layout(Label(x=self.onset, y=0.02, y_range_name="edge", text=f" onset {self.onset:,}",
                               text_font_size="8pt", text_color=_ONSET, text_font_style="bold", x_offset=2))
        cursor = Span(location=0, dimension="height", line_color="#f79009", line_width=2, visible=False,
                      name=f"{pid}-cursor")
        p.add_layout(cursor)
        self.config["panels"][pid]["cursor"] = cursor.id

    def line_panel(self, s: Series, pid: str, x_range: Any, *, height: int = 210) -> bool:
        """A line panel; returns whether it starts in log scale."""
        from bokeh.models import DataRange1d, HoverTool, LinearAxis, LogAxis, LogScale, Range1d
        from bokeh.plotting import figure

        src = self.source(s)
        log = use_log(s.values)
        p = figure(height=height, sizing_mode="stretch_width", x_range=x_range, name=pid,
                   tools="xpan,xwheel_zoom,box_zoom,reset", active_drag="box_zoom", toolbar_location="right",
                   y_axis_location=None, min_border_left=60, min_border_right=60)
        color = _COLORS.get(s.metric, "#37474f")
        lin_r = p.line("x", "y", source=src, line_color=color, line_width=1.3, visible=not log)
        log_r = p.line("x", "ylog", source=src, line_color=color, line_width=1.3, visible=log, y_range_name="log")
        sm_r = p.line("x", "ys", source=src, line_color="#101828", line_width=1.6, visible=False)
        sm_log_r = p.line("x", "ys", source=src, line_color="#101828", line_width=1.6, visible=False,
                          y_range_name="log")
        ov_src = self.cds(data={"x": [], "y": []})
        ov_r = p.line("x", "y", source=ov_src, line_color=_OVERLAY, line_width=1.2, line_dash="dashed",
                      visible=False, y_range_name="ov")
        mk_r = p.scatter("x", "y", source=self.marker_sources[s.metric], marker="marker", size=9,
                         line_color=_ONSET, fill_color=_ONSET, line_width=2, y_range_name="edge")
        for r in (lin_r, log_r, sm_r, sm_log_r, ov_r, mk_r):  # no selection, no legend muting: fewer models
            r.nonselection_glyph = None
            r.muted_glyph = None
        p.y_range = DataRange1d(renderers=[lin_r], range_padding=0.05)
        pos = s.values[np.isfinite(s.values) & (s.values > 0)]
        log_lo, log_hi = (float(pos.min()), float(pos.max())) if pos.size else (1.0, 10.0)
        if log_hi <= log_lo:
            log_lo, log_hi = log_lo / 2, log_hi * 2
        ratio = (log_hi / log_lo) ** 0.04  # 4% padding in log space
        p.extra_y_ranges = {"log": Range1d(log_lo / ratio, log_hi * ratio),
                            "ov": Range1d(0, 1),  # set from the chosen series by the page script
                            "edge": Range1d(0, 1)}
        p.extra_y_scales = {"log": LogScale()}
        ylin = LinearAxis(visible=not log, formatter=self.value_formatter)
        ylog = LogAxis(y_range_name="log", visible=log)
        yov = LinearAxis(y_range_name="ov", visible=False, axis_line_color=_OVERLAY, formatter=self.value_formatter,
                         major_label_text_color=_OVERLAY)
        p.add_layout(ylin, "left")
        p.add_layout(ylog, "left")
        p.add_layout(yov, "right")
        p.xaxis.axis_label = "step"
        p.xaxis.formatter = _step_formatter()
        p.add_tools(HoverTool(renderers=[lin_r, log_r], mode="vline",
                              tooltips=[("step", "@x{0,0}"), ("value", "@y{%.6g}")], formatters={"@y": "printf"}))
        p.add_tools(HoverTool(renderers=[mk_r], tooltips=[("step", "@x{0,0}"), ("value", "@kind")]))
        p.add_tools(HoverTool(renderers=[ov_r], mode="vline",
                              tooltips=[("step", "@x{0,0}"), ("overlay", "@y{%.6g}")], formatters={"@y": "printf"}))
        p.grid.grid_line_color = "#eeeeee"
        p.outline_line_color = None
        p.toolbar.logo = None
        self.config["panels"][pid] = {"metric": s.metric, "plot": p.id, "lin": lin_r.id, "log": log_r.id,
                                      "smooth": sm_r.id, "smoothLog": sm_log_r.id, "ov": ov_r.id,
                                      "ylin": ylin.id, "ylog": ylog.id, "yov": yov.id, "isLog": log,
                                      "ovRange": p.extra_y_ranges["ov"].id}
        self._marks(p, pid)
        self.plots[pid] = p
        return log

    def heat_panel(self, base: str, layers: Sequence[Series], pid: str) -> str:
        """A per-layer heat map (max per step bin); returns its caption."""
        from bokeh.models import HoverTool, LinearColorMapper, LogColorMapper, Range1d
        from bokeh.palettes import Viridis256
        from bokeh.plotting import figure

        edges, grid, bad, seen = layer_bins(layers, HEATMAP_BINS)
        fin_vals = grid[np.isfinite(grid)]
        vmin = float(fin_vals.min()) if fin_vals.size else 0.0
        vmax = float(fin_vals.max()) if fin_vals.size else 1.0
        log = vmin > 0 and vmax / max(vmin, 1e-300) > 100
        if log:
            mapper: Any = LogColorMapper(palette=Viridis256, low=vmin, high=vmax, nan_color="#d92d20",
                                         low_color="#eeeeee")
            below = vmin / 10
        else:
            mapper = LinearColorMapper(palette=Viridis256, low=vmin, high=vmax if vmax > vmin else vmin + 1,
                                       nan_color="#d92d20", low_color="#eeeeee")
            below = vmin - 1.0
        img = np.where(np.isfinite(grid), grid, below)
        img[bad] = np.nan
        img[~seen] = below
        p = figure(height=int(110 + 9 * min(len(layers), 48)), sizing_mode="stretch_width", x_range=self.x_main,
                   y_range=Range1d(-0.5, len(layers) - 0.5), name=pid, tools="xpan,xwheel_zoom,box_zoom,reset",
                   active_drag="box_zoom", min_border_left=60, min_border_right=60)
        r = p.image(image=[img.astype(np.float32)], x=float(edges[0]), y=-0.5, dw=float(edges[-1] - edges[0]),
                    dh=len(layers), color_mapper=mapper)
        p.add_tools(HoverTool(renderers=[r], tooltips=[("step", "$x{0,0}"), ("layer", "$y{0}"),
                                                       ("max", "@image{%.4g}")], formatters={"@image": "printf"}))
        p.yaxis.axis_label = "layer index"
        p.yaxis.ticker = list(range(0, len(layers), max(1, len(layers) // 12)))
        p.xaxis.axis_label = "step"
        p.xaxis.formatter = _step_formatter()
        p.grid.visible = False
        p.toolbar.logo = None
        p.extra_y_ranges = {"edge": Range1d(0, 1)}
        self.config["panels"][pid] = {"metric": base, "plot": p.id, "heat": True}
        self._marks(p, pid)
        self.plots[pid] = p
        return (f"max per bin over {grid.shape[1]} step bins; red: non-finite values in the bin; grey: not logged"
                + ("; log colour scale" if log else "") + "; rows by layer index: "
                + ", ".join(f"{i}={s.metric.partition('/')[2]}" for i, s in enumerate(layers[:24]))
                + (f", +{len(layers) - 24} more" if len(layers) > 24 else ""))

    plots: dict[str, Any]


def _step_formatter() -> Any:
    """Step ticks as 1,200 / 250,000 (no ``1e6`` offset; no JS code, so no ``eval`` under a CSP)."""
    from bokeh.models import NumeralTickFormatter

    return NumeralTickFormatter(format="0,0")


def _value_formatter() -> Any:
    """Value ticks as 0.0015 / 2.5 / 12000, scientific only beyond 1e-5..1e6 (no JS code)."""
    from bokeh.models import BasicTickFormatter

    return BasicTickFormatter(power_limit_low=-5, power_limit_high=6)


