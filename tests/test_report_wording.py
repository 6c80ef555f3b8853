"""What the reports say in words, the same in every format.

Which confidence is calibrated and which is raw (user test s6 F34), a healthy run's sentence limited to what was
judged (F30), paste-ready commands quoted (F42).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from forensics.api import analyze_run, load
from reports import ReportFormat, render

SAMPLES = Path(__file__).resolve().parents[1] / "sample_logs"


@pytest.fixture(scope="module")
def overflow() -> tuple[object, object]:
    """The fp16 overflow sample: analysis and run."""
    if not (SAMPLES / "overflow").is_dir():
        pytest.skip("sample_logs/overflow missing")
    run = load(SAMPLES / "overflow")
    return analyze_run(run), run


def test_every_format_says_which_confidence_is_calibrated_and_which_is_raw(overflow: tuple[object, object]) -> None:
    """The run's confidence is labelled calibrated; the hypotheses' numbers raw scores, the chosen one marked."""
    analysis, run = overflow
    data = json.loads(render(analysis, run, ReportFormat.json))
    hyps, conf = data["hypotheses"], data["confidence"]
    raw = hyps[0]["confidence"]
    assert data["meta"]["confidence_kinds"]["chosen_raw"] == raw
    assert "calibrated" in data["meta"]["confidence_kinds"]["confidence"]
    assert "raw" in data["meta"]["confidence_kinds"]["hypotheses"]
    text = render(analysis, run, ReportFormat.text)
    conf_line = next(ln for ln in text.splitlines() if ln.startswith("confidence:"))
    hyp_line = next(ln for ln in text.splitlines() if ln.startswith("hypotheses:"))
    assert f"{conf:.2f} (calibrated" in conf_line
    assert f"{raw:.2f} (chosen)" in hyp_line and "raw scores" in hyp_line
    md = render(analysis, run, ReportFormat.markdown)
    assert f"confidence {conf:.2f} (calibrated)" in md
    assert f"calibrated from the chosen cause's raw score {raw:.2f}" in md
    if len(hyps) > 1:
        assert f"raw score {hyps[1]['confidence']:.2f}" in md and "Other hypotheses (raw scores" in md
    html = render(analysis, run, ReportFormat.html)
    assert re.search(r'id="confidence"[^>]*><span>confidence \(calibrated\)</span>', html)
    assert re.search(rf"id=\"hyp-scores\">The numbers here are the engine's raw scores.*?raw score {raw:.2f}",
                     html, re.S)
    assert html.count('<span class="muted">raw score</span>') == len(hyps)
