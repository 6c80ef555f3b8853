"""The HTML report in a real browser: headless Chromium (Debian's binary) driven by Playwright.

The first screen holds the plan; hovering a chart shows a value; clicking a finding scrolls to its chart
and sets the x range at its step; the log/smooth/overlay controls change the chart; no console error and
no network request (every request is routed: anything but ``file:`` and ``data:`` fails the test).
`.ci/run` installs chromium; without it (or without the playwright package) the tests skip with a reason.
"""

from __future__ import annotations

import io
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from forensics.api import analyze_run, load
from reports import ReportFormat, render

SAMPLES = Path(__file__).resolve().parents[1] / "sample_logs"
_CANDIDATES = ("/usr/bin/chromium", shutil.which("chromium") or "", shutil.which("chromium-browser") or "")
CHROMIUM = next((p for p in _CANDIDATES if p and os.access(p, os.X_OK)), None)
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
VIEWPORT = {"width": 1300, "height": 900}
RUNS = ("overflow", "lr_schedule_reset", "healthy")

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (.ci/run installs it)"),
    pytest.mark.skipif(not all((SAMPLES / r).is_dir() for r in RUNS), reason="sample runs missing"),
]
sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The HTML reports of three sample runs: an fp16 overflow, an lr schedule reset, a healthy run."""
    out = tmp_path_factory.mktemp("reports")
    paths = {}
    for name in RUNS:
        run = load(SAMPLES / name)
        paths[name] = out / f"{name}.html"
        paths[name].write_text(render(analyze_run(run), run, ReportFormat.html), encoding="utf-8")
    return paths


@pytest.fixture(scope="module")
def segmented(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The HTML report of a text log restarted 59 times from step 0 (60 segments of 40 steps: QA s7 a15)."""
    base = tmp_path_factory.mktemp("segmented")
    block = "".join(f"step {s} loss {3 - s * 1e-3:.6f} lr 0.001\n" for s in range(40))
    (base / "run").mkdir()
    (base / "run" / "train.log").write_text(block * 60, encoding="utf-8")
    run = load(base / "run")
    path = base / "report.html"
    path.write_text(render(analyze_run(run), run, ReportFormat.html), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for the module."""
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


class Page:
    """A report opened offline, with its console errors and attempted network requests recorded."""

    def __init__(self, browser: Any, path: Path, fragment: str = "") -> None:
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page = browser.new_page(viewport=VIEWPORT)
        self.page.set_default_timeout(120_000)  # a shared, loaded machine (load 30 on 2 cores) opens a page slowly
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

        def route(r: Any) -> None:
            url = r.request.url
            if url.startswith(("file:", "data:")):
                r.continue_()
            else:
                self.requests.append(url)
                r.abort()

        self.page.route("**/*", route)
        self.page.goto(path.as_uri() + fragment)
        # the function form: an expression string is eval'd when it must poll, which the page's CSP refuses
        self.page.wait_for_function("() => window.tfCharts && window.tfCharts.ready")
        if self.page.locator("figure.chart").count():
            self.page.locator("figure.chart canvas").first.wait_for()

    def x_range(self, which: str = "main") -> list[float]:
        """``[start, end]`` of the shared x range of the full-run (``main``) or onset (``zoom``) panels."""
        return self.page.evaluate("(which) => [tfCharts.x[which].start, tfCharts.x[which].end]", which)

    def panel(self, pid: str) -> dict[str, Any]:
        """Visibility of a panel's renderers and the overlay's point count."""
        return self.page.evaluate("""(pid) => {
            const p = tfCharts.panels[pid], ov = p.ov.data_source.data;
            return {lin: p.lin.visible, log: p.log.visible, smooth: p.smooth.visible || p.smoothLog.visible,
                    ov: p.ov.visible, ov_points: (ov instanceof Map ? ov.get('x') : ov.x).length}; }""", pid)

    def close(self) -> None:
        """Assert what every page must hold, then close it."""
        try:
            assert not self.errors, self.errors
            assert not self.requests, f"the report tried to fetch {self.requests}"
        finally:
            self.page.close()


@pytest.fixture
def open_report(browser: Any, reports: dict[str, Path]) -> Iterator[Any]:
    """Open a report by sample name; each page is checked for console errors and requests on teardown."""
    pages: list[Page] = []

    def opener(name: str) -> Page:
        pages.append(Page(browser, reports[name]))
        return pages[-1]

    yield opener
    for p in pages:
        p.close()


def _in_first_screen(page: Any, selector: str) -> bool:
    box = page.locator(selector).first.bounding_box()
    return box is not None and box["y"] >= 0 and box["y"] + box["height"] <= VIEWPORT["height"]


@pytest.mark.parametrize("name", ["overflow", "lr_schedule_reset"])
def test_first_screen_holds_the_plan(open_report: Any, name: str) -> None:
    """Without scrolling: the plain sentence, the checkpoint, the first trial's block and the proof."""
    p = open_report(name).page
    for sel in ("#headline", "#plan-resume", "#plan-trial pre", "#plan-proof li"):
        assert _in_first_screen(p, sel), sel
    head = p.locator("#headline").inner_text()
    assert "step" in head and "_" not in head  # plain words, no cause codes
    if name == "lr_schedule_reset":
        assert "from the beginning when the job resumed at step 301" in head
        assert "step 300" in p.locator("#plan-resume").inner_text()


def test_healthy_first_screen_says_nothing_to_do(open_report: Any) -> None:
    """A healthy run says so in the first screen, and that there is nothing to do."""
    p = open_report("healthy").page
    assert _in_first_screen(p, "#plan") and "Nothing to do" in p.locator("#plan").inner_text()
    assert "Nothing went wrong" in p.locator("#headline").inner_text()


@pytest.mark.parametrize("name", ["overflow", "healthy"])
def test_hovering_a_chart_shows_a_value(open_report: Any, name: str) -> None:
    """Moving the mouse over the loss chart opens Bokeh's tooltip with the step and the value."""
    p = open_report(name).page
    canvas = p.locator("#chart-loss canvas").first
    canvas.scroll_into_view_if_needed()
    box = canvas.bounding_box()
    for frac in (0.45, 0.5):
        p.mouse.move(box["x"] + box["width"] * frac, box["y"] + box["height"] * 0.5, steps=4)
    p.get_by_text("value:").first.wait_for(state="visible", timeout=5000)
    texts = p.evaluate("""() => Array.from(document.querySelectorAll('.bk-Tooltip'))
        .filter((t) => t.checkVisibility())
        .map((t) => (t.shadowRoot || t).textContent)""")
    text = next((t for t in texts if "value:" in t), "")
    assert "step:" in text and any(ch.isdigit() for ch in text.split("value:")[1]), texts


def test_clicking_a_finding_scrolls_to_its_chart_at_its_step(open_report: Any) -> None:
    """The LR01 row's step link scrolls to the lr chart and narrows the shared x range around step 301."""
    page = open_report("lr_schedule_reset")
    p = page.page
    full = page.x_range()
    link = p.locator("#evidence tr", has_text="LR01").locator("a.goto").first
    target = link.get_attribute("data-chart")
    assert target == "chart-lr"
    link.click()
    p.wait_for_timeout(300)
    assert _in_first_screen(p, f"#{target}")
    lo, hi = page.x_range()
    assert lo < 301 < hi and hi - lo < 0.5 * (full[1] - full[0])
    assert p.evaluate("location.hash") == "#chart-lr@301"


def test_log_smooth_and_overlay_controls(open_report: Any) -> None:
    """The toolbar above a chart switches to a log axis, shows the smoothed line and overlays another series."""
    page = open_report("overflow")
    p = page.page
    before = page.panel("chart-loss")
    assert before["lin"] and not before["log"] and not before["smooth"] and not before["ov"]
    p.locator('input[data-tf-log="chart-loss"]').check()
    p.locator('input[data-tf-smooth="chart-loss"]').check()
    p.locator('select[data-tf-overlay="chart-loss"]').select_option("grad_norm")
    after = page.panel("chart-loss")
    assert after["log"] and not after["lin"] and after["smooth"] and after["ov"] and after["ov_points"] > 100


def test_a_shared_link_opens_the_chart_at_the_step(browser: Any, reports: dict[str, Path]) -> None:
    """``report.html#chart-lr@301`` (what a finding link leaves in the address bar) reopens at that step."""
    page = Page(browser, reports["lr_schedule_reset"], fragment="#chart-lr@301")
    try:
        page.page.wait_for_function("() => tfCharts.x.main.end - tfCharts.x.main.start < 200")
        lo, hi = page.x_range()
        assert lo < 301 < hi
        assert _in_first_screen(page.page, "#chart-lr")
    finally:
        page.close()


def test_the_page_policy_refuses_any_connection(browser: Any, reports: dict[str, Path]) -> None:
    """The report's own Content-Security-Policy blocks a fetch before it leaves the page.

    BokehJS runs under it (no eval, no external resource): every other test sees no console error.
    """
    page = Page(browser, reports["overflow"])
    try:
        outcome = page.page.evaluate("() => fetch('http://example.com/x').then(() => 'fetched', () => 'blocked')")
        assert outcome == "blocked" and not page.requests
        assert any("Content Security Policy" in e for e in page.errors)
        page.errors.clear()  # the refusal itself is the one expected console error
    finally:
        page.close()


def _pixels(locator: Any) -> np.ndarray:
    """A screenshot of one element as an (h, w, 3) uint8 array."""
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(locator.screenshot())).convert("RGB")).astype(np.int16)


