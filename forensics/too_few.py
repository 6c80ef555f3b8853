"""Too few training-loss points to call a run healthy (a job that died right after its start).

``healthy`` says every series stayed within the run's own normal range; that range is measured from the run
itself, over a trailing window (docs/detectors.md#conventions). A log with fewer finite loss points than
:data:`MIN_JUDGED_LOSS_POINTS` has no such range, so a run that shows nothing anomalous there is
``inconclusive`` (exit 3), not healthy. Faults found in a short log (a non-finite loss) are still reported.
"""

from __future__ import annotations

import numpy as np

from forensics.model import RunData
from forensics.signals import MIN_WINDOW_POINTS

MIN_JUDGED_LOSS_POINTS = MIN_WINDOW_POINTS + 1
"""Fewest finite training-loss points for a healthy verdict: the 12 finite points a trailing window needs before
a robust z is defined (signals.MIN_WINDOW_POINTS, docs/detectors.md#conventions) and one point to judge."""


def too_few_loss_points(run: RunData) -> str | None:
    """The reason ``run`` is too short to judge (a sentence), or None when it has enough loss points."""
    s = run.series("loss")
    if s is None:
        return None  # no objective at all: forensics.objective says so
    n = int(np.isfinite(s.values).sum())
    if n >= MIN_JUDGED_LOSS_POINTS:
        return None
    return (f"too few training-loss points ({n}) to judge: a healthy verdict needs at least "
            f"{MIN_JUDGED_LOSS_POINTS} (a trailing window of {MIN_WINDOW_POINTS} finite points to measure the "
            "run's normal range, and one point to judge against it; docs/detectors.md#conventions)")
