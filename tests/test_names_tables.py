"""Metric tables by rule: step columns ignoring punctuation, sniffed delimiters, ``#`` comments, row-number notes.

parsers.csv_metrics, parsers._table_header; and the reports that say when the steps are row numbers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forensics.api import analyze_run, load
from parsers._table_header import step_column


@pytest.mark.parametrize(("header", "col"), [
    (["Iteration #", "Train Loss (avg)"], "Iteration #"), (["Step #", "loss"], "Step #"),
    (["iter.", "loss"], "iter."), (["Global Step", "loss"], "Global Step"), (["Epoch #", "loss"], "Epoch #"),
    (["loss", "lr"], "(row index)"),
])
def test_step_columns_ignore_punctuation(header: list[str], col: str) -> None:
    """``Iteration #`` was not a step column: the row index became the step without a word."""
    assert step_column(header) == col


def _history(run: Path, header: str, sep: str = ",", banner: bool = False, comma_decimals: bool = False) -> None:
    """One row per 4 iterations; the loss rises linearly from iteration 1200."""
    run.mkdir(parents=True, exist_ok=True)
    lines = ["# exported by mytrainer 0.3"] if banner else []
    lines.append(sep.join(header.split(",")))
    for i in range(0, 2000, 4):
        loss = 2.5 / (1 + i / 200) + 0.2 + (0.01 * (i - 1200) if i >= 1200 else 0.0)
        cells = [str(i), f"{loss:.5f}", "0.001"]
        if comma_decimals:
            cells = [c.replace(".", ",") for c in cells]
        lines.append(sep.join(cells))
    (run / "history.csv").write_text("\n".join(lines) + "\n")


def test_an_iteration_hash_column_is_the_step(tmp_path: Path) -> None:
    """The onset is iteration 1200, not row 300."""
    _history(tmp_path, "Iteration #,Train Loss (avg),Learning Rate")
    run = load(tmp_path)
    assert run.meta["step_axis"]["column"] == "Iteration #" and "note" not in run.meta["step_axis"]
    assert run.meta["names"]["Train Loss (avg)"]["metric"] == "loss"
    analysis = analyze_run(run)
    assert analysis.verdict == "anomaly" and 1150 <= analysis.onset["step"] <= 1250


@pytest.mark.parametrize(("sep", "banner", "comma_decimals"), [
    (";", True, False), (";", False, False), (",", True, False), ("\t", False, False), ("|", True, False),
    (";", True, True),
])
def test_delimiters_and_comment_lines(tmp_path: Path, sep: str, banner: bool, comma_decimals: bool) -> None:
    """``;``, tab and ``|`` tables, a ``#`` banner line, decimal commas: all read, the onset right."""
    _history(tmp_path, "iteration,train_loss,lr", sep=sep, banner=banner, comma_decimals=comma_decimals)
    run = load(tmp_path)
    assert run.metrics.filter(run.metrics["metric"] == "loss").height == 500
    assert 1150 <= analyze_run(run).onset["step"] <= 1250


def test_row_number_steps_are_said_in_every_report(tmp_path: Path) -> None:
    """No step column: the text, Markdown, HTML and JSON reports say the steps are row numbers."""
    from reports.html_report import render_html
    from reports.json_report import render_json
    from reports.markdown_report import render_markdown
    from reports.text_report import render_text

    _history(tmp_path, "Wall,Loss,LR")
    run = load(tmp_path)
    analysis = analyze_run(run)
    outs = {"text": render_text(analysis, color=False, run=run), "md": render_markdown(analysis, run=run),
            "json": render_json(analysis), "html": render_html(analysis, run)}
    for fmt, out in outs.items():
        assert "steps are row numbers: no step column found" in out, fmt
    assert json.loads(outs["json"])["meta"]["step_axis"]["kind"] == "row_index"
