"""Step-axis and segment families from the user test (F36, F37, F26, F23, F22): rows that are one run, not restarts."""

from __future__ import annotations

import json
import math
from pathlib import Path

from forensics import api
from forensics.model import Verdict
from parsers.discover import load_run


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _healthy_epochs(key: str, epochs: int = 4, per: int = 60, every: int = 1) -> list[dict]:
    rows, total = [], epochs * per
    for e in range(epochs):
        for i in range(0, per, every):
            g = e * per + i
            rows.append({"epoch": e, key: i, "loss": 2.5 * math.exp(-g / 150) + 0.3 + 0.01 * math.sin(g),
                         "lr": 1e-3 * 0.5 * (1 + math.cos(math.pi * g / total))})
    return rows


def _loss(run) -> list[tuple[int, int]]:
    df = run.metrics.filter(run.metrics["metric"] == "loss").sort("step")
    return list(zip(df["segment"].to_list(), df["step"].to_list(), strict=True))


# -- F36: a step counter that restarts every epoch ----------------------------------------------------


def test_step_restarting_each_epoch_is_one_segment_with_a_global_step(tmp_path):
    """F36: `{epoch, step=i}` logged every 5 batches: one segment, step = epoch x 60 + i."""
    _write_jsonl(tmp_path / "metrics.jsonl", _healthy_epochs("step", every=5))
    run = load_run(tmp_path)
    rows = _loss(run)
    assert {s for s, _ in rows} == {0}
    assert [st for _, st in rows] == list(range(0, 240, 5))  # epoch x 60 + i (sparse logging keeps its scale)
    assert run.meta["by_source"]["metrics.jsonl"]["epoch_steps"]["steps_per_epoch"] == 60


def test_batch_idx_with_epoch_as_the_step_is_not_hundreds_of_segments(tmp_path):
    """F36: no step key, `batch_idx` beside `epoch`: equal epochs on consecutive rows are no segments."""
    _write_jsonl(tmp_path / "metrics.jsonl", _healthy_epochs("batch_idx"))
    run = load_run(tmp_path)
    rows = _loss(run)
    assert {s for s, _ in rows} == {0}
    assert [st for _, st in rows] == list(range(240))


def test_epoch_restarting_step_on_a_healthy_run_is_not_an_lr_reset(tmp_path):
    """F36: the healthy per-epoch-step run was ANOMALY 0.98 lr_schedule_reset."""
    _write_jsonl(tmp_path / "run" / "metrics.jsonl", _healthy_epochs("step", epochs=5, per=200))
    report = api.analyze(tmp_path / "run")
    assert report.cause != "lr_schedule_reset"
    assert report.verdict == Verdict.HEALTHY


def test_a_real_resume_that_repeats_an_epoch_stays_a_segment(tmp_path):
    """A resume that goes back to an earlier epoch's start is still a restart."""
    rows = _healthy_epochs("step", epochs=3, per=40)
    rows += [dict(r) for r in rows if r["epoch"] == 1]  # crashed in epoch 2, resumed from epoch 1's start
    _write_jsonl(tmp_path / "metrics.jsonl", rows)
    segs = {s for s, _ in _loss(load_run(tmp_path))}
    assert segs == {0, 1}


def test_csv_step_restarting_each_epoch(tmp_path):
    """The same family in a CSV table (the rule runs on every reader's table)."""
    rows = _healthy_epochs("step", epochs=3, per=30)
    text = "epoch,step,loss,lr\n" + "".join(f"{r['epoch']},{r['step']},{r['loss']},{r['lr']}\n" for r in rows)
    (tmp_path / "metrics.csv").write_text(text)
    rows = _loss(load_run(tmp_path))
    assert {s for s, _ in rows} == {0}
    assert [st for _, st in rows] == list(range(90))
