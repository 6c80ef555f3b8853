"""NF01 nonfinite.first: the first NaN/inf in any logged training signal.

Rule (docs/detectors.md#nf01; Megatron ``--check-for-nan-in-loss-and-grad``, smdebug
``ExplodingTensor``): the earliest non-finite loss, grad norm, parameter norm or loss scale,
or a ``nan_detected`` event (e.g. Megatron omitting ``lm loss`` from a line when its average
is NaN). This marks where the failure became visible, NOT the onset; the engine looks for
the departure that led here.

Source: docs/detectors.md#nf01 (the thresholds, where each comes from, the published reports).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from forensics.detectors.base import Detector
from forensics.model import Finding, RunData, Severity
from forensics.signals import scaler_skips

_SIGNALS = ("loss", "grad_norm", "param_norm", "loss_scale", "update_ratio")


@dataclass(frozen=True)
class NonFinite(Detector):
    """The first non-finite value among the core training signals."""

    code = "NF01"
    name = "nonfinite.first"
    requires = ("loss", "grad_norm")
    recovered_points: int = 10

    def detect(self, run: RunData) -> list[Finding]:
        """At most one finding: the earliest non-finite value and which series it was."""
        first: tuple[int, str, int] | None = None
        counts: dict[str, int] = {}
        recovered: dict[str, int | None] = {}
        for m in _SIGNALS:
            s = run.series(m)
            if s is None:
                continue
            nf = ~np.isfinite(s.values)
            if m == "grad_norm":
                sk = scaler_skips(run, s)
                if sk is not None:
                    nf &= ~sk  # a dynamic fp16 scaler's overflow check, not a failure
            bad = np.flatnonzero(nf)
            if bad.size:
                counts[m] = int(bad.size)
                # finite again for good: recovered_points (10, ours) finite points after the last non-finite one
                tail = s.values[bad[-1] + 1:]
                again = tail.size >= self.recovered_points and bool(np.all(np.isfinite(tail)))
                recovered[m] = int(s.steps[bad[-1] + 1]) if again else None
                st = int(s.steps[bad[0]])
                if first is None or st < first[0]:
                    first = (st, m, int(s.segments[bad[0]]))
        if run.events.height:
            nan_ev = run.events.filter((pl.col("kind") == "nan_detected") & pl.col("step").is_not_null())
            if nan_ev.height:
                st = int(nan_ev.get_column("step").min())  # type: ignore[arg-type]
                counts["nan_events"] = nan_ev.height
                if first is None or st < first[0]:
                    seg = int(nan_ev.sort("step").get_column("segment")[0])
                    first = (st, "nan_detected event", seg)
        if first is None:
            return []
        step, what, seg = first
        rec = bool(recovered) and all(r is not None for r in recovered.values()) and "nan_events" not in counts
        return [self.finding(
            cause=None, mechanism=None, step=step, segment=seg, confidence=1.0, severity=Severity.CRITICAL,
            message=f"first non-finite {what} at step {step}"
            + (" (the series is finite again afterwards)." if rec
               else " (where the failure became visible, not its onset)."),
            evidence={"first_nonfinite_step": step, "series": what, "nonfinite_points": counts,
                      "recovered_step": max(recovered.values()) if rec else None},  # type: ignore[type-var]
        )]
