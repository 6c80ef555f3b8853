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


# -- F37: a split column --------------------------------------------------------------------------


def test_split_column_val_rows_are_eval_loss_and_no_restart(tmp_path):
    """F37: `{"split": "val", "step": s, "loss": ...}` beside train rows at the same step (both engines)."""
    from parsers import jsonl

    rows = []
    for s in range(200):
        rows.append({"split": "train", "step": s, "loss": 2.0 - s / 200})
        if s % 50 == 0:
            rows.append({"split": "val", "step": s, "loss": 2.5 - s / 200})
            rows.append({"mode": "test", "step": s, "acc": 0.5})
    path = _write_jsonl(tmp_path / "metrics.jsonl", rows)
    for engine in jsonl.ENGINES:
        t = jsonl.read(path, tmp_path, engine=engine).metrics
        assert set(t.column("segment").to_pylist()) == {0}
        by_metric = {}
        for m, tag in zip(t.column("metric").to_pylist(), t.column("tag").to_pylist(), strict=True):
            by_metric.setdefault(m, set()).add(tag)
        assert by_metric["loss"] == {"loss"} and by_metric["eval_loss"] == {"val/loss"}
        assert "test/acc" in {tag for tags in by_metric.values() for tag in tags}
    run = load_run(tmp_path)
    assert run.metrics.filter(run.metrics["metric"] == "loss").height == 200


def test_csv_split_column_val_rows_are_eval_loss(tmp_path):
    """F37 in a CSV table: a `split` column's val rows are eval_loss, not training loss."""
    lines = ["step,split,loss"]
    for s in range(100):
        lines += [f"{s},train,{2 - s / 100}"] + ([f"{s},val,{2.5 - s / 100}"] if s % 20 == 0 else [])
    text = "\n".join(lines) + "\n"
    (tmp_path / "metrics.csv").write_text(text)
    run = load_run(tmp_path)
    assert run.metrics.filter(run.metrics["metric"] == "loss").height == 100
    assert run.metrics.filter(run.metrics["metric"] == "eval_loss").height == 5


def test_other_stage_values_change_nothing(tmp_path):
    """A `stage` that names a training phase (`sft`) is no split: the keys stay as logged."""
    path = _write_jsonl(tmp_path / "m.jsonl", [{"stage": "sft", "step": s, "loss": 1.0} for s in range(5)])
    from parsers import jsonl

    assert set(jsonl.read(path, tmp_path).metrics.column("tag").to_pylist()) == {"loss"}


# -- F26: per-rank files -----------------------------------------------------------------------------


def _rank_rows(rank: int, bad: bool) -> list[dict]:
    rows = []
    for s in range(300):
        drift = 1.0 + (max(0, s - 200) / 10 if bad else 0.0)
        rows.append({"step": s, "rank": rank, "loss": (2.0 * math.exp(-s / 80) + 0.3) * drift,
                     "grad_norm": 0.5 * drift, "lr": 1e-3})
    return rows


def test_per_rank_files_are_ranks_not_restarts(tmp_path):
    """F26: `metrics_rank{0..3}.jsonl` over the same steps: one segment, a `ranks` attribute, the bad rank named."""
    for r in range(4):
        _write_jsonl(tmp_path / f"metrics_rank{r}.jsonl", _rank_rows(r, bad=r == 2))
    run = load_run(tmp_path)
    assert set(run.metrics["segment"].to_list()) == {0}
    loss = run.metrics.filter(run.metrics["metric"] == "loss")
    assert loss.height == 300 and loss["step"].n_unique() == 300  # one value per step
    assert "rank" not in set(run.metrics["metric"].to_list())
    assert run.meta["by_source"]["metrics_rank1.jsonl"]["ranks"]["rank"] == 1
    assert run.meta["by_source"]["metrics_rank2.jsonl"]["ranks"]["departs"].startswith("loss")
    assert any("rank 2" in s.reason and "departs" in s.reason for s in run.skipped)


