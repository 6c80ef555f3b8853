"""Which failure ended the run: an earlier recovered episode, a run that never learned, a loss never finite.

Rules applied by :func:`forensics.engine.decide.decide_timeline`, each one function (nothing is mutated):

1. :func:`earlier_episodes`: a departure (not a growth sign) that recovered long before the failure that
   ended the run is an earlier episode (a secondary finding), not on the failure's causal chain; its family
   is judged on the rest of its findings (a recovered spike must not hide a later divergence).
2. :func:`stall_not_led`: a run whose loss never went down from the start (ST01) is not explained by a
   departure that recovered by itself.
3. :func:`no_learning`: a run that never learned, after its loss rose above its initial value in the
   first steps, took steps too large (it collapsed to the uniform prediction: lr too high).
4. :func:`nonfinite_from_start`: a loss non-finite from the first logged step (and not finite for good
   afterwards) has no batch to blame and no earlier step to compare with: the initialisation, the input data
   or the precision.
"""

from __future__ import annotations

import numpy as np

from forensics.engine import codes, keys, rules
from forensics.engine.chain import demoted
from forensics.engine.evidence import Evidence, recovered
from forensics.engine.weights import WEIGHTS
from forensics.model import Cause, Finding, Hypothesis, Mechanism, Severity
from forensics.signals import MIN_REL_JUMP

W = WEIGHTS


def episode(ev: Evidence, f: Finding) -> bool:
    """``f`` recovered before the run's failure and lies more than ``path_window`` steps before it."""
    fail = ev.failure_step
    r = f.evidence.get(keys.RECOVERED_STEP)
    return (ev.failed and fail is not None and r is not None and f.step is not None
            and r < fail and f.step < fail - W.path_window)  # type: ignore[operator]


def earlier_episodes(ev: Evidence, hyps: list[Hypothesis]) -> tuple[Evidence, list[Hypothesis]]:
    """Rule 1: findings that recovered long before the failure leave their family (they stay listed).

    A family left with findings is judged again on them (:func:`forensics.engine.rules.family_hypotheses`);
    a family with none left is demoted below ``min_cause_conf``. Either way the episode is said against it.
    Growth families (:data:`forensics.engine.rules.GROWTH_CAUSES`) keep theirs: a growth sign that recovered
    (warm-up spikes) can be the start of the growth that ends in the failure (an fp16 overflow later on).
    """
    fams = {c: fs if c in rules.GROWTH_CAUSES else tuple(f for f in fs if not episode(ev, f))
            for c, fs in ev.families.items()}
    changed = {c for c, fs in fams.items() if len(fs) != len(ev.families[c])}
    if not changed:
        return ev, hyps
    pruned = ev.with_families({c: fs for c, fs in fams.items() if fs})
    fresh = {h.cause: h for h in rules.family_hypotheses(pruned)}
    out = []
    for h in hyps:
        if h.cause not in changed:
            out.append(h)
            continue
        eps = [f for f in ev.family(h.cause) if episode(ev, f)]
        why = (f"its departure at step {eps[0].step} recovered by step {eps[0].evidence.get(keys.RECOVERED_STEP)}, "
               f"long before the failure at step {ev.failure_step}: an earlier episode, not the failure that "
               "ended the run")
        new = fresh.get(h.cause)
        out.append(demoted(h, why) if new is None else
                   Hypothesis(new.cause, new.mechanism, new.confidence, new.support, new.against + (why,)))
    return pruned, out


def stall_not_led(ev: Evidence, hyps: list[Hypothesis]) -> tuple[Evidence, list[Hypothesis]]:
    """Rule 2: a family whose departures all recovered does not explain a loss that never went down (ST01).

    Such a family is demoted below ``min_cause_conf``.
    """
    stall = ev.get(codes.STALL)
    if not stall:
        return ev, hyps
    out = []
    for h in hyps:
        fs = ev.family(h.cause)
        if fs and h.confidence >= W.min_cause_conf and all(recovered(f) for f in fs):
            h = demoted(h, f"the loss never went down from the start ({stall[0].message.rstrip('.')}): "
                            "a departure that recovered by itself does not explain a run that never learned")
        out.append(h)
    return ev, out