def _has_colour(img: np.ndarray, hex_colour: str, at_least: int = 20) -> bool:
    rgb = np.array([int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)], dtype=np.int16)
    return int((np.abs(img - rgb).sum(axis=2) < 40).sum()) >= at_least


@pytest.mark.parametrize("name", RUNS)
def test_every_chart_is_drawn(open_report: Any, name: str) -> None:
    """One BokehJS plot per chart figure, each drawn (a canvas with the series' line); the onset line on each.

    What the page draws from its embedded data, in the browser (the report builds no Bokeh model in Python):
    the expected plots, drawn pixels of each panel's own colour, the onset (red) on every panel of a run with
    an onset, the heat map's colours, no console error (checked when the page closes).
    """
    page = open_report(name)
    p = page.page
    figures = p.locator("figure.chart").evaluate_all("(fs) => fs.map((f) => f.id)")
    info = p.evaluate("""() => ({roots: tfCharts.doc.roots().map((r) => r.name), onset: JSON.parse(
        document.getElementById('tf-charts').textContent).onset})""")
    assert figures and sorted(info["roots"]) == sorted(figures)
    colours = {"loss": "#1f5fa8", "lr": "#2e7d32", "grad_norm": "#8e44ad"}
    for pid in figures:
        plot = p.locator(f"#{pid} .tf-plot")
        plot.scroll_into_view_if_needed()
        assert plot.locator("canvas").count() > 0, pid
        img = _pixels(plot)
        assert img.shape[0] > 100 and (img.sum(axis=2) < 600).mean() > 0.01, f"{pid}: nothing drawn"
        metric = pid.split("-", 1)[1]
        if pid.startswith("layers-"):
            assert _has_colour(img, "#440154", 5) or _has_colour(img, "#fde725", 5), f"{pid}: no heat map colours"
        elif metric in colours:
            assert _has_colour(img, colours[metric]), f"{pid}: no {metric} line"
        if info["onset"] is not None:
            assert _has_colour(img, "#c62828"), f"{pid}: no onset line"
    if name == "overflow":
        assert any(f.startswith("layers-") for f in figures)


