"""The HTML report in a real browser (headless Chromium): loads offline, no console errors.

`.ci/run` installs Debian's chromium; elsewhere the test skips with a reason.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from forensics.api import analyze_run, load
from reports import ReportFormat, render

SAMPLES = Path(__file__).resolve().parents[1] / "sample_logs"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (.ci/run installs it)")
@pytest.mark.skipif(not (SAMPLES / "update_scale_growth").is_dir(), reason="sample runs missing")
def test_report_renders_in_chromium(tmp_path: Path) -> None:
    """The report of a sample run loads from file://, with the verdict, onset, charts and recovery."""
    run = load(SAMPLES / "update_scale_growth")
    html = tmp_path / "report.html"
    html.write_text(render(analyze_run(run), run, ReportFormat.html), encoding="utf-8")
    common = [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*common, "--enable-logging=stderr", "--v=0", "--dump-dom", html.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    for element_id in ('id="verdict"', 'id="onset"', 'id="charts"', 'id="recovery"', 'id="evidence"'):
        assert element_id in dom.stdout
    assert dom.stdout.count("<svg") >= 3
    console_errors = [ln for ln in dom.stderr.splitlines() if "CONSOLE" in ln and ("Error" in ln or "error" in ln)]
    assert not console_errors, console_errors
    assert "net::ERR" not in dom.stderr, "the report tried to fetch something over the network"
    shot = tmp_path / "report.png"
    subprocess.run([*common, "--window-size=1300,2400", f"--screenshot={shot}", html.as_uri()],
                   capture_output=True, timeout=120, check=True)
    assert shot.stat().st_size > 20_000
