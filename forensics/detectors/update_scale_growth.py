"""UP01 update.scale_growth: the update ratio ||dW||/||W|| (or its size per unit lr) keeps growing.

Rule (docs/detectors.md#up01; Marin #1368: 2x update-norm spikes precede loss spikes; smdebug
``WeightUpdateRatio``): the update ratio leaves the trend of its early part for good and ends
at least ``min_growth`` (2x) above it. (Dividing by the lr is tempting because AdamW's update
scales with it, but under a decaying schedule ratio/lr rises in healthy runs: measured on
sample_logs/healthy.) Also a sustained rise of the
parameter norm. Without logged ratios the checkpoint readers provide them. The rises: ``ratio_k_sigma`` (4)
robust sigmas and ``ratio_min_rel`` (50%) above the early trend for the ratio, ``norm_k_sigma`` (5) and
``norm_min_rel`` (10%) for the norm; a loss that keeps improving (its late median below ``loss_better``, 95%,
of its early one) lowers the confidence to ``confidence_loss_improves`` (all ours, tuned on the corpus).

Source: docs/detectors.md#up01 (the thresholds, where each comes from, the published reports).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from forensics.detectors.base import Detector, fmt, segment_at
from forensics.model import Cause, Finding, Mechanism, RunData, Severity
from forensics.signals import loss_improves_after
from forensics.stats import sustained_rise

BASELINE_FLOOR = 1e-30
"""Floor of the trend value the growth is divided by: guards a zero baseline, far below any update ratio (ours)."""


@dataclass(frozen=True)
class UpdateScaleGrowth(Detector):
    """Sustained growth of the update ratio per unit lr (or of the parameter norm)."""

    code = "UP01"
    name = "update.scale_growth"
    requires = ("update_ratio", "param_norm")
    min_growth: float = 2.0
    min_points: int = 12
    ratio_k_sigma: float = 4.0
    ratio_min_rel: float = 0.5
    norm_k_sigma: float = 5.0
    norm_min_rel: float = 0.1
    loss_better: float = 0.95
    confidence: float = 0.6
    confidence_loss_improves: float = 0.35

    def detect(self, run: RunData) -> list[Finding]:
        """At most one finding for the earliest sustained growth."""
        found: list[tuple[int, str, dict[str, object], str]] = []
        ur = run.series("update_ratio")
        if ur is not None and len(ur) >= self.min_points:
            vals, what = ur.values, "update ratio"
            d = sustained_rise(ur.steps, vals, log=True, k_sigma=self.ratio_k_sigma, min_rel=self.ratio_min_rel)
            if d is not None and d.growth * (d.baseline and 1) >= 1.0 and (
                float(np.nanmax(vals[d.onset_index:])) / max(d.baseline, BASELINE_FLOOR) >= self.min_growth
            ):
                found.append((d.onset_step, what, {"metric": "update_ratio",
                              "baseline_at_onset": d.baseline, "max_after": float(np.nanmax(vals[d.onset_index:])),
                              "onset_step": d.onset_step}, "update_ratio"))
        pn = run.series("param_norm")
        if pn is not None and len(pn) >= self.min_points:
            d = sustained_rise(pn.steps, pn.values, log=True, k_sigma=self.norm_k_sigma, min_rel=self.norm_min_rel)
            if d is not None and d.slope_after > 0:
                found.append((d.onset_step, "parameter norm", {"metric": "param_norm", "baseline_at_onset": d.baseline,
                              "last": d.last, "onset_step": d.onset_step}, "param_norm"))
        if not found:
            return []
        step, what, ev, metric = min(found, key=lambda t: t[0])
        s = run.series(metric)
        base = ev.get("baseline_at_onset", float("nan"))
        against: tuple[str, ...] = ()
        conf = self.confidence
        better = loss_improves_after(run, step)
        only_norm = all(m == "param_norm" for *_, m in found)
        if better is not None and (only_norm or better[1] < self.loss_better * better[0]):
            # a parameter norm (or update ratio) that grows while the loss keeps falling is training, not divergence
            conf = self.confidence_loss_improves
            against = (f"the loss keeps improving after step {step} ({fmt(better[0])} -> {fmt(better[1])}): "
                       f"a growing {what} alone is not update-scale growth",)
        return [self.finding(
            cause=Cause.UPDATE_SCALE_GROWTH, mechanism=Mechanism.LR_TOO_HIGH, step=step, against=against,
            segment=segment_at(s, step) if s is not None else 0, confidence=conf, severity=Severity.MEDIUM,
            message=f"{what} rises above the trend of its early part from step {step} (trend {fmt(base)})"
            + ("" if len(found) == 1 else "; the parameter norm rises too") + ".",
            evidence=ev,
        )]