def _labels(page: Any) -> list[dict[str, Any]]:
    """Per line panel: its segment-start labels (text, pixel x), plot width, and the starts in its x range."""
    return page.evaluate("""() => Object.entries(tfCharts.panels).map(([k, c]) => {
        const l = c.plot.center.find((a) => a.name === k + '-segments'), d = l.source.data;
        const get = (src, f) => Array.from(src instanceof Map ? src.get(f) : src[f]);
        const xr = c.plot.x_range, w = c.plot.inner_width, spec = JSON.parse(
            document.getElementById('tf-charts').textContent);
        return {id: k, text: get(d, 'text'), px: get(d, 'x').map((x) => (x - xr.start) / (xr.end - xr.start) * w),
                inView: spec.bounds.filter((b) => b[1] >= xr.start && b[1] <= xr.end).length,
                lines: c.plot.renderers.filter((r) => r.glyph && r.glyph.type === 'Segment').map(
                    (r) => r.data_source.get_length()),
                spans: c.plot.center.filter((a) => a.type === 'Span').length}; })""")


def _counted(text: str) -> int:
    """Starts one label stands for: ``seg 5`` 1, ``segs 1-59`` 59, ``seg 5 (+3)`` 4."""
    m = re.match(r"\s*(?:seg (\d+)|segs (\d+)\u2013(\d+)|(\d+) segs)(?: \(\+(\d+)\))?$", text)
    assert m, text
    one, a, z, n, more = m.groups()
    return (1 if one else int(z) - int(a) + 1 if a else int(n)) + int(more or 0)


