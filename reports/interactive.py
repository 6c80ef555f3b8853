"""Interactive charts of the HTML report, drawn with Bokeh and embedded with its inline resources.

Every panel has hover values, box zoom, pan and wheel zoom; the full-run panels share one x range (so
do the "around the onset" panels); the page's own buttons toggle a log y axis and smoothing and
overlay any other logged series on a second y axis. NaN/+inf/-inf points are drawn as markers at the
top or bottom edge (the line breaks there), segment starts (restarts, resumes) as dashed lines, the
onset as a red line. One self-contained file: BokehJS is inlined (:data:`bokeh.resources.INLINE`), no
request leaves the page.

Display only: long series are reduced to the min and max of each bucket with every non-finite point
kept (:func:`reports.charts.display_indices`), at full resolution over the causal chain's window.
Detection never sees these arrays; the full data is in the JSON/Parquet outputs.

Text from the logs (metric names) never goes into a Bokeh text property (Bokeh parses ``$$...$$`` in
titles and axis labels as TeX): titles and captions are HTML, autoescaped by the template.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from reports._common import fmt_num, layer_bins
from reports.charts import BUCKETS, MAX_MARKERS, display_indices

if TYPE_CHECKING:
    from forensics.model import Analysis, Finding, RunData, Series

HEATMAP_BINS = 400
"""Step bins of a per-layer heat map."""
MAX_OVERLAY = 40
"""Series offered for overlay at most (each one's display data is in the page)."""
MIN_HALF_WINDOW_POINTS = 30
"""The onset window reaches at least this many logging intervals beyond the causal chain on each side."""

_COLORS = {
    "loss": "#1f5fa8", "lr": "#2e7d32", "grad_norm": "#8e44ad", "loss_scale": "#b9770e",
    "update_ratio": "#00838f", "attn_logit_max": "#ad1457", "log_z": "#5d4037",
}
_ONSET = "#c62828"
_OVERLAY = "#e67e22"


@dataclass(frozen=True)
class Panel:
    """One chart of the page.

    Attributes:
        id: Element id of its ``<figure>`` (``chart-loss``, ``zoom-grad_norm``, ``layers-attn_logit_max``).
        metric: The metric (or per-layer base) drawn.
        title: Caption title (HTML-escaped by the template).
        caption: One line on what is drawn.
        div: Bokeh's placeholder ``<div>`` (markup made by Bokeh, no log text in it).
        kind: ``"line"`` (toolbar with log/smooth/overlay) or ``"heat"``.
        log: The panel starts with a log y axis.
    """

    id: str
    metric: str
    title: str
    caption: str
    div: str
    kind: str = "line"
    log: bool = False


@dataclass(frozen=True)
class ChartSet:
    """Everything the template needs for the charts.

    Attributes:
        resources: The inline BokehJS ``<script>`` tags.
        script: Bokeh's document script (``<script type="application/json">`` data plus the embed call).
        main, zoom, layers: Panels of the full run, around the onset, per layer.
        constant: One line per constant series (collapsed, not drawn).
        zoom_constant: The same for the onset window.
        window: ``(lo, hi)`` steps of the onset window, or ``None``.
        config: Model ids for the page's script (ranges, renderers, sources); JSON-serialisable.
        chain: The findings on the causal chain (codes) that sized the window.
    """

    resources: str
    script: str
    main: list[Panel] = field(default_factory=list)
    zoom: list[Panel] = field(default_factory=list)
    layers: list[Panel] = field(default_factory=list)
    constant: list[str] = field(default_factory=list)
    zoom_constant: list[str] = field(default_factory=list)
    window: tuple[int, int] | None = None
    config: dict[str, Any] = field(default_factory=dict)
    chain: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------------- planning


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

    Args:
        values: float64 values in step order.
        span: EMA span in points (default: 1% of the series, at least 5).

    Returns:
        float64 array of the same length; NaN where no finite value came yet.
    """
    from scipy.signal import lfilter

    n = values.size
    if n == 0:
        return values.astype(np.float64)
    span = span or max(5, n // 100)
    alpha = 2.0 / (span + 1.0)
    fin = np.isfinite(values)
    idx = np.where(fin, np.arange(n), -1)
    np.maximum.accumulate(idx, out=idx)
    filled = np.where(idx >= 0, values[np.maximum(idx, 0)], 0.0)
    started = idx >= 0
    k = np.cumsum(started)  # points since the first finite value
    ema = lfilter([alpha], [1.0, -(1.0 - alpha)], np.where(started, filled, 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        out = ema / (1.0 - (1.0 - alpha) ** np.maximum(k, 1))
    out[~started] = np.nan
    return out


def _display(series: Series, window: tuple[int, int] | None, onset: int | None) -> dict[str, np.ndarray]:
    idx = display_indices(series.steps, series.values, window, onset, BUCKETS)
    v = series.values[idx]
    y = np.where(np.isfinite(v), v, np.nan)
    return {
        "x": series.steps[idx].astype(np.float64),
        "y": y,
        "ylog": np.where(y > 0, y, np.nan).astype(np.float32),
        "ys": smooth(series.values)[idx].astype(np.float32),
    }


def _markers(series: Series) -> dict[str, list[Any]]:
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


def _use_log(values: np.ndarray) -> bool:
    fin = values[np.isfinite(values)]
    return bool(fin.size) and float(fin.min()) > 0 and float(fin.max()) / float(fin.min()) > 100.0


def _counts(series: Series, shown: int) -> str:
    v = series.values
    parts = [f"{len(series):,} points"]
    if shown < len(series):
        parts.append(f"{shown:,} drawn (min/max per bucket, full resolution near the onset)")
    bad = [f"{int(n):,} {k}" for k, n in (("NaN", np.isnan(v).sum()), ("+inf", np.isposinf(v).sum()),
                                           ("-inf", np.isneginf(v).sum())) if n]
    if bad:
        parts.append("non-finite: " + ", ".join(bad) + " (markers at the edge)")
    return "; ".join(parts)


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "metric"


# ----------------------------------------------------------------------------------- figures


class _Builder:
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
        self.shown: dict[str, int] = {}
        self.cds = ColumnDataSource
        self.value_formatter = _value_formatter()  # one model shared by every value axis
        self.config: dict[str, Any] = {"panels": {}, "sources": {}, "x": {"main": self.x_main.id,
                                                                      "zoom": self.x_zoom.id}}

    def source(self, s: Series) -> Any:
        if s.metric not in self.sources:
            data = _display(s, self.window, self.onset)
            self.shown[s.metric] = int(data["x"].size)
            self.sources[s.metric] = self.cds(data=data, name=f"src-{s.metric}")
            self.marker_sources[s.metric] = self.cds(data=_markers(s))
            self.config["sources"][s.metric] = self.sources[s.metric].id
        return self.sources[s.metric]

    def _marks(self, p: Any, pid: str) -> None:
        from bokeh.models import Label, Span

        for seg, step in self.bounds:
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
        log = _use_log(s.values)
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


def _layer_key(name: str) -> tuple[Any, ...]:
    return tuple((0, int(t)) if t.isdigit() else (1, t) for t in re.split(r"(\d+)", name))


def build(analysis: Analysis, run: RunData, main: Iterable[str], layer_groups: Mapping[str, list[str]],
          ) -> ChartSet:
    """Build the page's charts.

    Args:
        analysis: The engine's result (onset, findings for the causal chain).
        run: The run's data.
        main: Metrics for full-run panels, in order.
        layer_groups: ``{base: [base/layer0, ...]}`` for heat maps.

    Returns:
        The :class:`ChartSet` (inline BokehJS, the document script, panels, collapsed constant series).
    """
    from bokeh.embed import components

    window = chain_window(analysis, run)
    b = _Builder(analysis, run, window)
    b.plots = {}
    out = ChartSet(resources="", script="", window=window, chain=[f.code for f in causal_chain(analysis)])
    used: set[str] = set()

    def series(name: str) -> Series | None:
        s = run.series(name)
        return s if s is not None and len(s) > 0 else None

    def pid_for(prefix: str, name: str) -> str:
        pid = f"{prefix}-{_slug(name)}"
        k = 2
        while pid in used:
            pid, k = f"{prefix}-{_slug(name)}-{k}", k + 1
        used.add(pid)
        return pid

    for name in main:
        s = series(name)
        if s is None:
            continue
        if is_constant(s):
            out.constant.append(constant_line(s))
            continue
        pid = pid_for("chart", name)
        log = b.line_panel(s, pid, b.x_main)
        out.main.append(Panel(pid, name, name, _counts(s, b.shown[name]), "", "line", log))
    if window is not None:
        for name in chain_metrics(analysis, run):
            s = series(name)
            if s is None:
                continue
            if is_constant(s):
                out.zoom_constant.append(constant_line(s))
                continue
            inside = (s.steps >= window[0]) & (s.steps <= window[1])
            pid = pid_for("zoom", name)
            log = b.line_panel(s, pid, b.x_zoom, height=190)
            out.zoom.append(Panel(pid, name, f"{name}, steps {window[0]:,} to {window[1]:,}",
                                  f"{int(inside.sum()):,} points in the window, all drawn", "", "line", log))
    for base, members in layer_groups.items():
        layers = sorted((s for m in members if (s := series(m)) is not None), key=lambda s: _layer_key(s.metric))
        if not layers:
            continue
        pid = pid_for("layers", base)
        caption = b.heat_panel(base, layers, pid)
        out.layers.append(Panel(pid, base, f"{base} per layer ({len(layers)} layers)", caption, "", "heat"))
    # every other series, so any panel can overlay it
    overlay = [m for m in run.metric_names if "/" not in m][:MAX_OVERLAY]
    for m in overlay:
        s = series(m)
        if s is not None:
            b.source(s)
    b.config["overlay"] = [m for m in overlay if m in b.sources]
    if not b.plots:
        return out
    first = next(iter(b.plots.values()))
    first.tags = [*b.sources.values()]  # keep every overlay source in the document
    script, divs = components(b.plots)
    panels = {p.id: p for p in (*out.main, *out.zoom, *out.layers)}
    for pid, div in divs.items():
        p = panels[pid]
        panels[pid] = Panel(p.id, p.metric, p.title, p.caption, div, p.kind, p.log)
    b.config["window"] = list(window) if window else None
    b.config["onset"] = b.onset
    return ChartSet(
        resources=_core_js(),
        script=script,
        main=[panels[p.id] for p in out.main], zoom=[panels[p.id] for p in out.zoom],
        layers=[panels[p.id] for p in out.layers], constant=out.constant, zoom_constant=out.zoom_constant,
        window=window, config=b.config, chain=out.chain,
    )


_MATHJAX_CDN = 'src="https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-svg.js"'


@functools.cache
def _core_js() -> str:
    """BokehJS core, inline (the report uses no widgets, tables, WebGL or MathJax: the core bundle only)."""
    from bokeh.resources import Resources

    return "".join(f"<script>{_offline(js)}</script>" for js in Resources(mode="inline", components=["bokeh"]).js_raw)


def _offline(js: str) -> str:
    """BokehJS with its one self-triggered network path cut.

    The MathJax CDN loader (used only when a text property holds TeX, which the report never puts
    there) gets an empty ``data:`` script instead.
    """
    return js.replace(_MATHJAX_CDN, 'src="data:text/javascript,"')


def config_json(config: Mapping[str, Any]) -> str:
    """The page script's configuration as JSON (placed in an autoescaped attribute by the template)."""
    return json.dumps(config, separators=(",", ":"), allow_nan=False)