def test_rank_key_files_without_a_rank_name_are_ranks(tmp_path):
    """F26: files named otherwise that carry one `rank` value each, with overlapping steps, are ranks too."""
    for r, name in enumerate(("a.jsonl", "b.jsonl")):
        _write_jsonl(tmp_path / name, _rank_rows(r, bad=False))
    run = load_run(tmp_path)
    assert set(run.metrics["segment"].to_list()) == {0}
    assert not any("departs" in s.reason for s in run.skipped)


def test_files_one_after_another_are_still_segments(tmp_path):
    """Two files of one writer that go back in steps (a resume) stay two segments: no rank token, no rank key."""
    _write_jsonl(tmp_path / "a.jsonl", [{"step": s, "loss": 1.0} for s in range(100)])
    _write_jsonl(tmp_path / "b.jsonl", [{"step": s, "loss": 1.0} for s in range(50, 150)])
    assert set(load_run(tmp_path).metrics["segment"].to_list()) == {0, 1}


# -- F23: the short name `gn` ------------------------------------------------------------------------


def test_gn_is_the_grad_norm(tmp_path):
    """F23: `gn` (like `gnorm`) in a `step N | loss X | lr Y | gn G` log is the grad norm."""
    (tmp_path / "train.log").write_text("".join(
        f"step {s} | loss {2.0 - s / 100:.4f} | lr 0.001 | gn {0.5 + s / 100:.3f}\n" for s in range(50)))
    run = load_run(tmp_path)
    assert run.metrics.filter(run.metrics["metric"] == "grad_norm").height == 50


# -- F22: a resume that restarts the step counter ----------------------------------------------------


def _resume_log(tmp_path: Path, continue_loss: bool) -> Path:
    """`iter N | loss | lr | gnorm` with warm-up + cosine; checkpoint at 100, crash at 119, restart from iter 0."""
    def lr(s: int) -> float:
        return 2e-3 * min(1.0, (s + 1) / 40) * (0.5 + 0.5 * math.cos(math.pi * s / 400))

    def loss(s: int) -> float:
        return 4.6 * math.exp(-s / 30) + 2.5 + 0.02 * math.sin(s)

    lines = [f"iter {s:6d} | loss {loss(s):.4f} | lr {lr(s):.3e} | gnorm 0.5" for s in range(100)]
    lines.append("checkpoint saved: ckpt/step100.pt")
    lines += [f"iter {s:6d} | loss {loss(s):.4f} | lr {lr(s):.3e} | gnorm 0.5" for s in range(100, 120)]
    lines += ["Traceback (most recent call last):", "RuntimeError: NCCL timeout",
              "=== restarted: loading ckpt/step100.pt ==="]
    for s in range(150):
        level = loss(100 + s) if continue_loss else loss(s)
        lines.append(f"iter {s:6d} | loss {level:.4f} | lr {lr(s):.3e} | gnorm 0.5")
    run = tmp_path / ("reset" if continue_loss else "fresh")
    run.mkdir()
    (run / "log.txt").write_text("\n".join(lines) + "\n")
    return run


def test_resume_that_restarts_the_step_counter_is_found(tmp_path):
    """F22: the loss goes on from the checkpoint's level while the step and the warm-up start again."""
    report = api.analyze(_resume_log(tmp_path, continue_loss=True))
    lr01 = [f for f in report.findings if f.code == "LR01" and "step counter restarted" in f.message]
    assert lr01 and lr01[0].evidence["checkpoint_step"] == 100


def test_a_fresh_start_after_a_crash_is_no_counter_reset(tmp_path):
    """A job started again from scratch (the loss is back at its first level) restores nothing: no such finding."""
    report = api.analyze(_resume_log(tmp_path, continue_loss=False))
    assert not [f for f in report.findings if "step counter restarted" in f.message]


def test_epoch_indexed_table_resume_stays_a_segment(tmp_path):
    """One record per epoch (no step key), a resume re-logging epoch 6: still two segments."""
    rows = [{"epoch": e, "loss": 1.0 / (e + 1)} for e in [*range(7), *range(6, 10)]]
    _write_jsonl(tmp_path / "metrics.jsonl", rows)
    assert {s for s, _ in _loss(load_run(tmp_path))} == {0, 1}
