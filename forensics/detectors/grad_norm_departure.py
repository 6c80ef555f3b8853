"""GN01 grad_norm.departure: the gradient norm leaves its trailing band (a precursor).

Rule: robust z of log grad norm against the trailing 128 points >= 6, or a non-finite grad
norm; onset back-tracked while z >= 3. Grad norm typically leads the loss by 1-4 steps
(BLOOM tr11 chronicles: grad-norm onset one iteration before the loss onset; OLMo 2,
arXiv 2501.00656: grad-norm spikes precede loss spikes). The lead is reported as evidence.

Source: docs/detectors.md#gn01 (the thresholds, where each comes from, the published reports).
"""

from __future__ import annotations

from dataclasses import dataclass

from forensics.detectors.base import Detector, fmt, segment_at
from forensics.model import Finding, RunData, Severity
from forensics.signals import departures


@dataclass(frozen=True)
class GradNormDeparture(Detector):
    """Grad-norm spikes or non-finite grad norms, with their lead over the loss."""

    code = "GN01"
    name = "grad_norm.departure"
    requires = ("grad_norm",)
    max_findings: int = 5
    confidence: float = 0.8

    def detect(self, run: RunData) -> list[Finding]:
        """One finding per grad-norm departure (at most ``max_findings``)."""
        s = run.series("grad_norm")
        loss_deps = departures(run, "loss")
        out: list[Finding] = []
        for d in departures(run, "grad_norm", limit=self.max_findings):
            lead = None
            for ld in loss_deps:
                if ld.step >= d.onset_step:
                    lead = ld.onset_step - d.onset_step
                    break
            what = "non-finite grad norm" if d.nonfinite else f"grad norm {fmt(d.value)} (z={d.z:.1f})"
            out.append(
                self.finding(
                    cause=None, mechanism=None, step=d.onset_step, segment=segment_at(s, d.onset_step),
                    confidence=self.confidence, severity=Severity.MEDIUM,
                    message=f"{what} at step {d.step} against a trailing median of {fmt(d.baseline)}"
                    + (f"; leads the loss departure by {lead} steps." if lead is not None else "."),
                    evidence={
                        "metric": "grad_norm", "detected_step": d.step, "onset_step": d.onset_step, "z": d.z,
                        "value": d.value, "trailing_median": d.baseline, "lead_over_loss": lead,
                        "recovered_step": d.recovered_step, "nonfinite": d.nonfinite,
                    },
                )
            )
        return out
