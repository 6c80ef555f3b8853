"""An audit's comparisons across runs: findings new/known/resolved against a baseline, and cohort robust z."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from forensics.model import Verdict
from forensics.stats import MAD_TO_SIGMA

MIN_COHORT = 3
"""Fewest runs with a value in a cohort before a robust z is given (else ``None``)."""
MEAN_ABS_TO_SIGMA = 1.2533
"""Mean absolute deviation to a normal sigma (sqrt(pi/2)), used when the MAD is 0."""


def mark_status(rows: list[dict[str, Any]], base: Mapping[str, str | None] | None) -> None:
    """``new`` / ``known`` for a finding (by fingerprint); ``resolved`` when a baseline finding is gone."""
    for r in rows:
        fp, before = r["fingerprint"], (base or {}).get(r["run"])
        if fp:
            r["status"] = "known" if base is not None and before == fp else "new"
        elif before and r["verdict"] == Verdict.HEALTHY:
            r["status"] = "resolved"
        else:
            r["status"] = None


def robust_z(values: Sequence[float]) -> list[float | None]:
    """Robust z of each value against the others: ``(x - median) / (1.4826 * MAD)``.

    When the MAD is 0 the mean absolute deviation (x 1.2533) is used; ``None`` for fewer than
    :data:`MIN_COHORT` values; 0 when every value is equal.
    """
    if len(values) < MIN_COHORT:
        return [None] * len(values)
    med = statistics.median(values)
    dev = [abs(v - med) for v in values]
    scale = MAD_TO_SIGMA * statistics.median(dev) or MEAN_ABS_TO_SIGMA * statistics.fmean(dev)
    return [0.0 if not scale else round((v - med) / scale, 3) for v in values]


def cohort_z(rows: list[dict[str, Any]]) -> None:
    """Set ``spikes_z`` and ``onset_z`` of every row against the other runs of its cohort (in place)."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        r["onset_z"] = r["spikes_z"] = None
        if not r["error"]:
            groups[r["cohort"]].append(r)
    for members in groups.values():
        for r, z in zip(members, robust_z([float(r["spike_count"] or 0) for r in members]), strict=True):
            r["spikes_z"] = z
        onset = [r for r in members if r["onset_step"] is not None]
        for r, z in zip(onset, robust_z([float(r["onset_step"]) for r in onset]), strict=True):
            r["onset_z"] = z
