"""A run whose loss spikes with the same data every cycle: onset at the first occurrence, a plan that drops it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from forensics.api import analyze


def _write_run(folder: Path, period: int = 40, first: int = 30, steps: int = 400, small: int = 4) -> list[int]:
    """metrics.jsonl: a falling loss, the same batch every ``period`` steps, a full spike after ``small`` small ones."""
    rng = np.random.default_rng(3)
    s = np.arange(1, steps + 1)
    loss = (2.0 + 3.0 / np.sqrt(1 + s / 20)) * np.exp(rng.normal(0, 0.01, steps))
    hits = list(range(first, steps, period))
    for k, step in enumerate(hits):
        loss[step - 1] *= 1.06 if k < small else 1.5
    folder.mkdir(parents=True)
    with (folder / "metrics.jsonl").open("w") as f:
        for i in range(steps):
            f.write(json.dumps({"step": int(s[i]), "loss": float(loss[i]), "lr": 1e-3}) + "\n")
    return hits


def test_recurring_spikes_onset_is_the_first_occurrence(tmp_path: Path) -> None:
    """The small early repeats are on the chain: the onset is step 30, not the first full spike at 190."""
    hits = _write_run(tmp_path / "run")
    a = analyze(tmp_path / "run")
    assert (a.verdict, a.cause) == ("anomaly", "data_batch"), a.summary
    assert a.onset is not None and a.onset["step"] == hits[0], a.summary
    assert a.recovery is not None and a.recovery.trials[0].name == "drop the recurring data"
    assert a.recovery.trials[0].settings["inspect_batches"][:3] == hits[:3]


def test_one_spike_keeps_the_skip_plan(tmp_path: Path) -> None:
    """Without a recurrence the plan is the usual batch skip from the spike."""
    _write_run(tmp_path / "run", period=1000, first=250, small=0)
    a = analyze(tmp_path / "run")
    assert a.cause == "data_batch" and a.onset is not None and a.onset["step"] == 250, a.summary
    assert a.recovery is not None and a.recovery.trials[0].name != "drop the recurring data"
