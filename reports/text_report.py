"""The text report: the few lines a person reads first in a terminal.

Verdict, cause, onset, confidence, the top three findings, the resume point and the first
recovery trial. Plain text, or ANSI colours through rich when ``color`` is set.
"""

from __future__ import annotations

from io import StringIO

from forensics.model import Analysis
from reports._common import fmt_conf, oneline, onset_label

TOP_FINDINGS = 3
_VERDICT_STYLE = {
    "anomaly": "bold white on red", "transient": "bold black on yellow", "healthy": "bold white on green",
    "inconclusive": "bold black on white",
}


def _lines(analysis: Analysis) -> list[tuple[str, str, str]]:
    """``(label, value, rich style of the value)`` rows."""
    rows: list[tuple[str, str, str]] = [("run", str(analysis.run), "bold")]
    cause = "-" if analysis.cause is None else analysis.cause
    if analysis.mechanism:
        cause += f" / {analysis.mechanism}"
    rows.append(("verdict", analysis.verdict.upper(), _VERDICT_STYLE.get(analysis.verdict, "bold")))
    rows.append(("cause", cause, "bold"))
    rows.append(("onset", onset_label(analysis.onset), ""))
    rows.append(("confidence", fmt_conf(analysis.confidence), ""))
    for f in analysis.findings[:TOP_FINDINGS]:
        where = "" if f.step is None else f" step {f.step}"
        rows.append(("evidence", f"[{f.code}]{where}: {oneline(f.message)}", ""))
    if len(analysis.findings) > TOP_FINDINGS:
        rows.append(("", f"(+{len(analysis.findings) - TOP_FINDINGS} more findings)", "dim"))
    rec = analysis.recovery
    if rec is not None:
        ckpt = rec.resume_from.get("checkpoint")
        step = rec.resume_from.get("step")
        where = f"step {step}" if step is not None else "start"
        where += f" ({ckpt})" if ckpt else " (no checkpoint)"
        rows.append(("resume from", where, "bold"))
        if rec.trials:
            t = rec.trials[0]
            rows.append(("first trial", f"{t.name}: {oneline(t.change)} ({t.steps} steps)", ""))
    if analysis.skipped:
        rows.append(("not evaluated", f"{len(analysis.skipped)} item(s); see the full report", "dim"))
    return rows


def render_text(analysis: Analysis, *, color: bool) -> str:
    """Render the terminal summary.

    Args:
        analysis: The engine's result.
        color: Use ANSI colours (rich); plain text otherwise.

    Returns:
        A few lines of text ending with a newline.
    """
    rows = _lines(analysis)
    width = max(len(label) for label, _, _ in rows) + 1
    if not color:
        return "".join(f"{(label + ':') if label else '':<{width}} {value}\n" for label, value, _ in rows)
    from rich.console import Console
    from rich.text import Text

    buf = StringIO()
    console = Console(file=buf, force_terminal=True, color_system="standard", width=200, soft_wrap=True)
    for label, value, style in rows:
        head = f"{(label + ':') if label else '':<{width}} "
        console.print(Text.assemble((head, "cyan"), (value, style)))
    return buf.getvalue()
