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
    assert f"{conf:.2f} calibrated; the hypotheses' raw scores" in conf_line
    assert f"{raw:.2f} (chosen)" in conf_line
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


def _overfit(tmp_path: Path, rise: bool) -> Path:
    """A stable run, train loss 2.05 -> 0.05; its eval loss (every 100 steps) bottoms near 600, then rises."""
    rows = []
    for s in range(2000):
        r = {"step": s, "loss": 2.05 - 2.0 * s / 1999 + 0.01 * ((s * 7919) % 13) / 13, "lr": 1e-3}
        if s % 100 == 0:
            r["eval_loss"] = 0.95 + (abs(s - 600) / 1400 if rise else max(0.0, (600 - s) / 600))
        rows.append(r)
    run = tmp_path / ("overfit" if rise else "flat")
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return run


def test_a_healthy_overfitting_run_is_not_called_every_series_normal(tmp_path: Path) -> None:
    """HEALTHY is kept, but no format says every series was normal while the eval loss rose (user test F30)."""
    run = load(_overfit(tmp_path, rise=True))
    analysis = analyze_run(run)
    assert analysis.verdict == "healthy"
    for fmt in (ReportFormat.text, ReportFormat.markdown, ReportFormat.html):
        out = render(analysis, run, fmt)
        assert "every logged series" not in out
        assert re.search(r"eval_loss rose x1\.\d from its minimum 0\.95 at step 600", out.replace("\\_", "_")), fmt
        assert "overfitting" in out and "best checkpoint is near step 600" in out, fmt


def test_a_healthy_run_says_its_findings_are_not_faults(tmp_path: Path) -> None:
    """A healthy run that lists findings (here: restarts) says the engine did not count them as a fault (F30)."""
    (tmp_path / "run").mkdir()
    block = "".join(f"step {s} loss {3 - s * 1e-3:.6f} lr 0.001\n" for s in range(40))
    (tmp_path / "run" / "train.log").write_text(block * 4, encoding="utf-8")
    run = load(tmp_path / "run")
    analysis = analyze_run(run)
    assert analysis.verdict == "healthy" and analysis.findings
    for fmt in (ReportFormat.text, ReportFormat.markdown, ReportFormat.html):
        assert "the engine counted none of these findings as a fault" in render(analysis, run, fmt), fmt


def test_a_healthy_run_with_a_falling_eval_loss_says_nothing_went_wrong(tmp_path: Path) -> None:
    """No rise, no remark: the sentence is limited to what the checks judged."""
    run = load(_overfit(tmp_path, rise=False))
    text = render(analyze_run(run), run, ReportFormat.text)
    assert "Nothing went wrong in training: the checks that ran found no fault over steps 0 to 1999" in text
    assert "eval_loss rose" not in text


def test_the_megatron_block_quotes_the_checkpoint_path() -> None:
    """``--load`` of the paste-ready command line is shell-quoted (a space, a quote, a ``<``; user test F42)."""
    import shlex

    from reports._plain import launch_blocks

    ckpt = "runs/sp ace/it's <x>/iter_0000300"
    block = next(b for b in launch_blocks({"megatron_flags": ["--lr 1.5e-4"]},
                                          {"checkpoint": f"{ckpt} (step 300)", "step": 300}) if b.lang == "bash")
    line = next(ln for ln in block.text.splitlines() if ln.lstrip().startswith("--load"))
    assert shlex.split(line.rstrip(" \\"))[1] == ckpt


def test_the_inconclusive_hint_is_in_every_format(tmp_path: Path) -> None:
    """No loss logged: the mapping hint (``--metric loss=...``) is in text, Markdown and HTML, not only JSON (F35)."""
    run_dir = tmp_path / "no_loss"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"it": s, "acc": s / 300, "lr": 1e-3}) + "\n"
                                                   for s in range(300)), encoding="utf-8")
    run = load(run_dir)
    analysis = analyze_run(run)
    assert analysis.verdict == "inconclusive"
    for fmt in (ReportFormat.text, ReportFormat.markdown, ReportFormat.html, ReportFormat.json):
        out = render(analysis, run, fmt).replace("\\_", "_")
        assert "--metric loss=acc" in out, fmt


def test_the_charts_say_which_series_have_no_panel(tmp_path: Path) -> None:
    """45 extra series: the charts section names those without a panel and how many can be overlaid (QA s7 F3)."""
    run_dir = tmp_path / "wide"
    run_dir.mkdir()
    rows = [{"step": s, "loss": 3 - s / 100, "lr": 1e-3, **{f"m{k:02d}": k + s / 10 for k in range(45)}}
            for s in range(200)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    run = load(run_dir)
    html = render(analyze_run(run), run, ReportFormat.html)
    m = re.search(r'<p class="muted" id="not-charted">(\d+) other series have no panel of their own: m00, m01, .*?'
                  r'(\d+) of them can be overlaid', html)
    assert m and int(m[1]) == 45 and 30 <= int(m[2]) < 45, m
