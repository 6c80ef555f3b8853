"""The consistency pass over what the renderers show: hypotheses and success criteria without contradictions.

The engine and the planner write one finding at a time, so a hypothesis may claim a signal is absent that
another finding saw, and a success criterion may already be met by the failed run itself. This module
leaves such sentences out of the view (listed under ``removed`` with why); it never changes the analysis
(the JSON keeps what the engine and the planner said).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from forensics.model import Verdict
from reports._common import fmt_num

if TYPE_CHECKING:
    from forensics.model import Analysis, Finding, Hypothesis, RunData



@dataclass(frozen=True)
class Removed:
    """A sentence the consistency pass left out, and why."""

    where: str
    text: str
    why: str


@dataclass(frozen=True)
class Consistent:
    """The analysis as the renderers show it: hypotheses and criteria without contradictions."""

    hypotheses: tuple[Hypothesis, ...]
    success_criteria: tuple[str, ...]
    removed: tuple[Removed, ...] = field(default_factory=tuple)


_TERMS = {
    "grad-norm": "grad_norm", "grad norm": "grad_norm", "gradient norm": "grad_norm",
    "update-ratio": "update_ratio", "update ratio": "update_ratio", "update-norm": "update_ratio",
    "attention-logit": "attn_logit_max", "attention logit": "attn_logit_max", "loss-scale": "loss_scale",
    "loss scale": "loss_scale", "step-time": "step_time", "step time": "step_time", "lr": "lr", "loss": "loss",
}


def finding_metrics(f: Finding, available: Iterable[str] = ()) -> set[str]:
    """The metric names a finding used.

    Its evidence ``metric``/``series`` values and the metric names in its dotted detector name
    (``grad_norm.departure`` -> ``grad_norm``); restricted to ``available`` when given.
    """
    names: set[str] = set()
    for key in ("metric", "series"):
        v = f.evidence.get(key) if isinstance(f.evidence, Mapping) else None
        if isinstance(v, str):
            names.update(p.strip() for p in re.split(r"[,;]| vs ", v) if p.strip())
        elif isinstance(v, list | tuple):
            names.update(str(x) for x in v)
    avail = set(available)
    for m in avail:
        if re.search(rf"(?:^|[._]){re.escape(m)}(?:$|[._])", f.name):
            names.add(m)
    head = f.name.split(".")[0]
    names.add({"update": "update_ratio", "attention": "attn_logit_max"}.get(head, head))
    return {n for n in names if not avail or n in avail} if avail else names


def _claimed_absent(text: str) -> set[str]:
    """Metrics a sentence says are absent or unconfirmed (``no grad-norm or update-ratio series confirms``)."""
    t = text.lower()
    out: set[str] = set()
    for m in re.finditer(r"\bno ([a-z_\- ,]+?) (?:series|finding|evidence)\b", t):
        for part in re.split(r",| or | and ", m.group(1)):
            p = part.strip()
            if p in _TERMS:
                out.add(_TERMS[p])
            elif p.replace(" ", "_") in _TERMS.values():
                out.add(p.replace(" ", "_"))
    return out


def _contradiction(text: str, findings: Sequence[Finding]) -> str | None:
    """Why ``text`` contradicts a finding, or ``None``."""
    t = text.lower()
    if re.search(r"\bwithout (?:a |any )?spikes?\b|\bno (?:loss )?spikes?\b", t):
        spikes = [f for f in findings if "spike" in f.name and f.step is not None]
        if spikes:
            f = spikes[0]
            z = f.evidence.get("z") if isinstance(f.evidence, Mapping) else None
            zs = f" (z={fmt_num(z, 3)})" if isinstance(z, int | float) and np.isfinite(z) else ""
            return f"contradicted by {f.code} {f.name} at step {f.step}{zs}"
    m = re.search(r"\bno precursor\b", t)
    if m:
        at = re.search(r"\bat step (\d+)", t)
        win = re.search(r"previous (\d+) steps", t)
        if at:
            s, w = int(at.group(1)), int(win.group(1)) if win else 100
            lead = [f for f in findings if f.step is not None and s - w <= f.step < s
                    and not f.name.startswith(("nonfinite", "integrity", "notes"))]
            if lead:
                f = lead[0]
                return f"contradicted by {f.code} {f.name} at step {f.step}, {s - f.step} step(s) before step {s}"
    for metric in sorted(_claimed_absent(text)):
        hits = [f for f in findings if metric in finding_metrics(f) and f.step is not None]
        if hits:
            f = hits[0]
            return f"contradicted by {f.code} {f.name} on {metric} at step {f.step}"
    return None


def consistent(analysis: Analysis, run: RunData | None = None) -> Consistent:
    """The consistency pass: no sentence contradicts a finding, no criterion is already met.

    A hypothesis sentence is left out when it claims something absent that a finding shows (``without a
    spike`` beside a spike finding; ``no grad-norm series confirms`` beside a grad-norm finding). A
    success criterion is left out when the failed run itself met it over the trial window after the
    onset (so it cannot tell a fixed run from the failed one); this needs ``run`` and the criteria the
    planner words with their numbers (``... (2.219 +- 0.2735)``, ``pre-onset median (0.7632)``).

    Args:
        analysis: The engine's result (unchanged).
        run: The run's data, or ``None`` (criteria then stay as they are).

    Returns:
        The filtered hypotheses and criteria, and every left-out sentence with its reason.
    """
    removed: list[Removed] = []
    findings = list(analysis.findings)
    hyps: list[Hypothesis] = []
    for h in analysis.hypotheses:
        keep_for, keep_against = [], []
        for s in h.support:
            why = _contradiction(s, findings)
            (removed.append(Removed(f"hypothesis {h.cause} (for)", s, why)) if why else keep_for.append(s))
        for s in h.against:
            why = _contradiction(s, findings)
            (removed.append(Removed(f"hypothesis {h.cause} (against)", s, why)) if why else keep_against.append(s))
        hyps.append(type(h)(h.cause, h.mechanism, h.confidence, tuple(keep_for), tuple(keep_against)))
    crit: list[str] = []
    rec = analysis.recovery
    for c in (rec.success_criteria if rec is not None else ()):
        why = _already_met(c, analysis, run)
        (removed.append(Removed("success criterion", c, why)) if why else crit.append(c))
    return Consistent(tuple(hyps), tuple(crit), tuple(removed))


def split_restore(restore: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(steps before resuming, checks)``: restore sentences that start with check/verify are proof, not steps."""
    checks = [r for r in restore if r.lower().startswith(("check", "verify"))]
    return [r for r in restore if r not in checks], checks


