"""Demotions along the causal chain: a family not on the failure's chain no longer names the cause.

Lead-lag (the earliest explains the later ones) holds along a chain only (DESIGN.md section 4). Applied in
this order before the choice:

1. :func:`recovered_before`: a family whose departures all recovered before another strong family's first
   finding does not lead it.
2. :func:`before_resume`: a fault at a resume is not led by a drift of the earlier process.
3. :func:`off_chain`: a family whose every departure recovered long before the failure is not on its chain.
"""

from __future__ import annotations

from forensics.engine import codes, keys
from forensics.engine.evidence import NEVER, Evidence
from forensics.engine.weights import WEIGHTS
from forensics.model import Cause, Hypothesis, Mechanism

W = WEIGHTS
AT_RESUME = (Cause.LR_SCHEDULE_RESET, Cause.STATE_NOT_RESTORED)
"""Causes located at a resume: their onset is the resumed process's first step, not an earlier wobble."""


def demoted(h: Hypothesis, why: str) -> Hypothesis:
    """``h`` lowered just below ``min_cause_conf`` (it no longer names the cause), ``why`` added against it."""
    return Hypothesis(h.cause, h.mechanism, min(h.confidence, W.demoted), h.support, h.against + (why,))


def recovered_before(ev: Evidence, hyps: list[Hypothesis]) -> tuple[Evidence, list[Hypothesis]]:
    """A family whose departures all recovered before another strong family's first finding does not lead it.

    A blip the run recovered from is not the cause of what starts after the recovery (e.g. a warm-up spike
    before an lr reset at a resume).
    """
    strong = {h.cause: ev.first_step(h.cause) for h in hyps if h.confidence >= W.min_cause_conf}
    out = []
    for h in hyps:
        fs = [f for f in ev.family(h.cause) if f.confidence >= W.min_cause_conf]
        rec = [f.evidence.get(keys.RECOVERED_STEP) for f in fs]
        if fs and h.confidence >= W.min_cause_conf and all(r is not None for r in rec):
            later = [(s, c) for c, s in strong.items() if c != h.cause and s > max(rec)]  # type: ignore[type-var]
            if later:
                s, c = min(later)
                h = demoted(h, f"its departure recovered by step {max(rec)}, before the {c} finding at "  # type: ignore[type-var]
                               f"step {s}: it does not lead it")
        out.append(h)
    return ev, out


def _resume_fault(ev: Evidence, hyps: list[Hypothesis]) -> tuple[int, str] | None:
    """(step, cause) of the earliest strong at-resume fault found at the first step of a resumed process."""
    res = [(ev.first_step(h.cause), h.cause) for h in hyps
           if h.cause in AT_RESUME and h.confidence >= W.min_cause_conf
           and h.mechanism != Mechanism.INTENTIONAL_CHANGE]
    res = [(s, c) for s, c in res if s < NEVER and any(
        f.code in codes.AT_RESUME_CODES and f.step == s and (f.segment or 0) > 0 for f in ev.family(c))]
    return min(res) if res else None


def before_resume(ev: Evidence, hyps: list[Hypothesis]) -> tuple[Evidence, list[Hypothesis]]:
    """A fault at a resume (state or schedule not restored) is not led by a drift of the earlier process.

    When a strong :data:`AT_RESUME` family's first finding is at the first step of a resumed process, and the
    run did not fail before it, families whose findings all lie before that resume are demoted: the earlier
    process ended without failing, so its drift did not cause what the resume broke.
    """
    fault = _resume_fault(ev, hyps)
    if fault is None:
        return ev, hyps
    s, c = fault
    if ev.failure_step is not None and ev.failure_step < s:
        return ev, hyps
    out = []
    for h in hyps:
        fs = [f for f in ev.family(h.cause) if f.step is not None]
        if h.cause not in AT_RESUME and fs and all(f.step < s for f in fs) and h.confidence >= W.min_cause_conf:  # type: ignore[operator]
            h = demoted(h, f"it lies in the process before the resume at step {s}, which ended without "
                           f"failing: it does not lead the {c} at that resume")
        out.append(h)
    return ev, out


def off_chain(ev: Evidence, hyps: list[Hypothesis]) -> tuple[Evidence, list[Hypothesis]]:
    """A family whose every departure recovered long before the failure is not on the failure's causal chain.

    When the run failed at step F and another strong family has a finding within ``path_window`` steps
    before F, a family whose findings all carry a ``recovered_step`` and lie more than ``path_window`` steps
    before F is demoted below ``min_cause_conf``, with that as evidence against it.
    """
    fail = ev.failure_step
    if not ev.failed or fail is None:
        return ev, hyps
    near = {c for c, fs in ev.families.items()
            if any(f.step is not None and fail - W.path_window <= f.step <= fail and f.confidence >= W.min_cause_conf
                   for f in fs)}
    out = []
    for h in hyps:
        fs = ev.family(h.cause)
        done = [f.evidence.get(keys.RECOVERED_STEP) for f in fs]
        if (near - {h.cause} and fs and all(r is not None and r < fail for r in done)
                and all(f.step is not None and f.step < fail - W.path_window for f in fs)):
            h = demoted(h, f"its departure recovered by step {max(done)}, long before the failure at "  # type: ignore[type-var]
                           f"step {fail}: not on the failure's causal chain")
        out.append(h)
    return ev, out