def test_many_segment_starts_at_one_step_are_one_line_and_one_label(browser: Any, segmented: Path) -> None:
    """59 restarts at step 0: one dashed line, one label "segs 1-59" per panel, the list names them (QA s7 F4).

    (The label per start used to pile up into a black smudge at one x.)
    """
    page = Page(browser, segmented)
    try:
        got = _labels(page.page)
        assert got and all(c["lines"] == [1] and c["text"] == [" segs 1\u201359"] for c in got), got
        assert all(c["spans"] <= 2 for c in got), got  # the onset and the cursor only
        img = _pixels(page.page.locator("#chart-loss .tf-plot"))
        assert _has_colour(img, "#555555", 30), "segment starts not drawn"
        listed = page.page.locator("#segment-starts")
        assert "59 segment start(s)" in listed.inner_text()
        listed.locator("summary").click()
        assert "step 0: segments 1\u201359 (59 starts)" in listed.inner_text()
    finally:
        page.close()


@pytest.fixture(scope="module")
def shuffled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The HTML report of 200 JSONL rows with unique steps in shuffled order (QA s7 a10: ~100 'restarts')."""
    import json

    base = tmp_path_factory.mktemp("shuffled")
    order = np.random.default_rng(3).permutation(np.arange(1, 201))
    (base / "run").mkdir()
    (base / "run" / "metrics.jsonl").write_text("".join(
        json.dumps({"step": int(s), "loss": 4 - 2.5 * s / 200, "lr": 0.001, "grad_norm": 1 + (s % 7) / 10}) + "\n"
        for s in order), encoding="utf-8")
    run = load(base / "run")
    path = base / "report.html"
    path.write_text(render(analyze_run(run), run, ReportFormat.html), encoding="utf-8")
    return path


def test_segment_start_labels_are_thinned_by_pixel_distance_at_any_zoom(browser: Any, shuffled: Path) -> None:
    """~100 starts over 200 steps: labels 70 px apart or more, each counting the starts it hides; also after a zoom."""
    page = Page(browser, shuffled)
    try:
        for zoom in (None, (40, 80)):
            if zoom:
                page.page.evaluate("(z) => { tfCharts.x.main.start = z[0]; tfCharts.x.main.end = z[1]; }", zoom)
                page.page.wait_for_timeout(100)
            for c in _labels(page.page):
                if not c["id"].startswith("chart-"):
                    continue
                assert c["text"] and c["inView"] > 20, c
                gaps = np.diff(sorted(c["px"]))
                assert (gaps >= 70 - 1e-6).all(), c
                assert sum(_counted(t) for t in c["text"]) == c["inView"], c
    finally:
        page.close()


def _restarted(tmp_path: Path) -> Path:
    """A run restarted from step 0: segment 0 (steps 0..99) diverges, segment 1 (steps 0..149) trains fine."""
    import json

    rows = [{"step": s, "loss": 3 - s / 100 + (s / 20) ** 2 * 0.1, "lr": 0.001} for s in range(100)]
    rows += [{"step": s, "loss": 3 - s / 100, "lr": 0.001} for s in range(150)]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return tmp_path / "run"


def test_superseded_rows_are_drawn_and_counted(browser: Any, tmp_path: Path) -> None:
    """The first attempt of a restarted run is drawn grey and the caption counts it (QA s7 F3: silently dropped)."""
    run = load(_restarted(tmp_path))
    path = tmp_path / "report.html"
    path.write_text(render(analyze_run(run), run, ReportFormat.html), encoding="utf-8")
    page = Page(browser, path)
    try:
        p = page.page
        caption = p.locator("#chart-loss figcaption").inner_text()
        assert "250 rows logged, 100 of them superseded by later segments" in caption, caption
        got = p.evaluate("""() => { const s = tfCharts.sources.loss, get = (src, f) => Array.from(
                src.data instanceof Map ? src.data.get(f) : src.data[f]);
            const p = tfCharts.panels['chart-loss'];
            return {line: get(s.line, 'y').filter(Number.isFinite).length, sup: get(s.sup, 'y'),
                    seg: get(s.sup, 'seg'), visible: p.sup.map((r) => r.visible), top: p.plot.y_range.end}; }""")
        assert got["line"] + sum(np.isfinite(got["sup"])) == 250  # every logged row drawn
        assert set(v for v in got["seg"] if v is not None and np.isfinite(v)) == {0}
        assert all(got["visible"]) and got["top"] >= max(v for v in got["sup"] if v is not None)
        img = _pixels(p.locator("#chart-loss .tf-plot"))
        assert _has_colour(img, "#98a2b3", 50), "superseded rows not drawn"
        p.locator('input[data-tf-log="chart-loss"]').check()
        vis = p.evaluate("() => [tfCharts.panels['chart-loss'].sup.map((r) => r.visible), "
                         "tfCharts.panels['chart-loss'].supLog.map((r) => r.visible)]")
        assert vis == [[False, False], [True, True]], vis
    finally:
        page.close()


def test_a_shuffled_log_draws_every_row(browser: Any, shuffled: Path) -> None:
    """Unique steps in shuffled order: the 4-point timeline plus 196 grey rows, and the caption says so."""
    page = Page(browser, shuffled)
    try:
        caption = page.page.locator("#chart-loss figcaption").inner_text()
        m = re.search(r"(\d+) points; 200 rows logged, (\d+) of them superseded", caption)
        assert m and int(m[1]) + int(m[2]) == 200, caption
        n = page.page.evaluate("""() => { const d = tfCharts.sources.loss.sup.data;
            return Array.from(d instanceof Map ? d.get('y') : d.y).filter(Number.isFinite).length; }""")
        assert n == int(m[2])
    finally:
        page.close()


def test_a_page_without_charts_still_says_ready(browser: Any, tmp_path: Path) -> None:
    """A run whose series are all constant draws no chart, yet ``window.tfCharts`` exists, ready, with no panels.

    (QA s7 F14: scripts and tests waiting for ``tfCharts.ready`` never finished on such pages; F13: the wait is
    the function form, which polls under the page's CSP.)
    """
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text(
        "".join(f'{{"step": {s}, "loss": 2.5, "lr": 0.001}}\n' for s in range(200)), encoding="utf-8")
    run = load(tmp_path / "run")
    path = tmp_path / "report.html"
    path.write_text(render(analyze_run(run), run, ReportFormat.html), encoding="utf-8")
    page = Page(browser, path)
    try:
        got = page.page.evaluate("() => [window.tfCharts.ready, Object.keys(window.tfCharts.panels).length]")
        assert got == [True, 0]
        assert "loss: constant 2.5" in page.page.locator("#charts").inner_text()
    finally:
        page.close()


@pytest.mark.parametrize("bad", ["NaN", "Infinity"])
def test_a_series_without_finite_values_keeps_its_axes(browser: Any, tmp_path: Path, bad: str) -> None:
    """Loss all NaN (or grad_norm all +inf): the panel gets a 0..1 y axis, its x axis and its markers (QA s7 F9)."""
    metric = "loss" if bad == "NaN" else "grad_norm"
    (tmp_path / "run").mkdir()
    rows = "".join(f'{{"step": {s}, "loss": {bad if metric == "loss" else 3 - s / 100}, "lr": 0.001, '
                   f'"grad_norm": {bad if metric == "grad_norm" else 1 + s % 5}}}\n' for s in range(1, 201))
    (tmp_path / "run" / "metrics.jsonl").write_text(rows, encoding="utf-8")
    run = load(tmp_path / "run")
    path = tmp_path / "report.html"
    path.write_text(render(analyze_run(run), run, ReportFormat.html), encoding="utf-8")
    page = Page(browser, path)
    try:
        got = page.page.evaluate("""(pid) => { const p = tfCharts.panels[pid].plot;
            return [p.y_range.start, p.y_range.end, p.x_range.start, p.x_range.end,
                    tfCharts.panels[pid].marks.data_source.get_length()]; }""", f"chart-{metric}")
        assert got[:2] == [0, 1] and got[2] < 1 and got[3] > 200 and got[4] > 0, got
        assert "no finite values" in page.page.locator(f"#chart-{metric}").inner_text()
    finally:
        page.close()


def _page_of(browser: Any, tmp_path: Path, rows: str) -> Page:
    """The HTML report of a ``metrics.jsonl`` with these rows, opened offline."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text(rows, encoding="utf-8")
    run = load(tmp_path / "run")
    path = tmp_path / "report.html"
    path.write_text(render(analyze_run(run), run, ReportFormat.html), encoding="utf-8")
    return Page(browser, path)


def test_log_y_is_disabled_without_positive_values(browser: Any, tmp_path: Path) -> None:
    """All-negative loss: the log toggle is disabled and says why (QA s7 F8: it drew an empty chart)."""
    page = _page_of(browser, tmp_path, "".join(f'{{"step": {s}, "loss": {-1 - s / 50}, "lr": 0.001}}\n'
                                               for s in range(1, 201)))
    try:
        box = page.page.locator('input[data-tf-log="chart-loss"]')
        assert box.is_disabled()
        assert "no positive values" in box.locator("xpath=..").get_attribute("title")
    finally:
        page.close()


def test_log_y_of_a_mixed_sign_series_draws_its_positive_points(browser: Any, tmp_path: Path) -> None:
    """A series alternating in sign: the log toggle says what it leaves out and draws the positive points as dots."""
    rows = "".join(f'{{"step": {s}, "loss": {3 - s / 100}, "loss_scale": {(-1) ** s * (1 + s)}}}\n'
                   for s in range(1, 201))
    page = _page_of(browser, tmp_path, rows)
    try:
        p = page.page
        label = p.locator('input[data-tf-log="chart-loss_scale"]').locator("xpath=..")
        assert "100 non-positive values not shown" in label.get_attribute("title")
        p.locator('input[data-tf-log="chart-loss_scale"]').check()
        dots = p.evaluate("""() => { const d = tfCharts.panels['chart-loss_scale'].logDots;
            return d ? [d.visible, d.data_source.get_length()] : null; }""")
        assert dots is not None and dots[0] and dots[1] > 100, dots
    finally:
        page.close()


@pytest.mark.parametrize("step", ["3150000000", "-5000"])
def test_a_shared_link_beyond_the_run_is_clamped_to_it(browser: Any, reports: dict[str, Path], step: str) -> None:
    """``#chart-loss@3150000000`` on a 500-step run opens at its last step, ``@-5000`` at its first (QA s7 F12)."""
    page = Page(browser, reports["lr_schedule_reset"], fragment=f"#chart-loss@{step}")
    try:
        page.page.wait_for_function("() => Object.values(tfCharts.panels).some((p) => p.cursor && p.cursor.visible)")
        col = load(SAMPLES / "lr_schedule_reset").metrics.get_column("step")
        first, last = int(col.min()), int(col.max())
        lo, hi = page.x_range()
        assert lo < (first if step.startswith("-") else last) < hi and hi - lo < last - first, (lo, hi, first, last)
    finally:
        page.close()


def test_an_onset_at_the_last_step_stays_visible(browser: Any, tmp_path: Path) -> None:
    """Onset at the last step: the onset window reaches past it and its label sits left of the line (QA s7 F10)."""
    rows = "".join(f'{{"step": {s}, "loss": {"NaN" if s == 400 else 3 - s / 300}, "lr": 0.001, '
                   f'"grad_norm": {"Infinity" if s == 400 else 1 + (s % 7) / 10}}}\n' for s in range(1, 401))
    page = _page_of(browser, tmp_path, rows)
    try:
        got = page.page.evaluate("""() => {
            const spec = JSON.parse(document.getElementById('tf-charts').textContent);
            const zoom = Object.keys(tfCharts.panels).filter((k) => k.startsWith('zoom-'));
            const label = tfCharts.panels[zoom[0]].plot.center.find((a) => a.name === zoom[0] + '-onset');
            return [spec.onset, tfCharts.x.zoom.end, tfCharts.x.main.end, label.text_align, label.x_offset]; }""")
        onset, zoom_end, main_end, align, offset = got
        assert onset == 400 and zoom_end > onset and main_end > onset and align == "right" and offset < 0, got
        img = _pixels(page.page.locator("figure.chart[id^='zoom-'] .tf-plot").first)
        assert _has_colour(img, "#c62828"), "no onset line"
    finally:
        page.close()


LONG = "x" * 600
"""A 600-character metric name (QA s7 F11)."""


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The HTML report of a run with a bidi-control name, a zero-width one, a 600-character one, long layer names."""
    base = tmp_path_factory.mktemp("hostile")
    names = ["\u202eevil", "zero\u200bwidth", LONG]
    rows = []
    for i in range(200):
        r: dict[str, Any] = {"step": i + 1, "loss": 3 - i / 100 + (20 if i > 150 else 0), "lr": 0.001}
        r.update({nm: float(i * (k + 1)) for k, nm in enumerate(names)})
        r.update({f"attn_logit_max/layer{k}_{LONG}": 1.0 + k + 0.01 * i for k in range(3)})
        rows.append(r)
    import json

    (base / "run").mkdir()
    (base / "run" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    run = load(base / "run")
    path = base / "report.html"
    path.write_text(render(analyze_run(run), run, ReportFormat.html), encoding="utf-8")
    return path


@pytest.mark.parametrize("name", ["\u202eevil", "zero\u200bwidth"])
def test_an_overlay_whose_name_has_a_bidi_or_invisible_character_is_drawn(
        browser: Any, hostile: Path, name: str) -> None:
    """Choosing such an overlay draws it (QA s7 F6: the option's value was the made-safe text, no series had it)."""
    page = Page(browser, hostile)
    try:
        p = page.page
        sel = p.locator('select[data-tf-overlay="chart-loss"]')
        value = sel.locator("option").evaluate_all(
            "(os, name) => { const o = os.find((o) => tfCharts.overlay[+o.value] === name);"
            " return o ? o.value : null; }",
            name)
        assert value is not None, "the series is not offered"
        label = sel.locator(f'option[value="{value}"]').inner_text()
        assert "<U+" in label  # the visible text stays safe
        sel.select_option(value)
        got = page.panel("chart-loss")
        assert got["ov"] and got["ov_points"] == 200, got
    finally:
        page.close()


@pytest.mark.parametrize("width", [500, 1300, 2400])
def test_a_long_metric_name_keeps_the_page_at_the_viewport_width(browser: Any, hostile: Path, width: int) -> None:
    """A 600-character name wraps or is cut with an ellipsis (QA s7 F11: the page was 4,500-5,100 px wide)."""
    page = Page(browser, hostile)
    try:
        p = page.page
        p.set_viewport_size({"width": width, "height": 900})
        p.wait_for_timeout(200)
        got = p.evaluate("() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        assert got[0] <= got[1], got
        boxes = p.locator("figure.chart select, figure.chart figcaption").evaluate_all(
            "(els) => els.map((e) => e.getBoundingClientRect().right)")
        assert boxes and max(boxes) <= width, boxes
    finally:
        page.close()
