"""Diagnosis on runs the rules were not tuned on (issue 15): the varied corpus of make_varied_corpus.py.

Two tests:

* ``test_ci_subset``: trains a small VALIDATION subset (10 real tiny runs, fixed seeds chosen by
  :func:`make_varied_corpus.ci_subset` from their specs only) into a temporary folder and pins what the analyzer
  gets right on it; runs everywhere (about a minute on one core).
* ``test_validation_figures``: the pinned validation figures of the full corpus, when it is present
  (``$FORENSICS_VARIED_CORPUS``, default ``/work/corpus15``, written by
  ``python sample_logs/make_varied_corpus.py --out DIR``); skipped with the reason otherwise (the corpus is
  a few hundred MB of generated logs, kept outside the repository).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "sample_logs"))
sys.path.insert(0, str(ROOT))

VARIED = Path(os.environ.get("FORENSICS_VARIED_CORPUS", "/work/corpus15"))

# Pinned on the validation part (measured with benchmarks/accuracy.py --varied-only; see README "Accuracy").
# Measured 2026-12-01 (main, after the cap became the share of the diagnosis's rival causes checked,
# forensics/coverage.py, floor 0.5 chosen on the tuning part) on /work/corpus15, 422 runs (validation 140):
# cause 134/140 = 95.7 %, onset in window 79/85 = 92.9 % (DB02), false alarms 0/55, ECE 0.089 (logistic map + cap).
# Issue 15 asks ECE <= 0.1: the pin is the goal. Cause and onset pinned a little below the measure.
PIN_CAUSE = 0.93
PIN_ONSET = 0.89
PIN_FALSE_ALARMS = 0.0
PIN_ECE = 0.10


@pytest.fixture(scope="module")
def ci_runs(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """The CI subset, trained once per test session."""
    import make_varied_corpus as mvc

    out = tmp_path_factory.mktemp("varied")
    labels = []
    for seed in mvc.ci_subset(10):
        name, lab, why = mvc.make_one((seed, str(out)))
        if lab is not None:
            labels.append({**lab, "path": out / name})
    return labels


def test_ci_subset(ci_runs: list[dict]) -> None:
    """Every generated run is labelled, and the analyzer's verdicts on them match the pinned figures."""
    from benchmarks.accuracy import Item, run_analysis

    assert len(ci_runs) >= 8, "the CI subset did not train"
    items = [Item(name=r["run"], kind="varied", path=r["path"], verdict=r["verdict"], cause=r["cause"],
                  causes_ok={r["cause"]}, mechanism=r["mechanism"], mechs_ok={r["mechanism"]} - {None},
                  window=tuple(r["onset_window"]) if r["onset_window"] else None, split=r["split"],
                  fault_kind=r["kind"]) for r in ci_runs]
    for i in items:
        run_analysis(i)
    wrong = [f"{i.name}: {'; '.join(i.problems())}" for i in items if not i.cause_ok()]
    healthy = [i for i in items if i.cause is None]
    alarms = [i.name for i in healthy if i.false_alarm()]
    assert not alarms, f"false alarms on healthy runs: {alarms}"
    assert len(wrong) <= CI_MAX_WRONG, "\n".join(wrong)


CI_MAX_WRONG = 3
"""Measured: 2 of 10 wrong (optimizer_not_restored_2044, sampler_replay_2067: no visible trace), one of margin."""


@pytest.mark.skipif(not (VARIED / "labels.json").is_file(),
                    reason=f"varied corpus not found at {VARIED} (python sample_logs/make_varied_corpus.py --out DIR; "
                    "set FORENSICS_VARIED_CORPUS)")
def test_validation_figures() -> None:
    """Cause accuracy, onset-in-window, false alarms and ECE on the validation part stay at the pinned values."""
    from benchmarks.accuracy import run_all, split_figures, varied_items

    items = [i for i in varied_items(VARIED) if i.split == "validation"]
    run_all(items, jobs=2)
    fig = split_figures(items)["validation"]
    assert fig["cause"] is not None and fig["cause"] >= 100 * PIN_CAUSE, fig
    assert fig["onset"] is not None and fig["onset"] >= 100 * PIN_ONSET, fig
    assert fig["false_alarm"] is not None and fig["false_alarm"] <= 100 * PIN_FALSE_ALARMS, fig
    assert fig["ece"] is not None and fig["ece"] <= PIN_ECE, fig


# ------------------------------------------------------------------------------------ units of issue 15's rules


