"""Metric names by rule, not by list (forensics.schema), and the objective of sparse loss components.

Split words after a slash, loss-scale and skipped-step names under any prefix, names compared ignoring case and
punctuation.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forensics.api import analyze_run, load
from forensics.schema import canonical_metric, explain_metric


@pytest.mark.parametrize(("raw", "canon"), [
    ("Loss/train", "loss"), ("Loss/test", "eval_loss"), ("Loss/val", "eval_loss"), ("loss/validation", "eval_loss"),
    ("Loss/train_step", "loss"), ("Loss/train_epoch", "Loss/train_epoch"), ("LR/train", "lr"),
    ("GradNorm/train", "grad_norm"), ("Accuracy/train", "Accuracy/train"),
    ("amp/loss_scale", "loss_scale"), ("fp16/loss_scale", "loss_scale"), ("loss_scaler", "loss_scale"),
    ("scaler/scale", "loss_scale"), ("deepspeed/cur_scale", "loss_scale"), ("lossScale", "loss_scale"),
    ("layer0/scale", "layer0/scale"),
    ("num_skipped", "skipped_step"), ("overflow", "skipped_step"), ("amp/skipped_total", "skipped_step"),
    ("Skipped Steps", "skipped_step"), ("grad_overflow", "skipped_step"),
    ("skipped_batches", "skipped_batches"), ("overflow_rate", "overflow_rate"),
    ("GradNorm", "grad_norm"), ("learning.rate", "lr"), ("Train Loss (avg)", "loss"),
    ("grad_norm/layer0", "grad_norm/layer0"), ("box_loss", "loss/box"), ("lr/group0", "lr/group0"),
    # Lightning's LearningRateMonitor (user test U7): the first optimizer's first group is the lr
    ("lr-AdamW", "lr"), ("lr-SGD", "lr"), ("lr-AdamW/pg1", "lr"), ("lr-AdamW/pg2", "lr/AdamW/pg2"),
    ("lr-Adam-1", "lr/Adam-1"), ("lr-SGD-momentum", "lr-SGD-momentum"), ("lr-0.001", "lr-0.001"),
])
def test_names_by_rule(raw: str, canon: str) -> None:
    """Each family maps by its rule; a name outside the family keeps its raw or per-layer form."""
    assert canonical_metric(raw) == canon
    assert explain_metric(raw)[0] == canon


def test_a_loss_scale_is_never_a_loss_component() -> None:
    """``amp/loss_scale`` was ``loss/amp_scale``: the reason now names the loss-scale rule."""
    name, why = explain_metric("amp/loss_scale")
    assert name == "loss_scale" and "loss-scale" in why and "component" not in why


def _tb_tutorial_tags(run: Path) -> None:
    """The torch TensorBoard tutorial's tags: ``Loss/train`` every step, ``Loss/test`` every 50; a rise from 900."""
    run.mkdir(parents=True, exist_ok=True)
    with (run / "metrics.jsonl").open("w") as fh:
        for s in range(1000):
            rec = {"step": s, "Loss/train": 2.0 / (1 + s / 50) + 0.3 + (0.005 * (s - 900) if s >= 900 else 0.0)}
            if s % 50 == 0:
                rec["Loss/test"] = rec["Loss/train"] + 0.1
            fh.write(json.dumps(rec) + "\n")


def test_loss_train_and_loss_test_are_the_loss_and_the_eval_loss(tmp_path: Path) -> None:
    """Was: both read as loss components, summed at the 20 test steps only, and the divergence called healthy."""
    _tb_tutorial_tags(tmp_path)
    run = load(tmp_path)
    assert run.meta["objective"]["tags"] == ["Loss/train"]
    assert run.metrics.filter(run.metrics["metric"] == "loss").height == 1000
    assert run.metrics.filter(run.metrics["metric"] == "eval_loss").height == 20
    analysis = analyze_run(run)
    assert analysis.verdict == "anomaly" and 880 <= analysis.onset["step"] <= 920


def test_sparse_components_do_not_drop_most_training_points(tmp_path: Path) -> None:
    """``loss/box`` every step and ``loss/obj`` every 50: their sum would cover 2 % of the steps; box is taken."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    with (tmp_path / "metrics.jsonl").open("w") as fh:
        for s in range(500):
            rec = {"step": s, "box_loss": 1.0 / (1 + s / 50)}
            if s % 50 == 0:
                rec["obj_loss"] = 0.5
            fh.write(json.dumps(rec) + "\n")
    run = load(tmp_path)
    obj = run.meta["objective"]
    assert obj["tags"] == ["box_loss"] and "only 10 of the 500" in obj["why"]
    assert run.metrics.filter(run.metrics["metric"] == "loss").height == 500
