"""DV01 loss.divergence: the loss turns upward and does not come back (no spike needed).

Rule (docs/detectors.md#dv01: slow divergence without spikes, BigScience 104B "non-spike
diverging", OPT 12.43 drift): after the minimum of the smoothed loss (rolling median of 9
points), the loss rises above that minimum by more than ``min_rise`` (relative, 5%) and
``k_sigma`` robust sigmas of its noise around the smoothed curve, and ends there. The onset is
the first point after which the smoothed loss never again comes within one noise sigma of its
minimum, moved on to the first logged point above the level before it (``onset_k_sigma``, 3 sigmas):
the centred median leans a few points early.

Source: docs/detectors.md#dv01 (the thresholds, where each comes from, the published reports).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from forensics.detectors.base import Detector, fmt, segment_at
from forensics.model import Finding, RunData, Severity
from forensics.stats import MAD_TO_SIGMA


@dataclass(frozen=True)
class LossDivergence(Detector):
    """A loss that rises from its minimum and stays up until the end of the log."""

    code = "DV01"
    name = "loss.divergence"
    requires = ("loss",)
    min_rise: float = 0.05
    k_sigma: float = 5.0
    smooth: int = 9
    min_points: int = 20
    onset_rel_band: float = 0.001
    min_tail_points: int = 5
    min_tail_share: float = 0.05
    confidence: float = 0.7
    onset_k_sigma: float = 3.0

    def detect(self, run: RunData) -> list[Finding]:
        """At most one finding with the onset of the final rise."""
        s = run.series("loss")
        if s is None or len(s) < self.min_points:
            return []
        v = s.values.copy()
        fin = np.isfinite(v)
        if fin.sum() < self.min_points:
            return []
        sm = pl.Series(np.where(fin, v, np.nan)).fill_nan(None).rolling_median(
            self.smooth, min_samples=max(1, self.smooth // 2), center=True).to_numpy()
        ok = np.isfinite(sm)
        if ok.sum() < self.min_points:
            return []
        resid = (v - sm)[fin & ok]
        noise = MAD_TO_SIGMA * float(np.nanmedian(np.abs(resid - np.nanmedian(resid)))) if resid.size else 0.0
        i_min = int(np.nanargmin(sm))
        # the raw turning point near the smoothed minimum (centred smoothing shifts a V's minimum)
        w = self.smooth
        win = np.where(fin[max(0, i_min - w): i_min + w + 1], v[max(0, i_min - w): i_min + w + 1], np.inf)
        i_raw = max(0, i_min - w) + int(np.argmin(win))
        lo = float(sm[i_min])
        band = lo + max(self.min_rise * abs(lo), self.k_sigma * noise)
        tail = sm[i_min:]
        last_ok = np.flatnonzero(np.isfinite(tail))
        if last_ok.size == 0 or tail[last_ok[-1]] <= band:
            return []
        # onset: the last time the smoothed loss was within [lo, lo + small] before rising for good
        within = np.flatnonzero(np.isfinite(tail) & (tail <= lo + max(noise, self.onset_rel_band * abs(lo))))
        start = max(i_min + (int(within[-1]) + 1 if within.size else 0), i_raw + 1)
        start = min(start, len(s) - 1)
        start = self._first_high(v, sm, noise, start)
        if len(s) - start < self.min_tail_points or (len(s) - i_min) < self.min_tail_share * len(s):
            return []
        step = int(s.steps[start])
        end = float(tail[last_ok[-1]])
        return [self.finding(
            cause=None, mechanism=None, step=step, segment=segment_at(s, step), confidence=self.confidence,
            severity=Severity.HIGH,
            message=f"loss rises from its minimum {fmt(lo)} (step {int(s.steps[i_min])}) to {fmt(end)} "
            f"and does not come back; the rise starts at step {step}.",
            evidence={"metric": "loss", "min_loss": lo, "min_step": int(s.steps[i_min]), "last_smoothed": end,
                      "rise": end - lo, "noise_sigma": noise, "onset_step": step},
        )]

    def _first_high(self, v: np.ndarray, sm: np.ndarray, noise: float, start: int) -> int:
        """The first logged point at or after ``start`` that leaves the level before it (its index into ``v``).

        ``start`` comes from the smoothed curve, which leans a few points early (a centred median sees the rise
        coming): the onset is moved to the first point, within :attr:`smooth` points, that is non-finite or above
        the smoothed level just before ``start`` by ``onset_k_sigma`` noise sigmas; ``start`` when none is.
        Only points at the old level are skipped, so a rise whose first point is already up keeps its onset.
        """
        if start < 1 or not np.isfinite(sm[start - 1]):
            return start
        level = float(sm[start - 1]) + self.onset_k_sigma * noise
        ahead = v[start:start + self.smooth]
        with np.errstate(invalid="ignore"):
            high = np.flatnonzero(~np.isfinite(ahead) | (ahead > level))
        return start + int(high[0]) if high.size else start