def _early_rise(ev: Evidence) -> tuple[int, float, float] | None:
    """(step, first loss, peak) of an early rise of the loss; None when there is none.

    The finite loss rises ``MIN_REL_JUMP`` above its first value within ``early_steps`` of the first logged step.
    """
    s = ev.run.series("loss")
    if s is None or len(s) < 2 or not np.isfinite(s.values[0]):
        return None
    early = np.isfinite(s.values) & (s.steps <= s.steps[0] + W.early_steps)
    v0 = float(s.values[0])
    up = np.flatnonzero(early & (s.values > v0 * (1 + MIN_REL_JUMP)))
    if not up.size:
        return None
    return int(s.steps[up[0]]), v0, float(np.max(s.values[early]))


def no_learning(ev: Evidence, hyps: list[Hypothesis]) -> tuple[Evidence, list[Hypothesis]]:
    """Rule 3: a run that never learned (ST01) after its loss rose above its initial value took steps too large.

    The network collapsed to a constant prediction (lr too high). Only when no family explains the run.
    """
    stall = ev.get(codes.STALL)
    rise = _early_rise(ev) if stall and not rules.strong(hyps) else None
    if rise is None:
        return ev, hyps
    step, v0, peak = rise
    f = Finding(codes.NO_LEARNING, codes.ENGINE_FINDINGS[codes.NO_LEARNING], Cause.UPDATE_SCALE_GROWTH,
                Mechanism.LR_TOO_HIGH, step, stall[0].segment, W.no_learning, Severity.HIGH,
                f"the loss jumps from {v0:.4g} to {peak:.4g} at step {step}, within {W.early_steps} steps of the "
                f"start, and never gets clearly below its initial value again (at best "
                f"{stall[0].evidence.get('loss_best', float('nan')):.4g}): the updates were too large and the "
                "network stopped learning (a collapse to a constant prediction)", {"onset_step": step, "loss_first": v0,
                                                                           "loss_peak": peak})
    ev = ev.with_family(Cause.UPDATE_SCALE_GROWTH, f, listed=True)
    return ev, [h for h in hyps if h.cause != Cause.UPDATE_SCALE_GROWTH] + [Hypothesis(
        Cause.UPDATE_SCALE_GROWTH, Mechanism.LR_TOO_HIGH, W.no_learning, (f"{f.code} step {step}: {f.message}",),
        ("no grad-norm or update series confirms the growth",) if not ev.run.has("grad_norm") else ())]


def nonfinite_from_start(ev: Evidence, hyps: list[Hypothesis]) -> tuple[Evidence, list[Hypothesis]]:
    """Rule 4: the loss is non-finite at the first logged step: no bad batch (there is no step before it).

    The cause stays ``unknown`` (the taxonomy has no "broken from the start" family): the hypothesis names the
    three things to check, the initialisation, the input data and the precision, and the planner reads
    :data:`forensics.engine.keys.FROM_START` to propose those checks. Only when no family explains it.
    """
    s = ev.run.series("loss")
    if s is None or not len(s) or np.isfinite(s.values[0]) or rules.strong(hyps):
        return ev, hyps
    if any(recovered(f) for f in ev.get(codes.NONFINITE)):
        return ev, hyps  # finite for good afterwards: a first-step artefact, not a run broken from the start
    fin = np.isfinite(s.values)
    first = int(s.steps[0])
    n_bad = int(np.argmax(fin)) if fin.any() else len(s)
    span = "every logged step" if not fin.any() else f"the first {n_bad} logged step(s), to step {s.steps[n_bad - 1]}"
    f = Finding(codes.NONFINITE_START, codes.ENGINE_FINDINGS[codes.NONFINITE_START], Cause.UNKNOWN, None, first,
                int(s.segments[0]), W.nonfinite_start, Severity.CRITICAL,
                f"the loss is non-finite from the first logged step ({first}) on, at {span}: there is no finite "
                "step before it to compare with and no batch to blame; the initialisation, the input data or the "
                "precision (fp16 range, a NaN in the inputs or labels, a division by zero) is broken",
                {keys.FROM_START: True, "first_step": first, "nonfinite_points": len(s) - int(fin.sum())})
    ev = ev.with_family(Cause.UNKNOWN, f, listed=True)
    return ev, hyps + [Hypothesis(Cause.UNKNOWN, None, W.nonfinite_start, (f"{f.code} step {first}: {f.message}",),
                                  ("no logged signal tells the initialisation, the data and the precision apart",))]
