"""Two names read as ``loss`` in one file at the same steps are two series, not one (forensics.objective)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from forensics.api import analyze_run, load


def _moe_log(run: Path, total: str = "loss") -> None:
    """A MoE-style log: the total loss beside its cross-entropy part, which stays flat.

    The total is cross-entropy plus 0.01 x an auxiliary loss that blows up from step 2000.
    """
    run.mkdir(parents=True, exist_ok=True)
    with (run / "metrics.jsonl").open("w") as fh:
        for s in range(0, 3000, 5):
            ce = 2.2 + 4.0 * math.exp(-s / 300)
            aux = 8.0 * (math.exp((s - 2000) / 150) if s > 2000 else 1.0)
            fh.write(json.dumps({"step": s, total: ce + 0.01 * aux, "loss_ce": ce, "loss_aux": aux,
                                 "lr": 3e-4}) + "\n")


def test_the_total_stays_the_objective_and_the_part_is_a_part(tmp_path: Path) -> None:
    """``loss`` beside ``loss_ce``: one ``loss`` row per step, ``loss_ce`` is ``loss/ce``, the blow-up is found."""
    _moe_log(tmp_path)
    run = load(tmp_path)
    loss = run.metrics.filter(run.metrics["metric"] == "loss")
    assert loss.height == 600 and set(loss["tag"].cast(str).unique()) == {"loss"}
    assert run.meta["names"]["loss_ce"]["metric"] == "loss/ce"
    assert "beside 'loss'" in run.meta["names"]["loss_ce"]["why"]
    analysis = analyze_run(run)
    assert analysis.verdict == "anomaly" and 2000 <= analysis.onset["step"] <= 2100


def test_a_total_word_ranks_first(tmp_path: Path) -> None:
    """``train/total_loss`` beside ``loss_ce``: the total is the objective."""
    _moe_log(tmp_path, total="train/total_loss")
    run = load(tmp_path)
    assert run.meta["objective"]["tags"] == ["train/total_loss"]
    assert analyze_run(run).verdict == "anomaly"


def test_the_user_can_pick_the_part(tmp_path: Path) -> None:
    """``--metric loss=loss_ce`` takes the logged name ``loss_ce``, not every series named ``loss``."""
    _moe_log(tmp_path)
    run = load(tmp_path, {"loss": "loss_ce"})
    loss = run.metrics.filter(run.metrics["metric"] == "loss")
    assert set(loss["tag"].cast(str).unique()) == {"loss_ce"} and loss.height == 600


def test_one_loss_under_two_names_in_two_files_is_one_series(tmp_path: Path) -> None:
    """A writer's ``train/loss`` and a log's ``loss`` of the same steps in different files stay ``loss``."""
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"step": s, "train/loss": 3 - s * 0.01}) + "\n"
                                              for s in range(100)))
    (tmp_path / "b.jsonl").write_text("".join(json.dumps({"step": s, "loss": 3 - s * 0.01 + 1e-3}) + "\n"
                                              for s in range(100)))
    run = load(tmp_path)
    assert set(run.meta["objective"]["tags"]) == {"train/loss", "loss"}


def test_an_eval_only_objective_is_inconclusive_not_healthy(tmp_path: Path) -> None:
    """Only ``val_loss`` every 100 steps: no detector judges it, so the verdict is inconclusive with why."""
    with (tmp_path / "metrics.jsonl").open("w") as fh:
        for s in range(0, 5000, 100):
            fh.write(json.dumps({"step": s, "val_loss": 3.0 - s / 2000 if s < 3000 else 1.5 + (s - 3000) / 500,
                                 "lr": 1e-3}) + "\n")
    a = analyze_run(load(tmp_path))
    assert a.verdict == "inconclusive" and "evaluation objective eval_loss (val_loss)" in a.summary


def test_a_training_perplexity_is_judged_through_its_log(tmp_path: Path) -> None:
    """Only ``train_ppl``: its natural log is the loss, so a blow-up from step 1500 is found, not 'healthy'."""
    with (tmp_path / "metrics.jsonl").open("w") as fh:
        for s in range(3000):
            loss = 2.0 + 1.0 * math.exp(-s / 300) + (0.004 * (s - 1500) if s > 1500 else 0.0)
            fh.write(json.dumps({"step": s, "train_ppl": math.exp(loss), "lr": 1e-3}) + "\n")
    run = load(tmp_path)
    assert run.meta["objective"]["tags"] == ["log(train_ppl)"]
    a = analyze_run(run)
    assert a.verdict == "anomaly" and 1400 <= a.onset["step"] <= 1700
