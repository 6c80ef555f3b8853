"""WU01 lr.warmup_instability: loss spikes while the lr is still warming up to its peak.

Rule (docs/detectors.md#wu01, warm-up-end / peak-LR instability; BigScience tr8 and tr1-13B glitches
near the ramp end; Wortsman et al. 2023, arXiv 2309.14322: too-high lr shows first as
instability early in training): during the warm-up (up to ``after_peak`` (1.5x) times the step where
the lr peaks), once the loss has fallen ``min_fall`` (25%) from its first value, a loss at least
``min_jump`` (1.3x) and ``noise_k`` (6) noise sigmas above its robust level (the median of the
``level_points`` losses before it; the noise is the loss's point-to-point noise), that persists (the next
``hold_points`` stay up) or comes with its mechanism (a grad-norm jump at the same step), or, without a
grad norm, comes while the lr still rises; or a level shift held ``shift_points`` points. One noisy point
against a lucky low batch is neither (user test U9). The trial is a lower peak lr with a longer warm-up.

Source: docs/detectors.md#wu01 (the thresholds, where each comes from, the published reports).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from forensics.detectors.base import Detector, fmt
from forensics.model import Cause, Finding, Mechanism, RunData, Severity
from forensics.stats import mad_sigma


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
    noise_k: float = 6.0
    level_points: int = 4
    min_level_points: int = 3
    hold_points: int = 3
    grad_jump: float = 2.0
    grad_k: float = 2.0
    grad_window: int = 2
    shift_points: int = 20
    min_shift: float = 1.1
    shift_k: float = 2.0
    min_loss_points: int = 10
    min_lr_points: int = 5
    min_ramp_points: int = 3
    min_warmup_loss_points: int = 5
    min_noise_points: int = 8
    blow_ups_checked: int = 3
    confidence: float = 0.6
    ramp_confidence: float = 0.55
    blow_up_confidence: float = 0.65
    max_listed: int = 20
    max_nonpositive: float = 0.05

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

    def _level(self, lg: np.ndarray) -> np.ndarray:
        """The loss's robust level before each point: the median of the ``level_points`` finite points before it."""
        w = self.level_points
        win = sliding_window_view(np.concatenate([np.full(w, np.nan), lg]), w)[:lg.size]
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            m = np.nanmedian(win, axis=1)
        return np.where(np.isfinite(win).sum(axis=1) >= self.min_level_points, m, np.nan)

    def _grad_jump(self, run: RunData, step: int) -> tuple[int, float] | None:
        """The grad norm jumping with the loss (within ``grad_window`` steps): the update-scale mechanism."""
        prep = self._grad_prep(run)
        if prep is None:
            return None
        g, glg, gthr = prep
        near = np.flatnonzero(np.abs(g.steps - step) <= self.grad_window)
        if not near.size:
            return None
        lo = max(int(near[0]) - self.level_points, 0)  # the levels of these points need only the points before
        gm = self._level(glg[lo:int(near[-1]) + 1])
        for k in near:
            if np.isfinite(glg[k]) and np.isfinite(gm[k - lo]) and glg[k] - gm[k - lo] >= gthr:
                return int(g.steps[k]), float(np.exp(glg[k] - gm[k - lo]))
        return None

    def _grad_prep(self, run: RunData) -> tuple | None:
        """The grad norm, its log and its jump threshold (made once per run: :meth:`_grad_jump` asks per jump)."""
        g = run.series("grad_norm")
        if g is None or len(g) < self.min_level_points + 1:
            return None
        return run.cached("WU01.grad_log", lambda: self._grad_log(g))

    def _grad_log(self, g) -> tuple:  # noqa: ANN001
        """``(series, log grad norm (NaN where not finite or <= 0), the jump threshold in log units)``."""
        glg = np.log(np.where(np.isfinite(g.values) & (g.values > 0), g.values, np.nan))
        d = np.diff(glg[np.isfinite(glg)])
        gthr = max(float(np.log(self.grad_jump)), self.grad_k * mad_sigma(d) / np.sqrt(2) if d.size else 0.0)
        return g, glg, gthr

    def _first(self, run: RunData, lg: np.ndarray, st: np.ndarray, sg: np.ndarray, fallen: np.ndarray,
               noise: float, peak_step: int) -> tuple[int, str, list[int]] | None:
        """The first confirmed warm-up instability: (index, how it was confirmed, the jump indices)."""
        fell = np.flatnonzero(fallen)
        if not fell.size:
            return None  # every test below asks for a fallen point within the warm-up window
        # nothing after the last fallen point (+ one shift window) can change a result: the medians stop there
        cut = min(lg.size, int(fell[-1]) + self.shift_points + 1)
        lg, sg, fallen = lg[:cut], sg[:cut], fallen[:cut]
        m = self._level(lg[:int(fell[-1]) + 1])
        thr = max(float(np.log(self.min_jump)), self.noise_k * noise)
        with np.errstate(all="ignore"):
            jumps = np.flatnonzero(fallen[:m.size] & (lg[:m.size] - m >= thr))
        hits: list[tuple[int, str]] = []
        for i in jumps.tolist():  # a jump must persist or come with its mechanism, never one noisy point
            nxt = lg[i + 1:i + 1 + self.hold_points]
            gj = self._grad_jump(run, int(st[i]))
            if nxt.size >= 2 and np.median(nxt) - m[i] >= 0.5 * thr:
                hits.append((i, "and stays up"))
                break
            if gj is not None:
                hits.append((i, f"with the grad norm x{gj[1]:.1f} at step {gj[0]}"))
                break
            if run.series("grad_norm") is None and int(st[i]) <= peak_step:
                hits.append((i, "while only the lr changes (no grad norm logged to confirm it)"))
                break
        h = self.shift_points  # a level shift held for h points: the median after against the median before
        if lg.size >= 2 * h:
            win = sliding_window_view(lg, h)
            med = np.median(win, axis=1)
            dlt = med[h:] - med[:-h]
            same = sg[2 * h - 1:] == sg[:lg.size - 2 * h + 1]
            shift = np.flatnonzero(same & fallen[h:lg.size - h + 1]
                                   & (dlt >= max(float(np.log(self.min_shift)), self.shift_k * noise)))
            if shift.size:  # the change point: the largest step of the median in the first run of hits
                block = shift[:int(np.argmax(np.diff(np.r_[shift, shift[-1] + 2]) > 1)) + 1]
                k = int(block[np.argmax(dlt[block])])
                hits.append((k + h, f"shift:{float(np.exp(dlt[k])):.2f}"))
        if not hits:
            return None
        i, how = min(hits)
        return i, how, [int(j) for j in jumps if j >= i]

    def detect(self, run: RunData) -> list[Finding]:
        """At most one finding at the first confirmed warm-up instability, with the later jumps as evidence."""
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
        early = np.isfinite(loss.values) & (loss.steps <= end)
        if early.any() and float(np.mean(loss.values[early] <= 0)) > self.max_nonpositive:
            return []  # no positive loss (an RL objective, a sum with a negative part): no log-scale test applies
        fin = np.flatnonzero(np.isfinite(loss.values) & (loss.values > 0))
        sel = fin[loss.steps[fin] <= end]
        if sel.size < self.min_warmup_loss_points:
            return []
        # the whole finite log from the start: the shift test looks past the window's end at its last points
        v, st, sg = loss.values[fin], loss.steps[fin], loss.segments[fin]
        lg = np.log(v)
        run_min = np.minimum.accumulate(v)
        fallen = np.r_[False, run_min[:-1] <= v[0] * (1 - self.min_fall)] & (st <= end)
        # the loss's own point-to-point noise (log scale): a jump must stand out of it, not only be 1.3x
        dl = np.diff(lg)
        noise = mad_sigma(dl) / np.sqrt(2) if dl.size >= self.min_noise_points else 0.0
        hit = self._first(run, lg, st, sg, fallen, noise, peak_step)
        if hit is None:
            return self._blow_up(run, loss, lr, lv, i_peak, peak_step, end)
        i0, how, jumps = hit
        level = (float(np.exp(self._level(lg[:i0 + 1])[i0])) if i0 >= self.min_level_points
                 else float(v[max(i0 - 1, 0)]))
        half = level * np.sqrt(float(v[i0]) / level) if v[i0] > level else float(v[i0])
        after = np.flatnonzero((loss.steps > st[i0]) & np.isfinite(loss.values) & (loss.values < half))
        recovered = int(loss.steps[after[0]]) if after.size else None
        spikes = sorted({int(st[i0]), *(int(st[j]) for j in jumps)})
        return [self.finding(
            cause=Cause.UPDATE_SCALE_GROWTH, mechanism=Mechanism.LR_TOO_HIGH, step=int(st[i0]),
            segment=int(sg[i0]), severity=Severity.MEDIUM,
            confidence=self.ramp_confidence if how.startswith("while only") else self.confidence,
            message=(f"the loss level steps up x{how.removeprefix('shift:')} at step {int(st[i0])} (the median of the "
                     f"{self.shift_points} points from there against the {self.shift_points} before) and stays up, "
                     if how.startswith("shift:") else
                     f"the loss jumps to {fmt(float(v[i0]))} at step {int(st[i0])} (its level before: "
                     f"{fmt(level)}) {how}, ")
            + (f"while the lr is still warming up to its peak {fmt(float(lv[i_peak]))} at step {peak_step}"
               if int(st[i0]) <= peak_step else
               f"just after the lr reached its peak {fmt(float(lv[i_peak]))} at the end of the warm-up (step "
               f"{peak_step})")
            + (f"; {len(spikes)} such jumps" if len(spikes) > 1 else "") + ".",
            evidence={"spike_steps": spikes[:self.max_listed], "peak_lr": float(lv[i_peak]),
                      "peak_step": peak_step, "loss_at_spike": float(v[i0]), "level_before": level,
                      "noise_sigma": noise, "recovered_step": recovered},
        )]
