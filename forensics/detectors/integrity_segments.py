"""INT01 integrity.segments: restarts, resumed segments and damaged inputs (a prerequisite).

Rule (docs/detectors.md#int01): a restart is a new segment (steps go back, a new event file, a
resume line); every segment is kept. Damaged or skipped inputs are listed. Informational:
argues for no cause by itself.

Source: docs/detectors.md#int01 (the thresholds, where each comes from, the published reports).
"""

from __future__ import annotations

from dataclasses import dataclass

from forensics.detectors.base import Detector
from forensics.model import Finding, RunData, Severity


@dataclass(frozen=True)
class Integrity(Detector):
    """Restarts (segment boundaries) and inputs that could not be read completely."""

    code = "INT01"
    name = "integrity.segments"
    max_listed: int = 20

    def detect(self, run: RunData) -> list[Finding]:
        """One informational finding per restart, and one for damaged inputs."""
        out: list[Finding] = []
        starts = run.segment_starts()
        for seg, step in sorted(starts.items()):
            if seg == 0:
                continue
            out.append(self.finding(
                cause=None, mechanism=None, step=step, segment=seg, confidence=1.0, severity=Severity.INFO,
                message=f"restart: segment {seg} begins at step {step}.",
                evidence={"segment": seg, "first_step": step},
            ))
        if run.skipped:
            out.append(self.finding(
                cause=None, mechanism=None, step=None, segment=None, confidence=1.0, severity=Severity.LOW,
                message=f"{len(run.skipped)} input(s) or record(s) could not be read; see 'skipped'.",
                evidence={"skipped": [s.what for s in run.skipped[:self.max_listed]]},
            ))
        return out