def _jsonl_run(tmp: Path, jump_at: int | None, gap_at: int = 121, steps: int = 200) -> Path:
    """A JSONL run with a restart at ``gap_at`` (a 300 s wall-clock gap; the steps go on, none re-logged).

    The update ratio follows the lr; from ``jump_at`` it is 3x that for 20 steps (fresh Adam moments).
    """
    import json
    import math
    import random

    r = random.Random(7)
    out = tmp / "run"
    out.mkdir(parents=True)
    rows, wall = [], 1.7e9
    for s in range(1, steps + 1):
        wall += 0.5 * r.uniform(0.97, 1.03) + (300.0 if s == gap_at else 0.0)
        lr = 3e-3 * (0.5 + 0.5 * math.cos(math.pi * s / steps))
        ur = lr * 0.6 * math.exp(r.gauss(0, 0.03)) * (3.0 if jump_at and jump_at <= s < jump_at + 20 else 1.0)
        rows.append({"step": s, "loss": 3.0 * math.exp(-s / 150) + 1.5 + r.gauss(0, 0.05), "lr": lr,
                     "grad_norm": 0.6 * math.exp(r.gauss(0, 0.1)), "update_ratio": ur, "wall_time": wall})
    (out / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    return out


def test_restart_without_relogged_steps_is_judged(tmp_path: Path) -> None:
    """RS01 judges a wall-clock restart whose steps did not go back: an update-ratio jump is optimizer_state."""
    from forensics.api import load
    from forensics.detectors.resume_state import ResumeState

    faulty = ResumeState().detect(load(_jsonl_run(tmp_path / "a", jump_at=121)))
    assert [(f.cause, f.mechanism, f.step) for f in faulty] == [("state_not_restored", "optimizer_state", 121)]
    assert faulty[0].evidence["restart"].startswith("wall-clock gap")
    assert ResumeState().detect(load(_jsonl_run(tmp_path / "b", jump_at=None))) == []


def test_coverage_cap() -> None:
    """The cap follows the share of log detectors evaluated; checkpoint and notes detectors do not count."""
    from forensics.calibration import CAP_FLOOR, calibrate, calibrate_decision, coverage
    from forensics.model import Skip

    codes = ["SP01", "GN01", "LR01", "OV01", "CK01", "NT01"]
    skips = [Skip("GN01 grad_norm.departure", "not evaluated"), Skip("CK01 checkpoint.nonfinite_state", "no ckpt")]
    cov = coverage(skips, codes, skipped_inputs=1)
    assert (cov["detectors_total"], cov["detectors_evaluated"], cov["not_evaluated"]) == (4, 3, ["GN01"])
    assert cov["cap"] == round(CAP_FLOOR + (1 - CAP_FLOOR) * 0.75 - 0.03, 3)
    conf, cov = calibrate_decision(0.99, "anomaly", "data_batch", skips, codes, 1)
    assert conf <= cov["cap"] and cov["capped"] and cov["note"].startswith("confidence capped at")
    healthy, hcov = calibrate_decision(0.99, "healthy", None, skips, codes, 1)
    # no cap on a healthy verdict (api.py's coverage factor lowers it instead): even a cap of 0 leaves it alone
    assert not hcov["capped"] and healthy == calibrate(0.99, "healthy", None, {**hcov, "cap": 0.0}) > 0.5


def test_realrun_loss_only_nan_is_capped() -> None:
    """The shared nanoGPT NaN run logs the loss only: its confidence is capped and the JSON says why."""
    run = ROOT.parent / "shared" / "realruns" / "nanogpt" / "termux_shakespeare_char_nan"
    if not run.is_dir():
        pytest.skip(f"shared realruns not found at {run}")
    from forensics.api import analyze

    a = analyze(run)
    cov = a.meta["coverage"]
    assert cov["capped"] and a.confidence <= cov["cap"] < 0.9, cov
    # a NaN with the loss alone: an lr blow-up, a growth and an fp16 overflow were all left unchecked
    assert cov["share_evaluated"] == 0.0 and "rival causes not checked" in cov["note"]
    assert {r.split(" ")[0] for r in cov["rivals_unchecked"]} == {"lr_schedule_reset", "update_scale_growth",
                                                                  "overflow"}


def test_rivals_checked_follow_the_logged_signals() -> None:
    """Each rival is checked by any one of its signals; an fp16-only rival also by a known non-fp16 precision."""
    from forensics.coverage import rivals_checked

    logged = {"loss", "lr"}
    share, checked, unchecked = rivals_checked("data_batch", logged.__contains__, nonfinite=False, fp16=None)
    assert (share, checked) == (0.5, ["lr_schedule_reset"]) and unchecked[0].startswith("update_scale_growth")
    share, checked, _ = rivals_checked("data_batch", logged.__contains__, nonfinite=True, fp16=False)
    assert share == 2 / 3 and "overflow" in checked  # bf16/fp32 known: no fp16 overflow to rule out
    assert rivals_checked("data_batch", logged.__contains__, nonfinite=True, fp16=True)[0] == 1 / 3
    assert rivals_checked("lr_schedule_reset", logged.__contains__, False, None)[0] == 1.0  # lr is its evidence
    assert rivals_checked("unknown", logged.__contains__, False, None) == (1.0, [], [])
    assert rivals_checked("state_not_restored", {"loss"}.__contains__, False, None)[0] == 0.0
