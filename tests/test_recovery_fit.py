"""Recovery plans fit the run they are for (issue 15, "Plans that do not fit the run").

Success criteria are stated on the chosen cause's causal series and never already met by the failed run
after its onset; a log that starts mid-run never sends the trial back to step 0; trials are short (capped,
and said so); a re-warm-up is shorter than the trial; with no checkpoint in the folder the plan says so and
names the last step to resume at or before. Each run here is a table built in the test.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from forensics.model import Cause, Mechanism, RunData
from forensics.recovery import PLANNERS, plan
from forensics.recovery._resume import TRIAL_MAX
from forensics.schema import METRICS_SCHEMA, empty_events


def _run(steps: np.ndarray, columns: dict[str, np.ndarray], folder: str = "no/such/run") -> RunData:
    n = steps.shape[0]
    parts = [pl.DataFrame({
        "run": pl.Series(["r"] * n, dtype=pl.String), "segment": pl.Series(np.zeros(n), dtype=pl.Int32),
        "step": pl.Series(steps, dtype=pl.Int64), "metric": pl.Series([name] * n, dtype=pl.String),
        "value": pl.Series(values, dtype=pl.Float64, nan_to_null=False),
        "wall_time": pl.Series([None] * n, dtype=pl.Float64), "tag": pl.Series([name] * n, dtype=pl.String),
        "source": pl.Series(["metrics.jsonl"] * n, dtype=pl.String)}) for name, values in columns.items()]
    df = pl.concat(parts)
    assert df.columns == [f.name for f in METRICS_SCHEMA]
    return RunData(folder, df, pl.from_arrow(empty_events()), {}, [], [])  # type: ignore[arg-type]


def _flat_loss(steps: np.ndarray, seed: int = 0) -> np.ndarray:
    return 2.0 + 0.01 * np.random.default_rng(seed).standard_normal(steps.shape[0])


def test_a_log_that_starts_mid_run_never_restarts_from_step_0() -> None:
    """Logs from step 11434 on, no checkpoint: every cause's plan resumes at or before 11433, never at 0."""
    steps = np.arange(11434, 11700)
    run = _run(steps, {"loss": _flat_loss(steps)})
    for cause in PLANNERS:
        p = plan(run, cause, None, 11450)
        assert p is not None and p.resume_from["step"] == 11433, (cause, p.resume_from)
        assert "not from step 0" in p.resume_from["why"], cause


def test_a_fresh_run_logged_every_5_steps_is_not_mid_run() -> None:
    """First logged step 5 with a 5-step interval: the run started fresh, so a rerun from the start is right."""
    steps = np.arange(5, 500, 5)
    p = plan(_run(steps, {"loss": _flat_loss(steps)}), Cause.GRAD_SCALING_BUG, Mechanism.GA_NORMALISATION, 5)
    assert p is not None and p.resume_from["step"] == 0 and "from the start" in p.resume_from["why"]


def test_no_checkpoint_in_the_folder_is_said_with_the_step_to_resume_at_or_before() -> None:
    """No checkpoint: the plan says so and names the newest step to resume at or before (100 before the onset)."""
    steps = np.arange(0, 1000)
    p = plan(_run(steps, {"loss": _flat_loss(steps)}), Cause.DATA_BATCH, Mechanism.BAD_BATCH, 600)
    assert p is not None and p.resume_from["checkpoint"] is None and p.resume_from["step"] == 500
    assert "no checkpoint found in the folder" in p.resume_from["why"]
    assert "at or before step 500" in p.resume_from["why"]


def test_trials_are_short_and_the_cap_is_stated(tmp_path: Path) -> None:
    """A checkpoint 14,900 steps before the onset: every arm runs at most TRIAL_MAX steps, and the plan says so."""
    (tmp_path / "checkpoint-100").mkdir()
    steps = np.arange(0, 16000)
    p = plan(_run(steps, {"loss": _flat_loss(steps)}, str(tmp_path)), Cause.DATA_BATCH, Mechanism.BAD_BATCH, 15000)
    assert p is not None and p.resume_from["checkpoint"] == "checkpoint-100"
    assert all(0 <= t.steps <= TRIAL_MAX for t in p.trials) and max(t.steps for t in p.trials) == TRIAL_MAX
    assert f"each trial runs {TRIAL_MAX} steps" in p.resume_from["why"]


@pytest.mark.parametrize(("warmup", "longer_arm"), [(3000, False), (40, True)])
def test_a_rewarm_up_is_shorter_than_the_trial(tmp_path: Path, warmup: int, longer_arm: bool) -> None:
    """Every arm's warm-up is shorter than the arm; a "longer warm-up" arm only when twice the warm-up fits."""
    (tmp_path / f"checkpoint-{warmup}").mkdir()
    steps = np.arange(0, warmup + 1000)
    lr = np.minimum(1.0, (steps + 1) / warmup) * 1e-3
    run = _run(steps, {"loss": _flat_loss(steps), "lr": lr}, str(tmp_path))
    p = plan(run, Cause.UPDATE_SCALE_GROWTH, Mechanism.LR_TOO_HIGH, warmup + 100, {"spike_steps": [warmup + 100]})
    assert p is not None
    warm = [(t.name, t.settings["warmup_steps"], t.steps) for t in p.trials if t.settings.get("warmup_steps")]
    assert warm and all(w < n for _name, w, n in warm), warm
    assert any(t.name == "longer warm-up" for t in p.trials) is longer_arm


