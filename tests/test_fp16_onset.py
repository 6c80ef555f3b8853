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


def test_deepspeed_late_collapse_with_no_start_up_backoff(tmp_path: Path) -> None:
    """A DeepSpeed collapse at 200 with no start-up back-off is found, its onset the first overflow.

    DeepSpeed prints the scale only when it changes (the scale series starts at the collapse, which is no
    start-up calibration), and its per-step skips, 1 on every step, are not read as a running total twice.
    """
    lines, scale = [], 65536.0
    for i in range(1, 301):
        if i >= 200:
            lines.append(f"[INFO] [fused_optimizer.py:344:_update_scale] Grad overflow on iteration {i}")
            lines.append(f"[INFO] [fused_optimizer.py:345:_update_scale] Reducing dynamic loss scale from {scale} to "
                         f"{max(scale / 2, 1.0)}")
            scale = max(scale / 2, 1.0)
        lines.append(f"[INFO] [logging.py:96:log_dist] [Rank 0] step={i}, skipped={max(0, i - 199)}, lr=[0.0001], "
                     "mom=[(0.9, 0.95)]")
        lines.append(f"steps: {i} loss: {3 - min(i, 199) / 200:.4f} iter time (s): 0.500 samples/sec: 64.0")
    (tmp_path / "log.txt").write_text("\n".join(lines) + "\n")
    a = analyze(tmp_path)
    assert a.cause == "overflow" and a.onset is not None and a.onset["step"] == 200, a.summary
