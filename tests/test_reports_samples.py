"""Every committed sample run renders as HTML, Markdown, JSON and text; the JSON validates."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from forensics.api import analyze_run, load
from reports import ReportFormat, render
from reports.json_report import load_schema

jsonschema = pytest.importorskip("jsonschema")

SAMPLES = Path(__file__).resolve().parents[1] / "sample_logs"
RUNS = sorted(p.parent for p in SAMPLES.glob("*/expected.json"))


@pytest.mark.parametrize("run_dir", RUNS, ids=[r.name for r in RUNS])
def test_sample_reports(run_dir: Path) -> None:
    """HTML is self-contained with its sections, Markdown is ticket-sized, JSON follows the schema."""
    run = load(run_dir)
    analysis = analyze_run(run)
    doc = json.loads(render(analysis, run, ReportFormat.json))
    jsonschema.validate(doc, load_schema())
    assert doc["verdict"] == analysis.verdict
    html = render(analysis, run, ReportFormat.html)
    for element_id in ("verdict", "onset", "charts", "evidence", "recovery", "sources", "skipped"):
        assert f'id="{element_id}"' in html
    assert 'class="tf-plot"' in html and 'id="tf-charts"' in html  # chart panels and their data
    assert not re.search(r'(src|href)\s*=\s*["\']https?://', html), "external resource in the report"
    assert len(html.encode()) < 3_000_000
    md = render(analysis, run, ReportFormat.markdown, html_path="report.html")
    assert len(md.splitlines()) < 60
    if analysis.verdict != "healthy":
        assert analysis.recovery is not None and analysis.recovery.trials
        assert "## What to do" in md and "**Resume from**" in md
    assert render(analysis, run, ReportFormat.text).strip()
