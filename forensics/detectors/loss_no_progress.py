"""ST01 loss.no_progress: a run trained from the start whose loss never goes down.

Rule (docs/detectors.md#st01; smdebug ``LossNotDecreasing``): the log starts near step 0 (first
logged step <= ``max_first_step``), has at least ``min_points`` loss points, and the BEST level the loss
reached (the lowest median of its twentieths, ``head_parts``, each at least ``min_part_points``, 3, points) is
not below ``min_drop`` (2%) under its start (the first logged loss: the loss at initialisation, which a spike
in the first steps of warm-up does not raise, unlike a median over the first steps). A loss that went down
and later rose again (a divergence) did go down: that is the divergence detectors' finding, not this one. A run
from scratch always lowers its loss within a few hundred steps; one that does not is stuck
(lr of zero, frozen parameters, an optimizer that never steps, or a collapse to the uniform
prediction at a far too high lr). Late excerpts of long runs (first step beyond
``max_first_step``) are not judged: their loss is meant to be nearly flat.

Source: docs/detectors.md#st01 (the thresholds, where each comes from, the published reports).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from forensics.detectors.base import Detector, fmt
from forensics.model import Finding, RunData, Severity


@dataclass(frozen=True)
class NoProgress(Detector):
    """A from-scratch run whose loss never decreases."""

    code = "ST01"
    name = "loss.no_progress"
    requires = ("loss",)
    max_first_step: int = 100
    min_points: int = 50
    min_drop: float = 0.02
    head_parts: int = 20
    tail_parts: int = 10
    min_part_points: int = 3
    confidence: float = 0.7

    def detect(self, run: RunData) -> list[Finding]:
        """At most one finding, with the lr evidence that separates the likely reasons."""
        s = run.series("loss")
        if s is None or len(s) < self.min_points or int(s.steps[0]) > self.max_first_step:
            return []
        v = s.values[np.isfinite(s.values)]
        if v.size < self.min_points:
            return []
        part = max(self.min_part_points, v.size // self.head_parts)
        head = float(v[0])
        tail = float(np.median(v[-max(self.min_part_points, v.size // self.tail_parts):]))
        best = self._best_level(v, part)
        if best < head * (1 - self.min_drop):
            return []
        ev: dict[str, object] = {"loss_first": head, "loss_last": tail, "loss_best": best, "points": int(v.size)}
        lr = run.series("lr")
        hint = ""
        if lr is not None and len(lr):
            lv = lr.values[np.isfinite(lr.values)]
            if lv.size:
                ev["lr_max"] = float(lv.max())
                if float(lv.max()) == 0.0:
                    hint = "; the lr is zero throughout"
        return [self.finding(
            cause=None, mechanism=None, step=int(s.steps[0]), segment=int(s.segments[0]), confidence=self.confidence,
            severity=Severity.HIGH,
            message=f"the loss does not go down: {fmt(head)} at the start, at best {fmt(best)} (the lowest median "
            f"of a twentieth of the run), {fmt(tail)} at the end of {v.size} points{hint}.",
            evidence=ev,
        )]

    @staticmethod
    def _best_level(v: np.ndarray, part: int) -> float:
        """The lowest median over consecutive blocks of ``part`` finite losses (robust to single low points)."""
        n = v.size // part
        return float(np.min(np.median(v[: n * part].reshape(n, part), axis=1)))
