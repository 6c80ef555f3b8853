"""Functional tests over the committed sample runs (real tiny Transformers trained on CPU).

Each run folder's expected.json (written by sample_logs/make_samples.py from what it injected)
gives the true verdict, cause and onset window; the analyzer must find exactly that.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forensics.api import analyze

SAMPLES = Path(__file__).resolve().parents[1] / "sample_logs"
RUNS = sorted(p.parent for p in SAMPLES.glob("*/expected.json"))


@pytest.mark.parametrize("run", RUNS, ids=[r.name for r in RUNS])
def test_sample_run_diagnosis(run: Path) -> None:
    """Verdict, cause and onset window match what was injected."""
    exp = json.loads((run / "expected.json").read_text())
    a = analyze(run)
    assert a.verdict == exp["verdict"], a.summary
    assert a.cause == exp["cause"], a.summary
    if exp.get("mechanism"):
        assert a.mechanism in {exp["mechanism"], *exp.get("mechanism_alternatives", [])}, a.summary
    if exp.get("onset_window"):
        lo, hi = exp["onset_window"]
        assert a.onset is not None and lo <= a.onset["step"] <= hi, a.summary
        assert a.recovery is not None and a.recovery.trials
    else:
        assert a.onset is None


def test_every_fault_has_a_sample() -> None:
    """The design card's four cause families plus healthy each have a committed run."""
    names = {r.name for r in RUNS}
    assert {"healthy", "lr_schedule_reset", "overflow", "data_batch", "update_scale_growth"} <= names


def test_expected_json_is_ignored_by_the_analyzer() -> None:
    """The answer key in each run folder is never read as a log."""
    a = analyze(SAMPLES / "healthy")
    assert all("expected.json" not in s.path for s in a.sources)
