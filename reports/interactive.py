"""Interactive charts of the HTML report, drawn in the page by BokehJS from compact data the report embeds.

Every panel has hover values, box zoom, pan and wheel zoom; the full-run panels share one x range (so
do the "around the onset" panels); the page's own buttons toggle a log y axis and smoothing and
overlay any other logged series on a second y axis. NaN/+inf/-inf points are drawn as markers at the
top or bottom edge (the line breaks there), segment starts (restarts, resumes) as dashed lines, the
onset as a red line. One self-contained file: BokehJS (``bokeh.min.js``) and its JS plotting API
(``bokeh-api.min.js``) are inlined from the installed bokeh package, found with
:func:`importlib.util.find_spec` without importing it, and ``reports/templates/charts.js`` builds the figures
from the JSON in ``<script id="tf-charts">`` (:mod:`reports.figures`): no Bokeh model is built or serialised in
Python (issue 17: that and Bokeh's import were most of a report's cost). No request leaves the page.

Display only: long series are reduced to the min and max of each bucket with every non-finite point
kept (:func:`reports.charts.display_indices`), at full resolution over the causal chain's window.
Detection never sees these arrays; the full data is in the JSON/Parquet outputs.

Text from the logs (metric names) never goes into a Bokeh text property (Bokeh parses ``$$...$$`` in
titles and axis labels as TeX): titles and captions are HTML, autoescaped by the template.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from reports.chart_data import (
    causal_chain,
    chain_metrics,
    chain_window,
    constant_line,
    counts_caption,
    is_constant,
    log_note,
    slug,
    superseded_caption,
)
from reports.figures import FigureBuilder

if TYPE_CHECKING:
    from forensics.model import Analysis, RunData, Series

T = TypeVar("T")
MAX_OVERLAY = 40
"""Series offered for overlay at most (each one's display data is in the page)."""


@dataclass(frozen=True)
class Panel:
    """One chart of the page.

    Attributes:
        id: Element id of its ``<figure>`` (``chart-loss``, ``zoom-grad_norm``, ``layers-attn_logit_max``).
        metric: The metric (or per-layer base) drawn.
        title: Caption title (HTML-escaped by the template).
        caption: One line on what is drawn.
        div: The placeholder ``<div>`` the page's script draws the panel into (no log text in it).
        kind: ``"line"`` (toolbar with log/smooth/overlay) or ``"heat"``.
        log: The panel starts with a log y axis.
        log_ok: A log y axis can show something (some value is positive); else its toggle is disabled.
        log_note: What a log y axis leaves out, or why it is disabled (the toggle's tooltip; ``""``: nothing).
    """

    id: str
    metric: str
    title: str
    caption: str
    div: str
    kind: str = "line"
    log: bool = False
    log_ok: bool = True
    log_note: str = ""


@dataclass(frozen=True)
class ChartSet:
    """Everything the template needs for the charts.

    Attributes:
        resources: The inline BokehJS ``<script>`` tags (core and its JS API).
        script: The chart data (``<script type="application/json" id="tf-charts">``) and the script drawing it.
        main, zoom, layers: Panels of the full run, around the onset, per layer.
        constant: One line per constant series (collapsed, not drawn).
        zoom_constant: The same for the onset window.
        window: ``(lo, hi)`` steps of the onset window, or ``None``.
        config: The chart data (:attr:`reports.figures.FigureBuilder.spec`); JSON-serialisable.
        chain: The codes of the findings on the causal chain that sized the window (:func:`chain_codes`).
        dropped: One note per panel whose chart data could not be made (the rest of the report is written).
        starts: The segment starts, one line per start step (:func:`start_lines`).
        unpanelled: One line on the series without a panel of their own (:func:`unpanelled`).
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
    dropped: list[str] = field(default_factory=list)
    starts: list[str] = field(default_factory=list)
    unpanelled: str = ""


MAX_START_LINES = 200
"""Start steps listed under the charts at most (every restart is a finding in the evidence table and the JSON)."""


def start_lines(bounds: Iterable[tuple[int, float]]) -> list[str]:
    """The segment starts as a list, one line per start step: ``"step 0: segments 1-999 (999 starts)"``.

    The labels on the charts are thinned to stay readable (QA s7 F4); this list names every start (the first
    :data:`MAX_START_LINES` start steps, then how many more).
    """
    at: dict[float, list[int]] = {}
    for seg, step in bounds:
        at.setdefault(step, []).append(int(seg))
    out = []
    for step in sorted(at)[:MAX_START_LINES]:
        segs = at[step]
        if len(segs) == 1:
            words = f"segment {segs[0]}"
        elif segs[-1] - segs[0] + 1 == len(segs):
            words = f"segments {segs[0]}\u2013{segs[-1]} ({len(segs):,} starts)"
        else:
            some = ", ".join(map(str, segs[:12])) + (", ..." if len(segs) > 12 else "")
            words = f"segments {some} ({len(segs):,} starts)"
        out.append(f"step {int(step):,}: {words}")
    if len(at) > MAX_START_LINES:
        out.append(f"+{len(at) - MAX_START_LINES:,} more start steps (every restart is a finding: Evidence, -f json)")
    return out



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
        The :class:`ChartSet` (inline BokehJS, the chart data and script, panels, collapsed constant series).
    """
    window = chain_window(analysis, run)
    b = FigureBuilder(analysis, run, window)
    out = ChartSet(resources="", script="", window=window, chain=chain_codes(causal_chain(analysis)))
    ids = _Ids()
    _main_panels(b, out, ids, main)
    if window is not None:
        _zoom_panels(b, out, ids, chain_metrics(analysis, run), window)
    _layer_panels(b, out, ids, layer_groups)
    # every other series, so any panel can overlay it
    overlay = [m for m in run.metric_names if "/" not in m][:MAX_OVERLAY]
    for m in overlay:
        s = _series(run, m)
        if s is not None:
            b.source(s, panel=False)
    b.spec["overlay"] = [m for m in overlay if m in b.sources]
    out = dataclasses.replace(out, unpanelled=unpanelled(b, out, layer_groups))
    if not b.panels:
        return out
    return _embed(b, out, window)


def unpanelled(b: FigureBuilder, out: ChartSet, layer_groups: Mapping[str, list[str]]) -> str:
    """One line on the logged series without a panel of their own (``""``: none): nothing is left out unsaid.

    Example: ``"45 other series have no panel of their own: m00, m01, ...; 38 of them can be overlaid on a panel
    (its overlay menu); all are in -f json and forensics ingest."``
    """
    drawn = {p.metric for p in out.main + out.zoom}
    drawn |= {m for p in out.layers for m in layer_groups.get(p.metric, [])}
    drawn |= {line.partition(": constant ")[0] for line in out.constant + out.zoom_constant}
    rest = [m for m in b.run.metric_names if m not in drawn]
    if not rest:
        return ""
    offered = len(set(rest) & set(b.spec["overlay"]))
    names = ", ".join(rest[:12]) + (", ..." if len(rest) > 12 else "")
    return (f"{len(rest):,} other series have no panel of their own: {names}; "
            + (f"{offered:,} of them can be overlaid on a panel (its overlay menu); " if offered else "")
            + "all are in -f json and forensics ingest.")


def chain_codes(findings: Iterable[Any]) -> list[str]:
    """The chain's finding codes, each once in first-seen order, a repeated one with its count (``INT01 x999``).

    A run restarted 1,000 times has 999 restart findings on its chain; the page names the code once.
    """
    counts: dict[str, int] = {}
    for f in findings:
        counts[f.code] = counts.get(f.code, 0) + 1
    return [code if n == 1 else f"{code} x{n}" for code, n in counts.items()]


class _Ids:
    """Unique element ids of the panels (``chart-loss``, ``chart-loss-2``, ...)."""

    def __init__(self) -> None:
        self.used: set[str] = set()

    def new(self, prefix: str, name: str) -> str:
        pid = f"{prefix}-{slug(name)}"
        k = 2
        while pid in self.used:
            pid, k = f"{prefix}-{slug(name)}-{k}", k + 1
        self.used.add(pid)
        return pid


def _series(run: RunData, name: str) -> Series | None:
    s = run.series(name)
    return s if s is not None and len(s) > 0 else None


def _guarded(b: FigureBuilder, out: ChartSet, what: str, make: Callable[[], T]) -> T | None:
    """``make()`` (one panel), or ``None`` with a note in ``out.dropped`` when its data cannot be made.

    A panel's chart data never costs the report: the panel is left out, said so on the page, the rest is written.
    """
    n_panels, sources = len(b.panels), set(b.sources)
    try:
        return make()
    except (ValueError, OverflowError, ArithmeticError, TypeError) as exc:
        del b.panels[n_panels:]
        for m in set(b.sources) - sources:
            del b.sources[m]
        out.dropped.append(f"{what}: chart not drawn ({type(exc).__name__}: {exc})")
        return None


def _main_panels(b: FigureBuilder, out: ChartSet, ids: _Ids, main: Iterable[str]) -> None:
    """Full-run panels (a constant series collapsed to one line)."""
    for name in main:
        s = _series(b.run, name)
        if s is None:
            continue
        if is_constant(s):
            out.constant.append(constant_line(s))
            continue
        pid = ids.new("chart", name)
        log = _guarded(b, out, name, functools.partial(b.line_panel, s, pid, "main"))
        if log is not None:
            caption = "; ".join(c for c in (counts_caption(s, b.shown[name]),
                                            superseded_caption(*b.superseded.get(name, (None, 0)))) if c)
            out.main.append(Panel(pid, name, name, caption, "", "line", log, *log_note(s.values)))


def _zoom_panels(b: FigureBuilder, out: ChartSet, ids: _Ids, names: Iterable[str], window: tuple[int, int]) -> None:
    """Panels around the onset: the causal chain's series over its window, every point drawn."""
    for name in names:
        s = _series(b.run, name)
        if s is None:
            continue
        if is_constant(s):
            out.zoom_constant.append(constant_line(s))
            continue
        inside = (s.steps >= window[0]) & (s.steps <= window[1])
        pid = ids.new("zoom", name)
        log = _guarded(b, out, f"{name} (around the onset)",
                       functools.partial(b.line_panel, s, pid, "zoom", height=190))
        if log is not None:
            rows = b.superseded.get(name, (None, 0))[0]
            grey = 0 if rows is None else int(((rows.steps >= window[0]) & (rows.steps <= window[1])).sum())
            out.zoom.append(Panel(pid, name, f"{name}, steps {window[0]:,} to {window[1]:,}",
                              f"{int(inside.sum()):,} points in the window, all drawn"
                              + (f"; grey: {int(grey):,} rows superseded by later segments" if grey else ""),
                              "", "line", log, *log_note(s.values)))


def _layer_panels(b: FigureBuilder, out: ChartSet, ids: _Ids, layer_groups: Mapping[str, list[str]]) -> None:
    """One heat map per per-layer group, rows in layer order."""
    for base, members in layer_groups.items():
        layers = sorted((s for m in members if (s := _series(b.run, m)) is not None),
                        key=lambda s: _layer_key(s.metric))
        if not layers:
            continue
        pid = ids.new("layers", base)
        caption = _guarded(b, out, f"{base} per layer", functools.partial(b.heat_panel, base, layers, pid))
        if caption is not None:
            out.layers.append(Panel(pid, base, f"{base} per layer ({len(layers)} layers)", caption, "", "heat"))


def _embed(b: FigureBuilder, out: ChartSet, window: tuple[int, int] | None) -> ChartSet:
    """The panels with their placeholder divs, the chart data and script, and the inline BokehJS."""

    def placed(p: Panel) -> Panel:
        return Panel(p.id, p.metric, p.title, p.caption, f'<div class="tf-plot" id="{p.id}-plot"></div>', p.kind, p.log,
                     p.log_ok, p.log_note)

    script = (f'<script type="application/json" id="tf-charts">{data_json(b.spec)}</script>\n'
              f"<script>{_charts_js()}</script>")
    return ChartSet(
        resources=_core_js(), script=script,
        main=[placed(p) for p in out.main], zoom=[placed(p) for p in out.zoom], layers=[placed(p) for p in out.layers],
        constant=out.constant, zoom_constant=out.zoom_constant, window=window, config=b.spec, chain=out.chain,
        dropped=out.dropped, starts=start_lines((int(g), float(v)) for g, v in b.spec["bounds"]),
        unpanelled=out.unpanelled,
    )


def data_json(spec: Mapping[str, Any]) -> str:
    """The chart data as JSON safe inside ``<script>``: ASCII only, every ``<`` escaped (so no ``</script>``).

    Metric names are keys here; ``JSON.parse`` gives them back unchanged, and nothing in the page puts them
    into markup or a Bokeh text property.
    """
    return json.dumps(spec, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")


_MATHJAX_CDN = 'src="https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-svg.js"'
_BOKEH_JS = ("bokeh.min.js", "bokeh-api.min.js")
"""BokehJS core and its JS plotting API (the report uses no widgets, tables, WebGL or MathJax)."""


def bokehjs_dir() -> Path:
    """The installed bokeh package's ``server/static/js`` folder, found without importing bokeh (~0.3 s).

    Raises:
        ModuleNotFoundError: bokeh is not installed.
    """
    spec = importlib.util.find_spec("bokeh")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("bokeh is not installed (it provides BokehJS, the report's chart library)")
    return Path(spec.origin).parent / "server" / "static" / "js"


@functools.cache
def _core_js() -> str:
    """BokehJS core and its JS API, inline (read once a process)."""
    folder = bokehjs_dir()
    return "".join(f"<script>{_offline((folder / name).read_text(encoding='utf-8'))}</script>" for name in _BOKEH_JS)


@functools.cache
def _charts_js() -> str:
    """``reports/templates/charts.js``: the page script that builds the figures from the chart data."""
    return (Path(__file__).resolve().parent / "templates" / "charts.js").read_text(encoding="utf-8")


def _offline(js: str) -> str:
    """BokehJS with its one self-triggered network path cut.

    The MathJax CDN loader (used only when a text property holds TeX, which the report never puts
    there) gets an empty ``data:`` script instead.
    """
    return js.replace(_MATHJAX_CDN, 'src="data:text/javascript,"')
