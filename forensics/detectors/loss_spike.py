"""SP01 loss.spike: the loss leaves its own trailing band (a spike, a NaN, or a divergence).

Rule: robust z of log loss against the trailing 128 logged points >= 6, or a non-finite
loss (OLMo-core ``StabilityMonitorCallback``: 6 sigma over the last 128 values); the onset is
back-tracked while z >= 3 (docs/detectors.md#conventions). A spike that returns inside its
pre-spike band within the run is reported as recovered (the engine may call it transient).

Source: docs/detectors.md#sp01 (the thresholds, where each comes from, the published reports).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from forensics.detectors.base import Detector, fmt, segment_at
from forensics.model import Finding, RunData, Severity
from forensics.signals import departures


@dataclass(frozen=True)
class LossSpike(Detector):
    """Loss spikes and non-finite losses, each with its onset and whether it recovered."""

    code = "SP01"
    name = "loss.spike"
    requires = ("loss",)
    max_findings: int = 5
    confidence: float = 0.9

    def detect(self, run: RunData) -> list[Finding]:
        """Findings for the first ``max_findings`` loss departures (cause left to the engine)."""
        s = run.series("loss")
        out: list[Finding] = []
        for d in departures(run, "loss", limit=self.max_findings):
            what = "non-finite loss" if d.nonfinite else f"loss spike {fmt(d.value)} (z={d.z:.1f})"
            rec = f", recovered by step {d.recovered_step}" if d.recovered_step is not None else ", did not recover"
            base = (f"against a trailing median of {fmt(d.baseline)}" if math.isfinite(d.baseline)
                    else "with no finite loss before it to compare with")
            out.append(
                self.finding(
                    cause=None, mechanism=None, step=d.onset_step, segment=segment_at(s, d.onset_step),
                    confidence=self.confidence, severity=Severity.HIGH if d.recovered_step is None else Severity.MEDIUM,
                    message=f"{what} at step {d.step} {base}; excursion starts at step {d.onset_step}{rec}.",
                    evidence={
                        "metric": "loss", "detected_step": d.step, "onset_step": d.onset_step, "z": d.z,
                        "value": d.value, "trailing_median": d.baseline, "peak": d.peak,
                        "recovered_step": d.recovered_step, "nonfinite": d.nonfinite,
                    },
                )
            )
        return out
