"""The Markdown report: a ticket-ready summary under 60 lines that renders cleanly as a GitHub issue body.

What happened (one plain sentence), how sure, what to do (checkpoint, first trial with its paste-ready
block: ``TrainingArguments`` keys or a Megatron/DeepSpeed command line, fenced and never truncated,
what would prove it worked), the top evidence, and where the HTML report is. Rendered from
``reports/templates/report.md.j2`` (autoescape off; table cells escaped with ``md_cell``, code spans
with ``md_code``, blocks fenced with a fence longer than any backtick run inside).
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from forensics.model import Analysis
from reports._common import environment, plain
from reports._plain import NOT_A_FAULT, certainty, consistent, glossary, headline, launch_blocks, proof, split_restore

if TYPE_CHECKING:
    from forensics.model import RunData

TOP_FINDINGS = 5
"""Evidence bullets shown (the engine's order: the findings it ranks first)."""
MAX_LINES = 60
"""The summary stays under this many lines."""


def md_code(value: Any) -> str:
    """An inline code span that holds any text and that nothing inside can close (:func:`reports.escape.md_code`)."""
    from reports.escape import md_code as span

    return span(str(value))


def fence(text: str, lang: str = "", indent: str = "") -> str:
    """A fenced code block around ``text`` (its fence longer than any backtick run inside), indented."""
    longest = max((len(m) for m in re.findall(r"`{3,}", text)), default=2)
    f = "`" * max(3, longest + 1)
    lines = [f"{f}{lang}", *str(text).splitlines(), f]
    return "\n".join(indent + ln if ln else ln for ln in lines)


def json_inline(value: Any) -> str:
    """Compact one-line JSON of a value (non-finite floats as strings)."""
    return json.dumps(plain(value), separators=(", ", ": "), ensure_ascii=False)


def render_markdown(analysis: Analysis, *, html_path: str | None = None, run: RunData | None = None) -> str:
    """Render the Markdown summary.

    Args:
        analysis: The engine's result.
        html_path: Where the HTML report is; linked at the end when given.
        run: The run's data (the plain sentence and the consistency pass use it), or ``None``.

    Returns:
        Markdown text, fewer than :data:`MAX_LINES` lines, ending with a newline. Paste-ready blocks
        are never cut: when the text would be too long, fewer evidence bullets and no other arms are shown.
    """
    env = environment(False)
    env.filters.update(md_code=md_code, fence=fence, json_inline=json_inline)
    cons = consistent(analysis, run)
    rec = analysis.recovery
    first = rec.trials[0] if rec is not None and rec.trials else None
    base = dict(
        run=str(analysis.run), verdict=analysis.verdict, cause=analysis.cause, mechanism=analysis.mechanism,
        confidence=analysis.confidence, onset=analysis.onset, summary=analysis.summary,
        step_note=(analysis.meta.get("step_axis") or {}).get("note"),
        headline=headline(analysis, run), certainty=certainty(analysis, cons.hypotheses),
        labels=glossary([analysis.cause, analysis.mechanism]),
        findings=list(analysis.findings), hypotheses=list(cons.hypotheses),
        recovery=None if rec is None else rec.to_dict(), criteria=proof(analysis, cons),
        restore=[] if rec is None else split_restore(rec.restore)[0], removed=list(cons.removed),
        first=None if first is None else first.to_dict(),
        blocks=[] if first is None or rec is None else launch_blocks(first.settings, rec.resume_from),
        more_trials=[] if rec is None else [t.to_dict() for t in rec.trials[1:4]],
        skipped=list(analysis.skipped), html_path=html_path, not_a_fault=NOT_A_FAULT,
    )
    template = env.get_template("report.md.j2")
    out: list[str] = []
    for top, compact in ((TOP_FINDINGS, False), (3, False), (3, True), (1, True), (0, True)):
        out = _squeeze(template.render(**base, top=top, compact=compact))
        if len(out) < MAX_LINES:
            break
    return "\n".join(out) + "\n"


def _squeeze(text: str) -> list[str]:
    """Lines without trailing spaces and without repeated blank lines."""
    lines = [ln.rstrip() for ln in text.strip().splitlines()]
    squeezed: list[str] = []
    for ln in lines:
        if ln or (squeezed and squeezed[-1]):
            squeezed.append(ln)
    return squeezed
