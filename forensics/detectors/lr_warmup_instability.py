"""WU01 lr.warmup_instability: loss spikes while the lr is still warming up to its peak.

Rule (docs/detectors.md#wu01, warm-up-end / peak-LR instability; BigScience tr8 and tr1-13B glitches
near the ramp end; Wortsman et al. 2023, arXiv 2309.14322: too-high lr shows first as
instability early in training): during the warm-up (the lr rising, up to ``after_peak`` (1.5x)
times the step where it peaks), a logged loss at least ``min_jump`` (1.3x) above the lowest loss
seen so far, after the loss had already fallen by ``min_fall`` (25%) from its first value. The
trailing-window spike test cannot judge these points (too little history); the running minimum
can, because the early loss falls monotonically in a healthy run. The jump must also exceed
``noise_k`` (6) robust sigmas of the loss's own point-to-point noise, and a single point that the next
logged points leave at once is reported with low confidence (one noisy point is not an lr too
high). A peak lr too high for the model is the usual reason; the trial is a lower peak lr with a longer warm-up.

Source: docs/detectors.md#wu01 (the thresholds, where each comes from, the published reports).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from forensics.detectors.base import Detector, fmt
from forensics.model import Cause, Finding, Mechanism, RunData, Severity
from forensics.stats import TINY, mad_sigma


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
    noise_k: float = 6.0
    min_loss_points: int = 10
    min_lr_points: int = 5
    min_ramp_points: int = 3
    min_warmup_loss_points: int = 5
    min_noise_points: int = 8
    isolated_points: int = 3
    blow_ups_checked: int = 3
    confidence: float = 0.6
    isolated_confidence: float = 0.35
    blow_up_confidence: float = 0.65
    max_listed: int = 20

    def _blow_up(self, run: RunData, loss, lr, lv: np.ndarray, i_peak: int, peak_step: int,  # noqa: ANN001
                 end: float) -> list[Finding]:
        """A loss departure during the warm-up that never recovers (the loss had no time to fall 25% first)."""
        from forensics.signals import departures

        for d in departures(run, "loss", limit=self.blow_ups_checked):
            if d.onset_step > peak_step or d.onset_step > end or d.recovered_step is not None or d.nonfinite:
                continue
            k = int(np.searchsorted(lr.steps, d.onset_step))
            frac = float(lv[min(k, len(lv) - 1)] / lv[i_peak])
            # the departure from healthy behaviour starts where the loss stopped falling: the step after its
            # last new low before the blow-up
            pre = np.flatnonzero((loss.steps < d.step) & np.isfinite(loss.values))
            onset = d.onset_step
            if pre.size >= 2:
                j = int(pre[np.argmin(loss.values[pre])])
                if j + 1 < len(loss) and int(loss.steps[j + 1]) < onset:
                    onset = int(loss.steps[j + 1])
            return [self.finding(
                cause=Cause.UPDATE_SCALE_GROWTH, mechanism=Mechanism.LR_TOO_HIGH, step=onset,
                segment=int(loss.segments[min(d.index, len(loss) - 1)]), confidence=self.blow_up_confidence,
                severity=Severity.HIGH,
                message=f"the loss blows up to {fmt(d.value)} at step {d.step} and never recovers while the lr is "
                f"still warming up ({frac:.0%} of its peak {fmt(float(lv[i_peak]))} at step {peak_step}): the "
                "lr ramp reaches a step size the model cannot take.",
                evidence={"blow_up_step": d.step, "onset_step": d.onset_step, "loss": d.value,
                          "trailing_median": d.baseline, "lr_fraction_of_peak": frac, "peak_lr": float(lv[i_peak]),
                          "peak_step": peak_step},
            )]
        return []

    def detect(self, run: RunData) -> list[Finding]:
        """At most one finding at the first warm-up spike, with all of them as evidence."""
        loss, lr = run.series("loss"), run.series("lr")
        if loss is None or lr is None or len(loss) < self.min_loss_points or len(lr) < self.min_lr_points:
            return []
        lv = np.where(np.isfinite(lr.values), lr.values, np.nan)
        if not np.isfinite(lv).any() or np.nanmax(lv) <= 0:
            return []
        i_peak = int(np.nanargmax(lv))
        peak_step = int(lr.steps[i_peak])
        if i_peak < self.min_ramp_points or lv[0] >= 0.5 * lv[i_peak]:
            return []  # no warm-up in this log (or it starts mid-run)
        end = lr.steps[0] + self.after_peak * (peak_step - lr.steps[0])
        sel = np.flatnonzero((loss.steps <= end) & np.isfinite(loss.values))
        if sel.size < self.min_warmup_loss_points:
            return []
        v, st = loss.values[sel], loss.steps[sel]
        run_min = np.minimum.accumulate(v)
        fallen = run_min <= v[0] * (1 - self.min_fall)
        # the loss's own point-to-point noise (log scale): a jump must stand out of it, not only be 1.3x
        lg = np.log(np.clip(loss.values[np.isfinite(loss.values)], TINY, None))
        dl = np.diff(lg)
        noise = mad_sigma(dl) / np.sqrt(2) if dl.size >= self.min_noise_points else 0.0
        thr = max(float(np.log(self.min_jump)), self.noise_k * noise)
        with np.errstate(all="ignore"):  # every point against the running minimum before it, whole column
            spikes = (np.flatnonzero(fallen[:-1] & (np.log(v[1:] / run_min[:-1]) >= thr)) + 1).tolist()
        if len(spikes) < self.min_spikes:
            return self._blow_up(run, loss, lr, lv, i_peak, peak_step, end)
        i0 = spikes[0]
        # one point that returns at once is noise, not an lr too high for the model
        nxt = v[i0 + 1:i0 + 1 + self.isolated_points]
        half = run_min[i0 - 1] * np.exp(0.5 * np.log(v[i0] / run_min[i0 - 1]))
        # (after the peak only: during the ramp a spike is the lr's until shown otherwise)
        isolated = len(spikes) == 1 and nxt.size >= 2 and bool(np.all(nxt < half)) and int(st[i0]) > peak_step
        # where the loss is back under half the jump (on the whole series): the spike's own recovery
        after = np.flatnonzero((loss.steps > st[i0]) & np.isfinite(loss.values) & (loss.values < half))
        recovered = int(loss.steps[after[0]]) if after.size else None
        against = (f"one point at step {int(st[i0])} that the next logged points leave at once: noise of a run "
                   "whose loss keeps falling, not a peak lr too high",) if isolated else ()
        return [self.finding(
            cause=Cause.UPDATE_SCALE_GROWTH, mechanism=Mechanism.LR_TOO_HIGH, step=int(st[i0]),
            segment=int(loss.segments[sel][i0]),
            confidence=self.isolated_confidence if isolated else self.confidence,
            severity=Severity.LOW if isolated else Severity.MEDIUM,
            against=against,
            message=f"the loss jumps to {fmt(float(v[i0]))} at step {int(st[i0])} "
            f"(lowest so far {fmt(float(run_min[i0 - 1]))}) "
            + (f"while the lr is still warming up to its peak {fmt(float(lv[i_peak]))} at step {peak_step}"
               if int(st[i0]) <= peak_step else
               f"just after the lr reached its peak {fmt(float(lv[i_peak]))} at the end of the warm-up (step "
               f"{peak_step})")
            + (f"; {len(spikes)} such spikes" if len(spikes) > 1 else "") + ".",
            evidence={"spike_steps": [int(st[i]) for i in spikes[:self.max_listed]], "peak_lr": float(lv[i_peak]),
                      "peak_step": peak_step, "loss_at_spike": float(v[i0]),
                      "running_min_before": float(run_min[i0 - 1]), "recovered_step": recovered},
        )]
