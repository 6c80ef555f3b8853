"""NT01 notes.attempts: what the team already tried, read from the notes kept in the run folder.

Rule: in the markdown/text notes of the run folder (``notes.md``, attempt tables, logbooks),
a line that names a remedy (data skipped, lr lowered, optimizer reset, beta2 changed,
precision changed, init changed, qk-norm/z-loss added) together with a failure word (failed,
diverged, same behaviour, did not help, went the wrong way) is a *failed remedy*: negative
evidence against the cause that remedy addresses (DESIGN.md section 4: "earlier attempts
(skipped data did not help) recorded in the run folder"). Remedies named as open ideas
(``Open ideas:``, ``next:``, ``todo``) are proposals the recovery plan picks up.

Source: docs/detectors.md#nt01 (the thresholds, where each comes from, the published reports).
"""

from __future__ import annotations

from dataclasses import dataclass

from forensics.detectors.base import Detector
from forensics.model import Finding, RunData, Severity
from forensics.notes import ADDRESSES, read_notes


@dataclass(frozen=True)
class NotesAttempts(Detector):
    """Failed remedies and open ideas recorded in the run folder's notes."""

    code = "NT01"
    name = "notes.attempts"
    needs = "notes (markdown or text) in the run folder"

    def missing(self, run: RunData) -> str | None:
        """Needs notes (markdown/text) in the run folder."""
        return None if run.meta.get("notes") else "no notes (markdown) in the run folder"

    def detect(self, run: RunData) -> list[Finding]:
        """One informational finding listing failed remedies and proposals."""
        failed, ideas = read_notes(run)
        if not failed and not ideas:
            return []
        against = tuple(f"the notes record that {k.replace('_', ' ')} was tried and failed: {v[0]}"
                        for k, v in failed.items())
        return [self.finding(
            cause=None, mechanism=None, step=None, segment=None, confidence=1.0, severity=Severity.INFO,
            message="notes in the run folder: "
            + ("failed remedies: " + ", ".join(failed) if failed else "no failed remedy recorded")
            + ("; open ideas: " + ", ".join(ideas) if ideas else "") + ".",
            evidence={"failed_remedies": failed, "ideas": ideas,
                      "argues_against": sorted({ADDRESSES[k] for k in failed if k in ADDRESSES})},
            against=against,
        )]
