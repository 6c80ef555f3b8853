"""The Markdown report: a ticket-ready summary under 60 lines.

Verdict, cause/mechanism/confidence, onset, the top evidence, the recovery plan as a short
table, and where the HTML report is. Rendered from ``reports/templates/report.md.j2``
(autoescape off; table cells escaped with the ``md_cell`` filter).
"""

from __future__ import annotations

from forensics.model import Analysis
from reports._common import environment

TOP_FINDINGS = 5
"""Evidence bullets shown (the engine's order: the findings it ranks first)."""
MAX_LINES = 60
"""The summary stays under this many lines."""


def render_markdown(analysis: Analysis, *, html_path: str | None = None) -> str:
    """Render the Markdown summary.

    Args:
        analysis: The engine's result.
        html_path: Where the HTML report is; linked at the end when given.

    Returns:
        Markdown text, fewer than :data:`MAX_LINES` lines, ending with a newline.
    """
    text = environment(False).get_template("report.md.j2").render(
        run=str(analysis.run), verdict=analysis.verdict, cause=analysis.cause, mechanism=analysis.mechanism,
        confidence=analysis.confidence, onset=analysis.onset, summary=analysis.summary,
        findings=list(analysis.findings), top=TOP_FINDINGS, hypotheses=list(analysis.hypotheses),
        recovery=None if analysis.recovery is None else analysis.recovery.to_dict(),
        skipped=list(analysis.skipped), html_path=html_path,
    )
    lines = [ln.rstrip() for ln in text.strip().splitlines()]
    squeezed: list[str] = []
    for ln in lines:  # no double blank lines
        if ln or (squeezed and squeezed[-1]):
            squeezed.append(ln)
    if len(squeezed) >= MAX_LINES:  # defensive: every list in the template is already capped
        squeezed = squeezed[: MAX_LINES - 2] + ["", "(truncated; see the HTML or JSON report)"]
    return "\n".join(squeezed) + "\n"
