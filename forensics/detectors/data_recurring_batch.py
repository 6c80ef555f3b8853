"""DB02 data.recurring_batch: loss spikes that recur at a constant period; the first of them is the onset.

Rule: a run with at least one full loss spike (SP01's threshold, robust z >= 6 against the trailing band)
whose loss also has excursions at a constant period, each one a local peak at least ``seed_z`` (4) noise
sigmas above its neighbours, at least ``min_repeats`` (3) of them in a row, one of
them the full spike. The same data coming back (a corrupt shard read once per
epoch or per data-loader cycle, a bad sample repeated by a sampler) gives such a series, and the *first*
occurrence is the onset even when it was too small to pass the spike threshold on its own: early in training,
when the loss falls fast, a repeat of the batch that later spikes by 6 sigmas may sit only a few sigmas above
the trend. Once the period is known, the occurrences before the first seed are looked for at the predicted
steps with the lower ``extend_z`` (3, the back-tracking threshold of docs/detectors.md#conventions).

The series must be unlikely by chance: the expected number of series as long that chance would line up among
the run's candidates (:func:`chance_series`) is at most ``max_chance`` (0.05, our choice); a long, spiky run
lines up three or four noise peaks at some period, a recurring batch stands out.

The excursion of a point is measured against its neighbours on BOTH sides (the median of the
``NEIGHBOURS`` logged points before and after, log loss), in units of the point-to-point noise (the robust
sigma of first differences of the log loss over the whole run, divided by sqrt 2): a post-mortem reads the
whole log, and a centred comparison is unbiased by the trend that hides an early spike from a trailing one.
Only runs that already hold a full spike are read: the detector moves the onset of a recurring series to
its first occurrence. Recurring spikes are not transient: a series of ``persistent_repeats`` (4) or more
occurrences is reported as not recovered (the run meets the same data again next cycle); three in a row can
be chance on a long, spiky run, so a shorter series leaves the verdict (transient or anomaly) to the spikes.

Source: docs/detectors.md#db02 (PaLM, Chowdhery et al. 2022, section 5.1: spikes tied to specific batches;
BLOOM 176B chronicles: spikes recurring with the data; the thresholds are our choice, stated there).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from forensics.detectors.base import Detector, segment_at
from forensics.model import Cause, Finding, Mechanism, RunData, Severity
from forensics.signals import SPIKE_Z, zscores
from forensics.stats import MAD_TO_SIGMA

NEIGHBOURS = 3
"""Logged points on each side whose median a point is compared with (our choice: wide enough to ignore the
point itself and one neighbour that shares its excursion, narrow enough to follow the early trend)."""
DIFF_NOISE = np.sqrt(2.0)
"""A first difference of two independent points has sqrt 2 times the noise of one."""
SIGMA_FLOOR = 1e-6
"""Noise floor in log units (a loss logged with few digits can have a zero MAD of differences)."""
MAX_ANCHORS = 32
"""Full spikes a series is anchored on, in step order (a diverging loss has thousands; the first ones carry the
onset; bounds the work to MAX_ANCHORS x candidates)."""
LISTED_STEPS = 8
"""Occurrences named in the message (all of them are in the evidence)."""


@dataclass(frozen=True)
class RecurringBatch(Detector):
    """Loss excursions at a constant period that include a full spike: the earliest one is the onset."""

    code = "DB02"
    name = "data.recurring_batch"
    requires = ("loss",)
    seed_z: float = 4.0
    extend_z: float = 3.0
    min_repeats: int = 3
    min_period_points: int = 10
    max_other_seeds: float = 1.0
    period_tol_points: float = 1.0
    persistent_repeats: int = 4
    max_chance: float = 0.05
    confidence: float = 0.8

    def detect(self, run: RunData) -> list[Finding]:
        """At most one finding: the recurring series, at the step of its first occurrence."""
        zs = zscores(run, "loss")
        if zs is None:
            return []
        s, lx, z, _med = zs
        if not np.any(np.isfinite(z) & (z >= SPIKE_Z)):
            return []
        c = centred_excursion(lx, NEIGHBOURS)
        steps = s.steps.astype(np.int64)
        c[_segment_starts(s.segments)] = np.nan  # a jump at a resume is the resume's, not a recurring batch
        interval = float(np.median(np.diff(steps))) if steps.size > 1 else 1.0
        series = self._progression(steps, c, z, interval)
        if series is None:
            return []
        idx, period = series
        first = int(steps[idx[0]])
        found = [int(steps[i]) for i in idx]
        after = idx[-1] + 1  # every occurrence is a local peak: the loss is back at the next logged point
        recovered = int(steps[after]) if after < steps.size and np.isfinite(lx[after]) else None
        if len(found) >= self.persistent_repeats:  # a fault that keeps coming back is not transient
            recovered = None
        return [self.finding(
            cause=Cause.DATA_BATCH, mechanism=Mechanism.BAD_BATCH, step=first, segment=segment_at(s, first),
            confidence=self.confidence, severity=Severity.MEDIUM,
            message=f"loss excursions recur every ~{period:g} steps ({len(found)} times: steps "
            f"{', '.join(map(str, found[:LISTED_STEPS]))}{'...' if len(found) > LISTED_STEPS else ''}), "
            f"one of them a full spike: the same data comes back; the first occurrence, step {first}, is the onset.",
            evidence={"steps": found, "period": period,  # forensics.engine.keys.RECURRING_STEPS / _PERIOD
                      "excursion_sigmas": [round(float(c[i]), 2) for i in idx], "onset_step": first,
                      "recovered_step": recovered},  # keys.RECOVERED_STEP: None once it recurs persistent_repeats
        )]

    def _progression(self, steps: np.ndarray, c: np.ndarray, z: np.ndarray,
                     interval: float) -> tuple[list[int], float] | None:
        """The longest series at a constant period through a full spike (seeds set the period, gaps filled)."""
        seeds = _peaks(c, self.seed_z)
        if seeds.size < self.min_repeats:
            return None
        steps = steps.astype(np.float64)  # searched with float steps: one conversion, not one per search
        tol = self.period_tol_points * interval
        best: list[int] = []
        for f in seeds[z[seeds] >= SPIKE_Z][:MAX_ANCHORS]:  # the series must hold a full spike: anchor on one
            d = (steps[seeds] - steps[f]).astype(np.float64)
            ok = np.abs(d) >= self.min_period_points * interval
            third = _hits(steps, c, steps[f] + 2 * d, tol, self.extend_z) | _hits(steps, c, steps[f] - d, tol,
                                                                                  self.extend_z)
            for period in np.unique(np.abs(d[ok & third])):
                series = _walk(steps, c, int(f), -period, tol, self.extend_z)[::-1] + \
                    _walk(steps, c, int(f), period, tol, self.extend_z)[1:]
                if len(series) > len(best) and self._stands_out(seeds, series):
                    best = series
        if len(best) < self.min_repeats:
            return None
        if chance_series(seeds.size, float(steps[-1] - steps[0]), tol, len(best)) > self.max_chance:
            return None
        return best, float(np.median(np.diff(steps[best])))

    def _stands_out(self, seeds: np.ndarray, members: list[int]) -> bool:
        """True when the series stands out from the noise.

        Other seeds inside its span are at most ``max_other_seeds`` per member: a jagged loss with a peak every
        few points matches any period by chance.
        """
        inside = int(np.count_nonzero((seeds >= members[0]) & (seeds <= members[-1])))
        return inside - len(members) <= self.max_other_seeds * len(members)


def chance_series(n_seeds: int, span_steps: float, tol_steps: float, length: int) -> float:
    """Expected number of series of ``length`` occurrences that chance alone would line up among the seeds.

    Every pair of seeds sets a period; each further occurrence falls, by chance, in the ``2 tol + 1`` steps
    around its predicted step with probability ``rho x (2 tol + 1)``, rho the seeds per step. So the
    expectation is ``pairs x (rho (2 tol + 1)) ** (length - 2)``: a long, spiky run (many seeds) lines up three
    or four of them by chance, a short run with a handful of seeds does not.

    Args:
        n_seeds: Candidate excursions in the run.
        span_steps: Steps from the first to the last logged point.
        tol_steps: Tolerance around a predicted step, in steps.
        length: Occurrences in the series.
    """
    if n_seeds < 2 or span_steps <= 0:
        return float("inf")
    pairs = n_seeds * (n_seeds - 1) / 2
    hit = min(1.0, n_seeds / span_steps * (2 * tol_steps + 1))
    return pairs * hit ** max(length - 2, 0)


def _segment_starts(segments: np.ndarray) -> np.ndarray:
    """Indices where the segment changes (the first point of every segment after the first)."""
    seg = np.asarray(segments)
    return np.flatnonzero(seg[1:] != seg[:-1]) + 1 if seg.size > 1 else np.array([], dtype=np.int64)


def centred_excursion(lx: np.ndarray, k: int) -> np.ndarray:
    """Excursion of each point above the median of its ``k`` neighbours on each side, in noise sigmas.

    Args:
        lx: Log values, shape (n,); NaN where not finite.
        k: Neighbours on each side.

    Returns:
        Shape (n,): ``(lx - median(neighbours)) / sigma``, sigma the robust sigma of first differences divided
        by sqrt 2 (floored at ``SIGMA_FLOOR``); NaN where a side has no finite neighbour or the point is not finite.
    """
    n = lx.shape[0]
    out = np.full(n, np.nan)
    ok = np.isfinite(lx)
    if ok.sum() < 2 * k + 1:
        return out
    d = np.diff(lx[ok])
    sigma = max(MAD_TO_SIGMA * float(np.median(np.abs(d - np.median(d)))) / DIFF_NOISE, SIGMA_FLOOR)
    pad = np.concatenate([np.full(k, np.nan), lx, np.full(k, np.nan)])
    cols = [pad[j:j + n] for j in range(2 * k + 1) if j != k]  # the neighbours, as views (no (n, 2k) copy)
    fin = [np.isfinite(c) for c in cols]
    has = np.logical_or.reduce(fin[:k]) & np.logical_or.reduce(fin[k:])
    full = np.logical_and.reduce(fin)
    with np.errstate(all="ignore"):
        med = _median_of_six(cols) if 2 * k == SIX and n else np.median(np.stack(cols, axis=1), axis=1)
        part = np.flatnonzero(has & ~full)  # a side holds a NaN: the median of the finite ones
        if part.size:
            med[part] = np.nanmedian(np.stack([c[part] for c in cols], axis=1), axis=1)
        out = np.where(ok & has, (lx - med) / sigma, np.nan)
    return out


SIX = 6
"""Neighbours (``2 * NEIGHBOURS``) whose median a sorting network takes (:func:`_median_of_six`)."""
_SIX = ((0, 5), (1, 3), (2, 4), (1, 2), (3, 4), (0, 3), (2, 5), (0, 1), (2, 3), (4, 5), (1, 2), (3, 4))
"""A sorting network of six values (12 compare-exchanges; Knuth, TAOCP vol. 3, 5.3.4)."""


def _median_of_six(cols: list[np.ndarray]) -> np.ndarray:
    """The median of six columns, row by row (shape (n,)): ``np.median(axis=1)``'s value where all six are finite.

    A sorting network over whole columns (24 vectorised min/max) instead of one partition per row (~5x faster
    at 1M points); ``(third + fourth) / 2`` as ``np.median`` takes the mean of the two middle values.
    """
    c = [x.copy() for x in cols]
    for i, j in _SIX:
        lo = np.minimum(c[i], c[j])
        np.maximum(c[i], c[j], out=c[j])
        c[i] = lo
    lower, upper = c[SIX // 2 - 1], c[SIX // 2]  # the two middle values of the sorted six
    return (lower + upper) / 2


def _peaks(c: np.ndarray, threshold: float) -> np.ndarray:
    """Indices of local peaks of ``c`` at or above ``threshold``."""
    with np.errstate(invalid="ignore"):
        left = np.concatenate([[-np.inf], c[:-1]])
        right = np.concatenate([c[1:], [-np.inf]])
        peak = np.isfinite(c) & (c >= threshold) & (c >= np.nan_to_num(left, nan=-np.inf)) \
            & (c >= np.nan_to_num(right, nan=-np.inf))
    return np.flatnonzero(peak)


def _hits(steps: np.ndarray, c: np.ndarray, at: np.ndarray, tol: float, threshold: float) -> np.ndarray:
    """For each predicted step in ``at``: is a point within ``tol`` of it at ``threshold`` sigmas or more?"""
    at = np.asarray(at, dtype=np.float64)
    idx = np.searchsorted(steps, at)
    out = np.zeros(at.shape, dtype=bool)
    for k in (-1, 0, 1):  # tol is one log interval: the nearest points on either side are enough
        j = np.clip(idx + k, 0, steps.size - 1)
        with np.errstate(invalid="ignore"):
            out |= (np.abs(steps[j] - at) <= tol) & (c[j] >= threshold)
    return out


def _walk(steps: np.ndarray, c: np.ndarray, start: int, period: float, tol: float, threshold: float) -> list[int]:
    """``start`` and the occurrences at ``start + k x period`` (k = 1, 2, ...; ``period`` < 0 walks back).

    Each is the highest point within ``tol`` of the step predicted from the previous one, at ``threshold``
    sigmas or more; the walk ends at the first predicted step with none.
    """
    out = [start]
    at = float(steps[start])
    while True:
        at += period
        lo = int(np.searchsorted(steps, at - tol, side="left"))
        hi = int(np.searchsorted(steps, at + tol, side="right"))
        window = np.arange(lo, hi)
        window = window[np.isfinite(c[window])] if window.size else window
        if window.size == 0 or c[window].max() < threshold:
            return out
        i = int(window[np.argmax(c[window])])
        out.append(i)
        at = float(steps[i])
