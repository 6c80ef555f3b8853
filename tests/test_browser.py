"""The HTML report in a real browser: headless Chromium (Debian's binary) driven by Playwright.

The first screen holds the plan; hovering a chart shows a value; clicking a finding scrolls to its chart
and sets the x range at its step; the log/smooth/overlay controls change the chart; no console error and
no network request (every request is routed: anything but ``file:`` and ``data:`` fails the test).
`.ci/run` installs chromium; without it (or without the playwright package) the tests skip with a reason.
"""

from __future__ import annotations

import io
import os
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
    """The HTML report of a text log restarted 59 times (60 segments: past the one-glyph threshold, 50)."""
    from reports.figures import MARK_MODELS

    base = tmp_path_factory.mktemp("segmented")
    block = "".join(f"step {s} loss {3 - s * 1e-3:.6f} lr 0.001\n" for s in range(40))
    (base / "run").mkdir()
    (base / "run" / "train.log").write_text(block * (MARK_MODELS + 10), encoding="utf-8")
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


def test_many_segment_starts_share_one_glyph(browser: Any, segmented: Path) -> None:
    """Past 50 segment starts every panel draws them with one segment glyph and one label set, all shown."""
    page = Page(browser, segmented)
    try:
        p = page.page
        counts = p.evaluate("""() => Object.values(tfCharts.panels).map((c) => ({
            segments: c.plot.renderers.filter((r) => r.glyph && r.glyph.type === 'Segment').map(
                (r) => r.data_source.get_length()),
            spans: c.plot.center.filter((a) => a.type === 'Span').length,
            labels: c.plot.center.filter((a) => a.type === 'LabelSet').length}))""")
        assert counts and all(c["segments"] == [59] and c["labels"] == 1 for c in counts), counts
        assert all(c["spans"] <= 2 for c in counts), counts  # the onset and the cursor only
        img = _pixels(p.locator("#chart-loss .tf-plot"))
        assert _has_colour(img, "#555555", 200), "segment starts not drawn"
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