def proof(analysis: Analysis, cons: Consistent) -> list[str]:
    """What would prove the first trial worked: the planner's checks, then the criteria left by the pass."""
    rec = analysis.recovery
    checks = split_restore(rec.restore)[1] if rec is not None else []
    return [*checks, *cons.success_criteria]


_NUM = r"([-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?)"


def _already_met(criterion: str, analysis: Analysis, run: RunData | None) -> str | None:
    """Why the failed run already meets ``criterion`` after its onset, or ``None`` (keep it)."""
    if run is None or not analysis.onset or analysis.verdict != Verdict.ANOMALY or analysis.recovery is None:
        return None
    onset = int(analysis.onset["step"])
    trials = analysis.recovery.trials
    length = max((t.steps for t in trials), default=0) or 100
    c = criterion.lower()
    m = re.search(r"loss stays within .*?\(" + _NUM + r" \+- " + _NUM + r"\)", c)
    if m:
        v = run.values_after("loss", onset, length)
        hi = float(m.group(1)) + float(m.group(2))
        if v is not None and np.isfinite(v).all() and float(v.max()) <= hi:
            return (f"already met by the failed run: its loss stayed at or below {fmt_num(hi)} from step {onset} "
                    f"over {length} steps")
        return None
    m = re.search(r"grad norm's rolling median stays within 2x of its pre-onset median \(" + _NUM + r"\)", c)
    if m:
        v = run.values_after("grad_norm", onset, length)
        g = float(m.group(1))
        if v is None or not np.isfinite(v).all() or g <= 0:
            return None
        k = max(1, min(32, v.size))
        med = np.array([np.median(v[max(0, i - k + 1): i + 1]) for i in range(v.size)])
        spiky = any(f.name.startswith("grad_norm") and (f.step or -1) >= onset for f in analysis.findings)
        if not spiky and (med <= 2 * g).all() and (med >= g / 2).all():
            return (f"already met by the failed run: its grad-norm rolling median stayed within 2x of {fmt_num(g)} "
                    f"from step {onset}")
        return None
    if re.search(r"no loss spike beyond", c):
        v = run.values_after("loss", onset, length)
        spikes = [f for f in analysis.findings if "spike" in f.name and (f.step or -1) >= onset]
        if v is not None and np.isfinite(v).all() and not spikes:
            return f"already met by the failed run: no loss spike was found after step {onset}"
    return None
