"""CK03 checkpoint.state_mismatch: optimizer ``step`` or scheduler ``last_epoch`` disagree with the checkpoint's step.

Rule (DESIGN.md section 4, ``state_not_restored`` and ``lr_schedule_reset``; docs/formats.md#optimizer-state: "a
``step`` that disagrees with ``global_step``"): Adam's per-parameter ``step`` and an LR scheduler's
``last_epoch`` count the optimizer steps taken since they were created; saved with a checkpoint of
logged step ``S`` they equal ``S`` (minus steps the loss scaler skipped) unless the job was resumed
without loading them. A counter ``c`` at ``S`` then says the state was rebuilt at step ``R = S - c``.
The offset ``S - c`` must stay constant from one checkpoint to the next (a jump of more than
``tolerance`` plus the logged skipped steps in between is a lost state); at the first checkpoint
it must be ~0, or else a restart must be logged near ``R`` (a per-epoch scheduler has a large
offset at every checkpoint and no restart there, so it is never flagged).

Optimizer counter off -> ``state_not_restored`` (optimizer moments rebuilt: BigScience rebuilt lost
Adam moments with lr = 0 for 5/(1-beta2) steps); scheduler counter off while the optimizer's is
right -> ``lr_schedule_reset`` / ``reset_to_initial``. The step is ``R + 1``, the first step after the
resume; confidence ``confidence`` (0.75) when the logs show a restart near ``R``, else
``confidence_restart_not_logged`` (0.55: only the counters say so). Needs the checkpoint's step from its
name or ``trainer_state.json``, not from the optimizer.

Source: docs/detectors.md#ck03 (the thresholds, where each comes from, the published reports).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from forensics.detectors.base import Detector, checkpoint_segment
from forensics.model import Cause, Finding, Mechanism, RunData, Severity


def _skipped_between(run: RunData, lo: int, hi: int) -> int:
    s = run.series("skipped_step")
    if s is None:
        return 0
    sel = (s.steps > lo) & (s.steps <= hi) & np.isfinite(s.values)
    return int(np.sum(s.values[sel] > 0))


@dataclass(frozen=True)
class CheckpointStateMismatch(Detector):
    """A resume that lost the optimizer or scheduler state, read from the saved counters."""

    code = "CK03"
    name = "checkpoint.state_mismatch"
    tolerance: int = 2
    restart_window: int = 5
    confidence: float = 0.75
    confidence_restart_not_logged: float = 0.55

    def missing(self, run: RunData) -> str | None:
        """Skip reason when no checkpoint carried optimizer or scheduler state."""
        cks = run.meta.get("checkpoints") or []
        if any(c.get("optimizer") or c.get("scheduler") for c in cks):
            return None
        return "needs optimizer or scheduler state in a checkpoint"

    def _restart_near(self, run: RunData, step: int) -> int | None:
        starts = run.segment_starts()
        near = [s for seg, s in starts.items() if seg > 0 and abs(s - 1 - step) <= self.restart_window]
        return near[0] if near else None

    def _check(self, run: RunData, cks: list[dict[str, Any]], counter: str) -> dict[str, Any] | None:
        prev: tuple[int, int] | None = None  # (step, offset)
        for c in cks:
            val = (c.get("optimizer") or {}).get("step") if counter == "optimizer" else \
                (c.get("scheduler") or {}).get("last_epoch")
            if not isinstance(val, (int, float)) or isinstance(val, bool):
                continue
            step, off = int(c["step"]), int(c["step"]) - int(val)
            ref_step, ref_off = prev if prev is not None else (0, 0)
            allowed = self.tolerance + _skipped_between(run, ref_step, step)
            jump = off - ref_off
            if abs(jump) > allowed:
                resume = step - int(val)
                restart = self._restart_near(run, resume)
                if prev is not None or restart is not None:
                    return {"checkpoint": c.get("path"), "step": step, "counter": counter, "value": int(val),
                            "offset": off, "previous_offset": ref_off, "previous_checkpoint_step": prev and prev[0],
                            "rebuilt_at_step": resume, "restart_logged_at": restart}
                return None  # inconsistent from the first checkpoint with no restart: not a step counter
            prev = (step, off)
        return None

    def detect(self, run: RunData) -> list[Finding]:
        """At most one finding: the first checkpoint whose saved counters show a lost state."""
        cks = sorted((c for c in run.meta.get("checkpoints") or []
                      if c.get("step") is not None and c.get("step_source") in ("name", "trainer_state")),
                     key=lambda c: c["step"])
        if not cks:
            return []
        opt = self._check(run, cks, "optimizer")
        sch = self._check(run, cks, "scheduler")
        hit = opt or sch
        if hit is None:
            return []
        cause, mech = ((Cause.STATE_NOT_RESTORED, Mechanism.OPTIMIZER_STATE) if opt
                       else (Cause.LR_SCHEDULE_RESET, Mechanism.RESET_TO_INITIAL))
        step = max(int(hit["rebuilt_at_step"]) + 1, 0)
        what = "optimizer step" if hit["counter"] == "optimizer" else "scheduler last_epoch"
        conf = self.confidence if hit["restart_logged_at"] is not None else self.confidence_restart_not_logged
        also = f"; the scheduler's last_epoch is off too ({sch['value']})" if opt and sch else ""
        return [self.finding(
            cause=cause, mechanism=mech, step=step, segment=_segment(run, step, hit), confidence=conf,
            severity=Severity.HIGH,
            message=f"checkpoint {hit['checkpoint']} (step {hit['step']}) saved {what} {hit['value']}: the state was "
            f"rebuilt at step {hit['rebuilt_at_step']}"
            + (f" where the logs restart (step {hit['restart_logged_at']})" if hit["restart_logged_at"] is not None
               else "") + f", not restored on resume{also}.",
            evidence={"optimizer": opt, "scheduler": sch},
        )]


def _segment(run: RunData, step: int, hit: dict[str, Any]) -> int:
    """The segment of the onset: the one the logged restart began (the resumed attempt), else the logged step's."""
    restart = hit["restart_logged_at"]
    if restart is not None:
        for seg, start in run.segment_starts().items():
            if seg > 0 and start == restart:
                return seg
    return checkpoint_segment(run, step)
