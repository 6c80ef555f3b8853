"""WU01 lr.warmup_instability: loss spikes while the lr is still warming up to its peak.

Rule (docs/detectors.md#wu01, warm-up-end / peak-LR instability; BigScience tr8 and tr1-13B glitches
near the ramp end; Wortsman et al. 2023, arXiv 2309.14322: too-high lr shows first as
instability early in training): during the warm-up (the lr rising, up to ``after_peak`` (1.5x)
times the step where it peaks), a logged loss at least ``min_jump`` (1.3x) above the lowest loss
seen so far, after the loss had already fallen by ``min_fall`` (25%) from its first value. The
trailing-window spike test cannot judge these points (too little history); the running minimum
can, because the early loss falls monotonically in a healthy run. A peak lr too high for the
model is the usual reason; the trial is a lower peak lr with a longer warm-up.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from forensics.detectors.base import Detector, fmt
from forensics.model import Finding, RunData


@dataclass(frozen=True)
class WarmupInstability(Detector):
    """Loss spikes during the lr warm-up: the peak lr is too high for this model."""

    code = "WU01"
    name = "lr.warmup_instability"
    requires = ("loss", "lr")
    requires_all = True
    min_jump: float = 1.3
    min_fall: float = 0.25
    after_peak: float = 1.5
    min_spikes: int = 1

    def detect(self, run: RunData) -> list[Finding]:
        """At most one finding at the first warm-up spike, with all of them as evidence."""
        loss, lr = run.series("loss"), run.series("lr")
        if loss is None or lr is None or len(loss) < 10 or len(lr) < 5:
            return []
        lv = np.where(np.isfinite(lr.values), lr.values, np.nan)
        if not np.isfinite(lv).any() or np.nanmax(lv) <= 0:
            return []
        i_peak = int(np.nanargmax(lv))
        peak_step = int(lr.steps[i_peak])
        if i_peak < 3 or lv[0] >= 0.5 * lv[i_peak]:
            return []  # no warm-up in this log (or it starts mid-run)
        end = lr.steps[0] + self.after_peak * (peak_step - lr.steps[0])
        sel = np.flatnonzero((loss.steps <= end) & np.isfinite(loss.values))
        if sel.size < 5:
            return []
        v, st = loss.values[sel], loss.steps[sel]
        run_min = np.minimum.accumulate(v)
        fallen = run_min <= v[0] * (1 - self.min_fall)
        spikes = [i for i in range(1, v.size) if fallen[i - 1] and v[i] >= self.min_jump * run_min[i - 1]]
        if len(spikes) < self.min_spikes:
            return []
        i0 = spikes[0]
        return [self.finding(
            cause="update_scale_growth", mechanism="lr_too_high", step=int(st[i0]), segment=int(loss.segments[sel][i0]),
            confidence=0.6, severity="medium",
            message=f"the loss jumps to {fmt(float(v[i0]))} at step {int(st[i0])} "
            f"(lowest so far {fmt(float(run_min[i0 - 1]))}) "
            + (f"while the lr is still warming up to its peak {fmt(float(lv[i_peak]))} at step {peak_step}"
               if int(st[i0]) <= peak_step else
               f"just after the lr reached its peak {fmt(float(lv[i_peak]))} at the end of the warm-up (step "
               f"{peak_step})")
            + (f"; {len(spikes)} such spikes" if len(spikes) > 1 else "") + ".",
            evidence={"spike_steps": [int(st[i]) for i in spikes[:20]], "peak_lr": float(lv[i_peak]),
                      "peak_step": peak_step, "loss_at_spike": float(v[i0]),
                      "running_min_before": float(run_min[i0 - 1])},
        )]
