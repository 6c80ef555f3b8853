"""PR01 precursor.drift: a slow rise of grad norm, update ratio or parameter norm before a failure.

Rule: when the run fails (a loss or grad norm that turns non-finite for good, or a loss
departure that never recovers), the last ``lookback`` logged points before the failure are
searched for a sustained rise above the trend of their own first half (Theil-Sen baseline,
5 robust sigmas and ``min_rise`` (10%), held for 90% of the remaining points), that grows at least
``min_growth`` (1.5x) from its start to the failure (the slow grad-norm drift of late training
under a decaying lr stays below that: measured on the labelled corpus). Trailing-window
z-scores miss such ramps because the ramp inflates its own window's spread. Update norms lead
grad norms and grad norms lead the loss (DESIGN.md section 4; BLOOM tr11 chronicles; Takase et
al. 2023, "Spike No More": spikes follow sudden grad-norm growth), so a precursor ramp puts the
onset at its start and argues against a bad batch.

Source: docs/detectors.md#pr01 (the thresholds, where each comes from, the published reports).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from forensics.detectors.base import Detector, fmt, segment_at
from forensics.facts import RunFacts, run_facts
from forensics.model import Cause, Finding, Mechanism, RunData, Severity
from forensics.stats import mad_sigma, sustained_rise

_PRECURSORS = ("update_ratio", "grad_norm", "param_norm", "attn_logit_max", "output_logit_max")
HINGE_MIN_POINTS = 10
"""Fewest positive points for the broken-stick fit (our choice: a line and a knee need some support each)."""
HINGE_MIN_CANDIDATES = 3
"""Fewest candidate knees before the detection step (our choice)."""
HINGE_CANDIDATES = 400
"""Most candidate knees tried, evenly spaced (budget by design, docs/detectors.md#budget: one least-squares
fit per candidate; 400 places the knee to within 1/400 of the window, our choice)."""
HINGE_MIN_BASELINE = 5
"""Fewest points of the pre-knee Theil-Sen trend (our choice)."""


def hinge_onset(steps: np.ndarray, values: np.ndarray, detected: int) -> int | None:
    """Where the ramp starts: the knee t of a broken-stick fit y = a + b*s + c*max(0, s - t) on log values.

    Threshold detection fires only once the ramp clears the noise; the least-squares knee over
    candidates up to the detection step locates its start (a standard segmented regression), then
    the onset is the first point from the knee on after which every point up to the detection sits
    more than one robust sigma above the pre-knee trend (so a noisy knee never claims too early).

    Args:
        steps: int array (n,), increasing.
        values: positive float array (n,).
        detected: step at which the rise was detected; candidates are the steps before it.

    Returns:
        The knee step, or None when the fit is not possible.
    """
    ok = np.isfinite(values) & (values > 0)
    x, y = np.asarray(steps, float)[ok], np.log(np.asarray(values, float)[ok])
    cands = np.flatnonzero(x <= detected)
    if x.size < HINGE_MIN_POINTS or cands.size < HINGE_MIN_CANDIDATES:
        return None
    cands = cands[: max(0, cands.size - 1)]
    if cands.size > HINGE_CANDIDATES:
        cands = cands[np.linspace(0, cands.size - 1, HINGE_CANDIDATES).astype(int)]
    best_t, best_sse = None, np.inf
    base = np.column_stack([np.ones_like(x), x - x[0]])
    for i in cands:
        a = np.column_stack([base, np.maximum(0.0, x - x[i])])
        coef, *_ = np.linalg.lstsq(a, y, rcond=None)
        if coef[2] <= 0:
            continue
        sse = float(np.sum((y - a @ coef) ** 2))
        if sse < best_sse:
            best_t, best_sse = int(x[i]), sse
    if best_t is None:
        return None
    # from the knee on, the first point after which every point up to the detection is above the noise
    from scipy.stats import theilslopes

    half = max(HINGE_MIN_BASELINE, int(np.searchsorted(x, best_t)))
    fit = theilslopes(y[:half], x[:half])
    resid = y - (fit.intercept + fit.slope * x)
    sigma = mad_sigma(resid[:half])
    k0, k1 = int(np.searchsorted(x, best_t)), int(np.searchsorted(x, detected, side="right"))
    above = resid > sigma
    below = np.flatnonzero(~above[k0:k1])  # the onset: the first point from which all up to the detection are above
    k = k0 + (int(below[-1]) + 1 if below.size else 0)
    return int(x[k]) if k < k1 else best_t


@dataclass(frozen=True)
class PrecursorDrift(Detector):
    """Sustained growth of an optimiser signal in the steps before a failure."""

    code = "PR01"
    name = "precursor.drift"
    uses_facts = True
    requires = _PRECURSORS
    lookback: int = 2000
    min_rise: float = 0.10
    min_growth: float = 1.5
    min_points: int = 24
    baseline_frac: float = 0.5
    k_sigma: float = 5.0
    min_run: int = 5
    hold_frac: float = 0.9
    confidence: float = 0.6

    def detect(self, run: RunData, facts: RunFacts | None = None) -> list[Finding]:
        """At most one finding: the earliest precursor ramp before the failure."""
        fail = (facts or run_facts(run)).failure_step
        if fail is None:
            return []
        best = None
        for m in _PRECURSORS:
            s = run.series(m)
            if s is None:
                continue
            sel = np.flatnonzero(s.steps < fail)[-self.lookback:]
            if sel.size < self.min_points:
                continue
            d = sustained_rise(s.steps[sel], s.values[sel], log=True, baseline_frac=self.baseline_frac,
                               k_sigma=self.k_sigma, min_rel=self.min_rise, min_run=self.min_run,
                               hold_frac=self.hold_frac)
            if d is None or d.slope_after <= 0 or d.growth < self.min_growth:
                continue
            knee = hinge_onset(s.steps[sel], s.values[sel], d.onset_step)
            onset = knee if knee is not None else d.onset_step
            if best is None or onset < best[0]:
                best = (onset, m, d, s)
        if best is None:
            return []
        step, m, d, s = best
        return [self.finding(
            cause=Cause.UPDATE_SCALE_GROWTH, mechanism=Mechanism.LR_TOO_HIGH, step=step, segment=segment_at(s, step),
            confidence=self.confidence, severity=Severity.HIGH,
            message=f"{m} ramps up from step {step} (trend {fmt(d.baseline)}, x{d.growth:.3g} by the failure at "
            f"step {fail}): the failure has a precursor.",
            evidence={"metric": m, "onset_step": step, "failure_step": fail, "trend_at_onset": d.baseline,
                      "growth": d.growth, "log_slope_per_step": d.slope_after},
        )]