def test_criteria_the_failed_run_already_met_are_not_emitted() -> None:
    """A loss that stays flat after the onset meets the level criterion: the planner leaves it out."""
    steps = np.arange(0, 800)
    flat = _flat_loss(steps)
    rising = np.where(steps < 400, flat, 2.0 + 0.05 * (steps - 400))
    kept = plan(_run(steps, {"loss": rising}), Cause.UNKNOWN, None, 400)
    left = plan(_run(steps, {"loss": flat}), Cause.UNKNOWN, None, 400)
    assert kept is not None and left is not None
    assert any("loss stays within" in c for c in kept.success_criteria)
    assert not any("loss stays within" in c for c in left.success_criteria)
    assert not any("no loss spike" in c for c in left.success_criteria)  # no spike finding after the onset


def test_criteria_are_stated_on_the_causal_series() -> None:
    """Throughput only for a hardware cause; the schedule's lr for an lr reset; loss and grad norm otherwise."""
    steps = np.arange(0, 800)
    up = np.where(steps < 400, 1.0, 1.0 + 0.01 * (steps - 400))
    cols = {"loss": 2.0 * up, "grad_norm": up, "throughput": np.where(steps < 400, 1000.0, 700.0)}
    run = _run(steps, cols)
    hw = plan(run, Cause.HARDWARE_OR_DISTRIBUTED, Mechanism.SLOW_DEVICE, 400)
    growth = plan(run, Cause.UPDATE_SCALE_GROWTH, Mechanism.LR_TOO_HIGH, 400)
    reset = plan(run, Cause.LR_SCHEDULE_RESET, Mechanism.RESET_TO_INITIAL, 400, {"expected_lr": 3e-4})
    assert hw is not None and growth is not None and reset is not None
    assert any(c.startswith("throughput back") for c in hw.success_criteria)
    assert not any("throughput" in c for c in growth.success_criteria)
    assert any("the lr at step 400 is the schedule's 0.0003" in c for c in reset.success_criteria)
    assert not any("the lr at" in c for c in growth.success_criteria)


def test_an_overflow_is_judged_on_the_loss_scale() -> None:
    """An fp16 loss-scale collapse: the criterion on the loss scale is kept; a scale that never fell is no test."""
    steps = np.arange(0, 600)
    flat = _flat_loss(steps)
    collapsed = np.where(steps < 300, 65536.0, 2.0 ** np.maximum(0, 16 - (steps - 300) // 10))
    kept = plan(_run(steps, {"loss": flat, "loss_scale": collapsed}), Cause.OVERFLOW, Mechanism.LOSS_SCALE_COLLAPSE,
                300)
    steady = plan(_run(steps, {"loss": flat, "loss_scale": np.full(600, 65536.0)}), Cause.OVERFLOW,
                  Mechanism.LOSS_SCALE_COLLAPSE, 300)
    assert kept is not None and steady is not None
    assert any(c.startswith("the loss scale stays at or above its pre-onset median (6.554e+04)")
               for c in kept.success_criteria)
    assert not any("loss scale" in c for c in steady.success_criteria)


def test_the_resume_point_claims_loaded_only_when_the_resume_started_right_after_it() -> None:
    """The resume point says "the checkpoint the faulty resume loaded" only when the resume began right after it.

    A checkpoint at 300 and a resume at 301: loaded; a resume at 400 cannot have loaded it, so the plan names
    the newest listed one and says the loaded one was not read.
    """
    from forensics.recovery._resume import _why_checkpoint

    kw = {"short_margin": False, "at_resume": True, "hw": False, "nonfinite": False}
    assert "faulty resume loaded" in _why_checkpoint(301, 300, "step", 100, **kw, loaded=True)
    why = _why_checkpoint(400, 300, "step", 100, **kw, loaded=False)
    assert "loaded" not in why.split("(")[0] and "not among the files read" in why


def test_an_lr_set_off_its_schedule_inside_one_process_gets_no_resume_plan(tmp_path: Path) -> None:
    """Keras CSVLogger epochs, lr x20 from epoch 30, no resume (user test U11): no resume talk, epochs."""
    from forensics.api import analyze

    rng = np.random.default_rng(0)
    rows = ["epoch,accuracy,loss,learning_rate,val_accuracy,val_loss"]
    for e in range(60):
        lr = 3e-3 * 0.5 * (1 + np.cos(np.pi * e / 60)) * (20 if e >= 30 else 1)
        loss = 1.2 + 3.0 * np.exp(-e / 6) + (0.8 * (e - 29) if e >= 30 else 0) + 0.01 * rng.standard_normal()
        rows.append(f"{e},0.5,{loss:.4f},{lr:.6f},0.5,{loss + 0.05:.4f}")
    (tmp_path / "training.log").write_text("\n".join(rows) + "\n")
    a = analyze(tmp_path)
    assert a.cause == "lr_schedule_reset" and a.onset is not None and a.onset["step"] == 30, (a.cause, a.onset)
    r = a.recovery.to_dict()
    text = " ".join([str(r["resume_from"]["why"]), *r["restore"], *(t["name"] + " " + t["change"] for t in r["trials"]),
                     *r["success_criteria"]])
    assert "faulty resume" not in text and "scheduler restored" not in text and "steps of the start" not in text
    assert "epoch 29" in r["resume_from"]["why"] and "inside one process" in text


def test_lower_lr_arms_stay_below_the_lr_at_which_the_run_broke() -> None:
    """A warm-up to 0.5 over 400 steps that broke at step 110 (lr 0.1375): no arm's peak above it (user test U12)."""
    steps = np.arange(0, 450)
    lr = 0.5 * np.minimum(1.0, (steps + 1) / 400)
    p = plan(_run(steps, {"loss": _flat_loss(steps), "lr": lr}), Cause.UPDATE_SCALE_GROWTH, Mechanism.LR_TOO_HIGH, 110)
    assert p is not None
    peaks = [t.settings["peak_lr"] for t in p.trials if "peak_lr" in t.settings]
    assert peaks and all(0 < x <= lr[110] for x in peaks), peaks
