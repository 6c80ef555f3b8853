"""Growth before a loss departure in the logged activation magnitudes.

DB01 calls a loss departure a bad batch only when nothing departed before it. The grad norm is checked there;
this module checks the logged activation magnitudes (any name with ``absmax``, ``amax``, ``act_max`` ...; OV02
reads the same names), which grow into an fp16 overflow and have no growth detector of their own. The other
growth series (update ratio, parameter norm, attention and output logits) have theirs (UP01, PR01, AT01, OL01),
whose earlier findings the engine already counts as precursors of a spike
(:func:`forensics.engine.rules.family_hypotheses`); they also grow by design early in training. Only the window
before the departure is read (a slice per series: cheap for hundreds of per-layer series).

A series is a precursor when its largest value in the last ``lead`` logged points before the departure is
:data:`GROWTH_Z` robust sigmas (log scale) and :data:`GROWTH_FACTOR` times above the median of the first half
of the trailing window (a growth that started within the window does not raise its own baseline; PR01 judges
a ramp against its first half too): a departure in the project's sense (docs/detectors.md#conventions) that
is also a real growth, not noise on a flat series.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from forensics.model import RunData
from forensics.signals import MIN_WINDOW_POINTS, ONSET_Z, SIGMA_FLOOR, SPIKE_Z
from forensics.stats import mad_sigma, to_log

ACT_WORDS = ("absmax", "abs_max", "max_abs", "amax", "act_max", "activation_max", "actmax")
"""Activation-magnitude name parts (the same as OV02's, docs/detectors.md#ov02)."""
GROWTH_Z = SPIKE_Z
"""A precursor departs by the spike threshold (6 robust sigmas, OLMo-core; docs/detectors.md#conventions)."""
GROWTH_FACTOR = 1.5
"""...and grows at least 1.5x over its trailing median (PR01's ``min_growth``, docs/detectors.md#pr01)."""


@dataclass(frozen=True)
class Growth:
    """One growth precursor: the series, the step it starts departing, its value there and just before the spike."""

    metric: str
    onset_step: int
    base: float
    value: float


def growth_metrics(run: RunData) -> list[str]:
    """The logged activation-magnitude series of ``run``."""
    return [m for m in run.metric_names if any(w in m.lower() for w in ACT_WORDS)]


def _one(run: RunData, metric: str, onset: int, window: int, lead: int) -> Growth | None:
    s = run.series(metric)
    if s is None or len(s) == 0:
        return None
    lo, hi = np.searchsorted(s.steps, [onset - window, onset])
    lx = to_log(s.values[lo:hi])
    ok = np.isfinite(lx)
    if ok.sum() < MIN_WINDOW_POINTS + lead:
        return None
    x, st = lx[ok], s.steps[lo:hi][ok]
    base, recent = x[:max(MIN_WINDOW_POINTS, (x.size - lead) // 2)], x[-lead:]  # the window's first half
    med = float(np.median(base))
    sig = max(mad_sigma(base), SIGMA_FLOOR)
    top = float(np.max(recent))
    if (top - med) / sig < GROWTH_Z or top - med < np.log(GROWTH_FACTOR):
        return None
    above = np.flatnonzero((x - med) / sig < ONSET_Z)  # back-track to where it was still in its band
    start = int(above[-1]) + 1 if above.size else 0
    return Growth(metric, int(st[min(start, x.size - 1)]), float(np.exp(med)), float(np.exp(top)))


def growth_before(run: RunData, onset: int, window: int, lead: int) -> Growth | None:
    """The earliest-starting growth precursor in the ``window`` steps before ``onset``, or None.

    Args:
        run: The run.
        onset: The first step of the departure (a loss spike, an overflow) whose precursor is looked for.
        window: Steps looked back (DB01's ``window``, 128).
        lead: The last logged points before ``onset`` judged against the window's first half.

    Returns:
        A :class:`Growth`, or None when no logged growth series departed (or none is logged).
    """
    found = [g for m in growth_metrics(run) if (g := _one(run, m, onset, window, lead)) is not None]
    return min(found, key=lambda g: g.onset_step) if found else None
