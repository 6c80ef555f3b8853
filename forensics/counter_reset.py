"""A resume that restored the weights but not the step counter (LR01's ``reset_to_initial`` at a resume).

``global_step`` not restored: the job loads a checkpoint saved at step ``c`` (the last ``checkpoint_saved``
event before the crash), then counts from the run's first step again and replays the lr warm-up, while
the loss goes on from the checkpoint's level. Read as a fresh start, such a segment looks like the
earlier one logged at the same steps (same lr), so no lr comparison at equal steps can see it. The
sign is the loss: after a true fresh start it is back near the run's first loss; here it is near the
loss at the checkpoint (closer than :data:`LEVEL_SHARE` of the way between the two) while the lr is
the start's, not the checkpoint's.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from forensics.model import RunData

__all__ = ["HEAD_POINTS", "LEVEL_SHARE", "MIN_DROP", "counter_not_restored"]

HEAD_POINTS = 5
"""Logged points whose median loss is a segment's level at its start or at the checkpoint (ours)."""
LEVEL_SHARE = 0.5
"""The resumed loss is the checkpoint's level when it is less than this share of the way from the
checkpoint's loss to the run's first loss (ours: the midpoint)."""
MIN_DROP = 0.2
"""The run must have lowered its loss by this share before the checkpoint, else the two levels are one (ours)."""
LR_TOL = 0.05
"""Relative lr difference at which the resumed lr is not the checkpoint's (LR01's ``rel_tol``, 5%)."""


def counter_not_restored(run: RunData, first: pl.DataFrame, prev: pl.DataFrame, cur: pl.DataFrame,
                         ) -> tuple[dict[str, object], str] | None:
    """Evidence and message when the resumed segment ``cur`` restarted the step counter, else None.

    Args:
        run: The run (its ``checkpoint_saved`` events and loss).
        first: lr rows (``segment``, ``step``, ``value``) of the run's first segment, in step order.
        prev: lr rows of the segment before the resume.
        cur: lr rows of the resumed segment.

    Returns:
        ``(evidence, message)`` of an ``lr_schedule_reset / reset_to_initial`` finding, or None.
    """
    s0 = int(cur.get_column("step")[0])
    if s0 > int(first.get_column("step")[0]) or run.events.height == 0:
        return None
    seg_prev = int(prev.get_column("segment")[0])
    saved = run.events.filter((pl.col("kind") == "checkpoint_saved") & (pl.col("segment") <= seg_prev)
                              & (pl.col("step") > s0))
    if saved.height == 0:
        return None
    ckpt = int(saved.get_column("step").max())
    loss = run.raw("loss", ["segment", "step", "value"]).filter(pl.col("value").is_not_null())
    at_start = _level(loss.filter(pl.col("segment") == int(first.get_column("segment")[0])), head=True)
    at_ckpt = _level(loss.filter((pl.col("segment") == seg_prev) & (pl.col("step") <= ckpt)), head=False)
    resumed = _level(loss.filter(pl.col("segment") == int(cur.get_column("segment")[0])), head=True)
    if None in (at_start, at_ckpt, resumed) or not at_ckpt < at_start * (1 - MIN_DROP):
        return None
    if resumed - at_ckpt > LEVEL_SHARE * (at_start - at_ckpt):
        return None  # back near the first loss: a fresh start, not a resume
    lr_ckpt = prev.filter(pl.col("step") <= ckpt).get_column("value")
    lr_now = float(cur.get_column("value")[0])
    if lr_ckpt.len() == 0 or abs(lr_now - float(lr_ckpt[-1])) <= LR_TOL * abs(float(lr_ckpt[-1])):
        return None
    ev: dict[str, object] = {"checkpoint_step": ckpt, "resumed_at": s0, "lr_at_checkpoint": float(lr_ckpt[-1]),
                             "lr_resumed": lr_now, "loss_at_start": at_start, "loss_at_checkpoint": at_ckpt,
                             "loss_resumed": resumed}
    msg = (f"the job resumed from the checkpoint saved at step {ckpt}, but its step counter restarted at {s0} and "
           f"the lr warm-up replays ({lr_now:.3g} instead of {float(lr_ckpt[-1]):.3g}), while the loss goes on "
           f"from the checkpoint's level ({resumed:.4g}, vs {at_ckpt:.4g} at the checkpoint and {at_start:.4g} "
           "at the run's start): the step counter and the lr scheduler state were not restored")
    return ev, msg


def _level(df: pl.DataFrame, head: bool) -> float | None:
    """Median of the first (``head``) or last :data:`HEAD_POINTS` finite values in step order, or None."""
    v = df.sort("step").get_column("value").to_numpy().astype(float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return None
    return float(np.median(v[:HEAD_POINTS] if head else v[-HEAD_POINTS:]))
