/* The report's interactive charts, built in the page with BokehJS's own JS API (bokeh-api) from the compact
   data the report embeds (script#tf-charts, JSON; arrays as gzip-compressed little-endian float64/float32 in
   base64, as Bokeh's own embedding writes them, decoded by BokehJS's core/util/buffer).
   Every panel: hover values, box zoom, x pan and wheel zoom; panels of a section share one x range. Line panels
   draw the series (linear and log y), its smoothed line, an overlay on a second y axis (set by the page's
   controls), NaN/+inf/-inf markers at the edges, the rows later segments superseded (grey, one line per segment);
   every panel marks segment starts (one dashed line and hover marker per start step, labels thinned by pixel
   distance), the onset, and a cursor the finding links move. No text from the logs goes into a Bokeh
   text property (Bokeh reads $$...$$ as TeX): titles and captions are the page's HTML.
   window.tfCharts: {doc, x: {main, zoom}, window: [lo, hi] or null (the onset window), steps: [first, last] (the
   run's), panels: {id: models}, overlay: [metric] (an overlay <option>'s value is its index here),
   sources: {metric: {line, marks}} (ColumnDataSources), ready (true once drawn)}. */
(function () {
  "use strict";
  var el = document.getElementById("tf-charts");
  if (!el || !window.Bokeh || !Bokeh.Plotting) return;
  var spec = JSON.parse(el.textContent), B = Bokeh;
  var ONSET = "#c62828", OVERLAY = "#e67e22", SEG = "#555555", SUPERSEDED = "#98a2b3", LABEL_GAP = 70;

  var buffer = B.require("core/util/buffer"), nd = B.require("core/util/ndarray");
  function decode(text, Kind) { return new Kind(buffer.base64_to_buffer(text)); }
  var stepFormat = new B.NumeralTickFormatter({format: "0,0"});
  var valueFormat = new B.BasicTickFormatter({power_limit_low: -5, power_limit_high: 6});
  var x = {main: new B.Range1d({start: spec.x.main[0], end: spec.x.main[1], name: "x-main"}),
           zoom: new B.Range1d({start: spec.x.zoom[0], end: spec.x.zoom[1], name: "x-zoom"})};
  var out = {doc: new B.Document(), x: x, window: spec.window, steps: spec.steps, panels: {}, sources: {},
             overlay: spec.overlay, ready: false};
  window.tfCharts = out;

  Object.keys(spec.sources).forEach(function (m) {
    var s = spec.sources[m], xs = decode(s.x, Float64Array), ys = decode(s.y, Float64Array);
    var ylog = new Float64Array(ys.length);
    for (var i = 0; i < ys.length; i++) ylog[i] = ys[i] > 0 ? ys[i] : NaN;
    var data = {x: xs, y: ys, ylog: ylog};
    if (s.ys) data.ys = decode(s.ys, s.ysF64 ? Float64Array : Float32Array);  /* absent for a series only offered as an overlay */
    out.sources[m] = {
      line: new B.ColumnDataSource({data: data}),
      marks: new B.ColumnDataSource({data: s.marks})
    };
    if (s.sup) {  /* rows a later segment superseded: one grey line per segment (NaN between segments) */
      var sy = decode(s.sup.y, Float64Array), slog = new Float64Array(sy.length);
      for (var j = 0; j < sy.length; j++) slog[j] = sy[j] > 0 ? sy[j] : NaN;
      out.sources[m].sup = new B.ColumnDataSource({data: {x: decode(s.sup.x, Float64Array), y: sy, ylog: slog,
                                                            seg: decode(s.sup.seg, Float64Array)}});
    }
  });

  /* segment starts grouped by their step: 999 restarts at step 0 are one line, one hover marker, one label */
  var bounds = spec.bounds, groups = [], byStep = {};
  bounds.forEach(function (b) {
    var k = String(b[1]);
    if (!(k in byStep)) { byStep[k] = {x: b[1], segs: []}; groups.push(byStep[k]); }
    byStep[k].segs.push(b[0]);
  });
  groups.sort(function (a, b) { return a.x - b.x; });
  function segWords(segs, long) {
    var n = segs.length, a = segs[0], z = segs[n - 1];
    if (n === 1) return (long ? "segment " : "seg ") + a;
    return (z - a + 1 === n ? (long ? "segments " : "segs ") + a + "\u2013" + z : n + (long ? " segments" : " segs"))
      + (long ? " (" + n + " starts)" : "");
  }
  var startLines = new B.ColumnDataSource({data: {x: groups.map(function (g) { return g.x; })}});
  var startHover = new B.ColumnDataSource({data: {x: groups.map(function (g) { return g.x; }),
    y: groups.map(function () { return 0.985; }), what: groups.map(function (g) { return segWords(g.segs, true); })}});

  function renderer(p, src, Glyph, attrs, extra) {
    var r = new B.GlyphRenderer(Object.assign({data_source: src, glyph: new Glyph(attrs)}, extra || {}));
    p.add_renderers(r);
    return r;
  }
  function line(p, src, y, color, width, extra, dash) {
    return renderer(p, src, B.Line, {x: {field: "x"}, y: {field: y}, line_color: color, line_width: width,
                                     line_dash: dash || "solid"}, extra);
  }

  /* The labels of the segment starts in view, thinned to one per LABEL_GAP pixels (a kept label counts the starts
     it hides), recomputed on every zoom or pan: readable at any count (QA s7 F4: 999 labels at one x were a smudge). */
  function relabel(p, src, target) {
    var xr = p.x_range, lo = xr.start, span = xr.end - xr.start;
    var w = 0;
    try { w = p.inner_width; } catch (e) { w = 0; }  /* unset until the plot is laid out */
    if (!(w > 0)) w = Math.max(200, (target ? target.clientWidth : 800) - 150);
    var xs = [], texts = [], last = -Infinity, hidden = 0;
    function flush() { if (xs.length && hidden) texts[texts.length - 1] += " (+" + hidden + ")"; hidden = 0; }
    if (span > 0) {
      for (var i = 0; i < groups.length; i++) {
        var g = groups[i], px = (g.x - lo) / span * w;
        if (px < 0 || px > w) continue;
        if (px - last >= LABEL_GAP) { flush(); xs.push(g.x); texts.push(" " + segWords(g.segs, false)); last = px; }
        else hidden += g.segs.length;
      }
      flush();
    }
    src.data = {x: xs, text: texts};
  }

  function marks(p, pid, target) {
    if (groups.length) {
      renderer(p, startLines, B.Segment, {x0: {field: "x"}, y0: {value: 0}, x1: {field: "x"}, y1: {value: 1},
               line_color: SEG, line_dash: "dashed", line_width: 1, line_alpha: groups.length > 20 ? 0.45 : 0.9},
               {y_range_name: "edge", level: "underlay"});
      var hov = renderer(p, startHover, B.Scatter, {x: {field: "x"}, y: {field: "y"}, marker: "inverted_triangle",
                         size: 8, line_color: SEG, fill_color: SEG}, {y_range_name: "edge"});
      p.add_tools(new B.HoverTool({renderers: [hov], tooltips: [["starts", "@what"], ["at step", "@x{0,0}"]]}));
      var labels = new B.ColumnDataSource({data: {x: [], text: []}});
      p.add_layout(new B.LabelSet({x: {field: "x"}, y: {value: 0.93}, y_range_name: "edge", text: {field: "text"},
                                   source: labels, text_font_size: "8pt", text_color: SEG, text_baseline: "top",
                                   name: pid + "-segments"}));
      var again = function () { relabel(p, labels, target); };
      p.x_range.connect(p.x_range.properties.start.change, again);
      p.x_range.connect(p.x_range.properties.end.change, again);
      p.connect(p.properties.inner_width.change, again);
      again();
    }
    if (spec.onset !== null) {
      /* under the data (a one-step spike at the onset stays visible); the label left of the line near the right end */
      var xr = p.x_range, left = spec.onset > xr.start + 0.85 * (xr.end - xr.start);
      p.add_layout(new B.Span({location: spec.onset, dimension: "height", line_color: ONSET, line_width: 2,
                               level: "underlay"}));
      p.add_layout(new B.Label({x: spec.onset, y: 0.02, y_range_name: "edge", text_align: left ? "right" : "left",
                                text: (left ? "onset " : " onset ") + spec.onset.toLocaleString("en-US") + (left ? " " : ""),
                                text_font_size: "8pt", text_color: ONSET, text_font_style: "bold",
                                x_offset: left ? -2 : 2, name: pid + "-onset"}));
    }
    var cursor = new B.Span({location: 0, dimension: "height", line_color: "#f79009", line_width: 2, visible: false,
                             name: pid + "-cursor"});
    p.add_layout(cursor);
    return cursor;
  }

  function figure(c, attrs) {
    return B.Plotting.figure(Object.assign({height: c.height, sizing_mode: "stretch_width", x_range: x[c.x],
      tools: "xpan,xwheel_zoom,box_zoom,reset", active_drag: "box_zoom", toolbar_location: "right",
      min_border_left: 60, min_border_right: 60, name: c.id}, attrs));
  }
  function finish(p) {
    p.xaxis.axis_label = "step";
    p.xaxis.formatter = stepFormat;
    p.toolbar.logo = null;
  }

  function linePanel(c) {
    var s = out.sources[c.metric], src = s.line, ovSource = new B.ColumnDataSource({data: {x: [], y: []}});
    var ranges = {log: new B.Range1d({start: c.logRange[0], end: c.logRange[1]}), ov: new B.Range1d({start: 0, end: 1}),
                  edge: new B.Range1d({start: 0, end: 1})};
    var p = figure(c, {y_axis_location: null, extra_y_ranges: ranges, extra_y_scales: {log: new B.LogScale()}});
    /* superseded rows first (under the timeline): grey lines, one per segment, and dots (a one-row segment) */
    var sup = [], supLog = [];
    if (s.sup) {
      sup = [line(p, s.sup, "y", SUPERSEDED, 1, {visible: !c.isLog}),
             renderer(p, s.sup, B.Scatter, {x: {field: "x"}, y: {field: "y"}, size: 3, line_color: SUPERSEDED,
                      fill_color: SUPERSEDED}, {visible: !c.isLog})];
      supLog = [line(p, s.sup, "ylog", SUPERSEDED, 1, {visible: c.isLog, y_range_name: "log"}),
                renderer(p, s.sup, B.Scatter, {x: {field: "x"}, y: {field: "ylog"}, size: 3, line_color: SUPERSEDED,
                         fill_color: SUPERSEDED}, {visible: c.isLog, y_range_name: "log"})];
      p.add_tools(new B.HoverTool({renderers: [sup[1], supLog[1]], formatters: {"@y": "printf"},
                                   tooltips: [["step", "@x{0,0}"], ["superseded", "@y{%.6g}"], ["segment", "@seg{0}"]]}));
    }
    var lin = line(p, src, "y", c.color, 1.3, {visible: !c.isLog});
    var log = line(p, src, "ylog", c.color, 1.3, {visible: c.isLog, y_range_name: "log"});
    /* zero/negative values break the log line: its positive points also as dots (an isolated one has no segment) */
    var logDots = c.nonPositive ? renderer(p, src, B.Scatter, {x: {field: "x"}, y: {field: "ylog"}, size: 4,
      line_color: c.color, fill_color: c.color}, {visible: c.isLog, y_range_name: "log"}) : null;
    var smooth = line(p, src, "ys", "#101828", 1.6, {visible: false});
    var smoothLog = line(p, src, "ys", "#101828", 1.6, {visible: false, y_range_name: "log"});
    var ov = line(p, ovSource, "y", OVERLAY, 1.2, {visible: false, y_range_name: "ov"}, "dashed");
    var mk = renderer(p, s.marks, B.Scatter, {x: {field: "x"}, y: {field: "y"}, marker: {field: "marker"}, size: 9,
                                              line_color: ONSET, fill_color: ONSET, line_width: 2}, {y_range_name: "edge"});
    /* no finite value (all NaN/inf): a fixed 0..1 axis, so the axes and the markers' steps still show */
    p.y_range = c.finite === false ? new B.Range1d({start: 0, end: 1})
                                   : new B.DataRange1d({renderers: [lin].concat(sup.slice(0, 1)), range_padding: 0.05});
    var ylin = new B.LinearAxis({visible: !c.isLog, formatter: valueFormat});
    var ylog = new B.LogAxis({y_range_name: "log", visible: c.isLog});
    var yov = new B.LinearAxis({y_range_name: "ov", visible: false, axis_line_color: OVERLAY, formatter: valueFormat,
                                major_label_text_color: OVERLAY});
    p.add_layout(ylin, "left");
    p.add_layout(ylog, "left");
    p.add_layout(yov, "right");
    finish(p);
    p.add_tools(new B.HoverTool({renderers: [lin, log], mode: "vline", formatters: {"@y": "printf"},
                                 tooltips: [["step", "@x{0,0}"], ["value", "@y{%.6g}"]]}));
    p.add_tools(new B.HoverTool({renderers: [mk], tooltips: [["step", "@x{0,0}"], ["value", "@kind"]]}));
    p.add_tools(new B.HoverTool({renderers: [ov], mode: "vline", formatters: {"@y": "printf"},
                                 tooltips: [["step", "@x{0,0}"], ["overlay", "@y{%.6g}"]]}));
    p.grid.grid_line_color = "#eeeeee";
    p.outline_line_color = null;
    out.panels[c.id] = {metric: c.metric, plot: p, lin: lin, log: log, logDots: logDots, smooth: smooth, smoothLog: smoothLog, ov: ov,
                        marks: mk, ylin: ylin, ylog: ylog, yov: yov, ovRange: ranges.ov, isLog: c.isLog, sup: sup,
                        supLog: supLog, cursor: marks(p, c.id, document.getElementById(c.id + "-plot"))};
    return p;
  }

  function heatPanel(c) {
    var img = nd.ndarray(decode(c.image, c.f64 ? Float64Array : Float32Array).buffer,
                         {dtype: c.f64 ? "float64" : "float32", shape: [c.rows, c.cols]});  /* f64: beyond float32 */
    var Mapper = c.log ? B.LogColorMapper : B.LinearColorMapper;
    var mapper = new Mapper({palette: B.Palettes.Viridis256, low: c.low, high: c.high, nan_color: "#d92d20",
                             low_color: "#eeeeee"});
    var p = figure(c, {y_range: new B.Range1d({start: -0.5, end: c.rows - 0.5}),
                       extra_y_ranges: {edge: new B.Range1d({start: 0, end: 1})}});
    var r = renderer(p, new B.ColumnDataSource({data: {image: [img]}}), B.Image,
                     {image: {field: "image"}, x: c.x0, y: -0.5, dw: c.dw, dh: c.rows, color_mapper: mapper});
    p.add_tools(new B.HoverTool({renderers: [r], formatters: {"@image": "printf"},
                                 tooltips: [["step", "$x{0,0}"], ["layer", "$y{0}"], ["max", "@image{%.4g}"]]}));
    p.yaxis.axis_label = "layer index";
    p.yaxis.ticker = new B.FixedTicker({ticks: c.ticks});
    finish(p);
    p.grid.visible = false;
    out.panels[c.id] = {metric: c.metric, plot: p, heat: true, image: r,
                        cursor: marks(p, c.id, document.getElementById(c.id + "-plot"))};
    return p;
  }

  var targets = [];
  spec.panels.forEach(function (c) {
    var target = document.getElementById(c.id + "-plot");
    if (!target) return;
    out.doc.add_root(c.kind === "heat" ? heatPanel(c) : linePanel(c));
    targets.push(target);
  });
  B.embed.add_document_standalone(out.doc, document.body, targets).then(function () { out.ready = true; });
})();
