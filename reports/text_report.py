"""The text report: the few lines a person reads first in a terminal.

What happened in one plain sentence, verdict, cause (with plain words), onset, confidence, the top three
findings (every finding with ``verbose``), the resume point with its reason, the first recovery trial
with its paste-ready block, and what would prove it worked. Plain text, or ANSI colours through rich
when ``color`` is set. Nothing points to something the reader cannot see: a cut list says how to get
the rest (``--verbose``).
"""

from __future__ import annotations

from io import StringIO
from typing import TYPE_CHECKING

from forensics.model import Analysis, Verdict
from reports._common import fmt_conf, oneline, onset_label
from reports._plain import (
    CALIBRATED,
    NOT_A_FAULT,
    consistent,
    explain,
    headline,
    hypothesis_scores,
    launch_blocks,
    proof,
)
from reports.escape import terminal

if TYPE_CHECKING:
    from forensics.model import RunData

TOP_FINDINGS = 3
TOP_SKIPPED = 1
_VERDICT_STYLE = {
    Verdict.ANOMALY: "bold white on red", Verdict.TRANSIENT: "bold black on yellow",
    Verdict.HEALTHY: "bold white on green", Verdict.INCONCLUSIVE: "bold black on white",
}


def _lines(analysis: Analysis, run: RunData | None, verbose: bool) -> list[tuple[str, str, str]]:
    """``(label, value, rich style of the value)`` rows."""
    a = analysis
    rows: list[tuple[str, str, str]] = [("run", str(a.run), "bold")]
    rows.append(("verdict", a.verdict.upper(), _VERDICT_STYLE.get(a.verdict, "bold")))
    rows.append(("what", headline(a, run), "bold"))
    cause = "-" if a.cause is None else a.cause
    if a.mechanism:
        cause += f" / {a.mechanism}"
    words = explain(a.mechanism) or explain(a.cause)
    rows.append(("cause", cause + (f" ({words})" if words else ""), ""))
    rows.append(("onset", onset_label(a.onset), ""))
    note = (a.meta.get("step_axis") or {}).get("note")
    if note:  # the steps are row numbers: every step in the report is one
        rows.append(("steps", str(note), "bold"))
    cons = consistent(a, run)
    scores = hypothesis_scores(a, cons.hypotheses)  # raw, beside the calibrated one: which is which (user test F34)
    raw = (f"; the hypotheses' raw scores (they only rank them): {scores}" if scores
           else f" ({CALIBRATED.partition(': ')[2]})")
    rows.append(("confidence", f"{fmt_conf(a.confidence)} calibrated{raw}", ""))
    shown = a.findings if verbose else a.findings[:TOP_FINDINGS]
    if shown and a.verdict == Verdict.HEALTHY:
        rows.append(("", NOT_A_FAULT, "dim"))
    for f in shown:
        where = "" if f.step is None else f" step {f.step}"
        rows.append(("evidence", f"[{f.code}]{where}: {oneline(f.message)}", ""))
    if len(a.findings) > len(shown):
        rows.append(("", f"(+{len(a.findings) - len(shown)} more findings; --verbose lists them)", "dim"))
    rec = a.recovery
    if rec is not None:
        ckpt = rec.resume_from.get("checkpoint")
        step = rec.resume_from.get("step")
        where = f"step {step}" if step is not None else "start"
        where += f" ({ckpt})" if ckpt else " (no checkpoint)"
        why = rec.resume_from.get("why")
        label = "keep training" if a.verdict == Verdict.TRANSIENT and not ckpt else "resume from"
        rows.append((label, where + (f": {oneline(why)}" if why else ""), "bold"))
        if rec.trials:
            t = rec.trials[0]
            rows.append(("first trial", f"{t.name}: {oneline(t.change)} ({t.steps} steps)", ""))
            for b in launch_blocks(t.settings, rec.resume_from):
                rows.append(("", f"{b.label}:", "dim"))
                rows += [("", "    " + ln, "") for ln in b.text.splitlines()]
            if verbose:
                for t in rec.trials[1:]:
                    rows.append(("other trial", f"{t.name}: {oneline(t.change)} ({t.steps} steps)", ""))
        crit = proof(a, cons)
        if crit:
            rows.append(("worked if", oneline(crit[0]), ""))
            rows += [("", oneline(c), "") for c in (crit[1:] if verbose else ())]
    skipped = a.skipped if verbose else a.skipped[:TOP_SKIPPED]
    for s in skipped:
        rows.append(("not evaluated", f"{oneline(s.what)}: {oneline(s.reason)}", "dim"))
    if len(a.skipped) > len(skipped):
        rows.append(("", f"(+{len(a.skipped) - len(skipped)} more not evaluated; --verbose lists them)", "dim"))
    return rows


def render_text(analysis: Analysis, *, color: bool, run: RunData | None = None, verbose: bool = False) -> str:
    """Render the terminal summary.

    Args:
        analysis: The engine's result.
        color: Use ANSI colours (rich); plain text otherwise.
        run: The run's data (segment starts for the plain sentence, the consistency pass), or ``None``.
        verbose: List every finding, trial, criterion and skipped item instead of the first few.

    Returns:
        Lines of text ending with a newline.
    """
    rows = [(label, terminal(value), style) for label, value, style in _lines(analysis, run, verbose)]  # text is data
    width = max(len(label) for label, _, _ in rows) + 1
    if not color:
        return "".join(f"{(label + ':') if label else '':<{width}} {value}".rstrip() + "\n"
                       for label, value, _ in rows)
    from rich.console import Console
    from rich.text import Text

    buf = StringIO()
    console = Console(file=buf, force_terminal=True, color_system="standard", width=200, soft_wrap=True)
    for label, value, style in rows:
        head = f"{(label + ':') if label else '':<{width}} "
        console.print(Text.assemble((head, "cyan"), (value, style)))
    return buf.getvalue()
