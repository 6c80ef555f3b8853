"""The onset of an fp16 loss-scale collapse is the step that overflowed, as the writers log it."""

from __future__ import annotations

import json
from pathlib import Path

from forensics.api import analyze


def test_megatron_collapse_onset_is_the_first_skipped_iteration(tmp_path: Path) -> None:
    """Megatron logs the halved scale and the skip on the iteration that overflowed (here 250), not the one before."""
    lines = []
    for i in range(1, 301):
        scale = 2.0 ** max(0, 16 - max(0, i - 249))
        loss = f"lm loss: {3 - i / 200:.6E} | " if i < 250 else ""
        lines.append(f" iteration {i:8d}/     300 | learning rate: 1.000000E-04 | {loss}loss scale: {scale:.1f} | "
                     f"number of skipped iterations: {1 if i >= 250 else 0:3d} | number of nan iterations:   0 |")
    (tmp_path / "stdout.log").write_text("\n".join(lines) + "\n")
    a = analyze(tmp_path)
    assert a.cause == "overflow" and a.onset is not None and a.onset["step"] == 250, a.summary


def test_scale_logged_after_update_onset_is_its_first_smaller_value(tmp_path: Path) -> None:
    """Only a loss scale logged (GradScaler.get_scale() after update()): the first halved value's step is the onset."""
    with (tmp_path / "metrics.jsonl").open("w") as f:
        for i in range(600):
            scale = 65536.0 if i < 400 else max(1.0, 65536.0 / 2 ** (i - 399))
            f.write(json.dumps({"step": i, "loss": 3 - i / 1000, "lr": 1e-4, "loss_scale": scale}) + "\n")
    a = analyze(tmp_path)
    assert a.cause == "overflow" and a.onset is not None and a.onset["step"] == 400, a.summary
