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
        self.page.wait_for_function("window.tfCharts && tfCharts.ready")
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
        assert "warm-up when the job resumed at step 301" in head
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
