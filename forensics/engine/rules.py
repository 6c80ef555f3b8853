"""The engine's scoring rules, one function each, in the order :func:`forensics.engine.decide` applies them.

Each rule takes the evidence and the hypotheses and returns new ones (nothing is mutated):

1. :func:`family_hypotheses`: one hypothesis per cause family, noisy-OR of its findings' confidences, lowered
   by evidence against it (a precursor before a "bad batch", a spike that recovered by itself).
2. :func:`apply_notes`: remedies the notes say already failed lower the cause they address.
3. :func:`slow_divergence`: a loss that turns and keeps rising with no other explanation is update growth.
4. :func:`early_divergence`: a run that blows up in its first steps, the loss rising first, took steps too large.

The demotions along the causal chain are in :mod:`forensics.engine.chain`, the choice in
:mod:`forensics.engine.choose`.
"""

from __future__ import annotations

import numpy as np

from forensics.engine import codes, keys
from forensics.engine.evidence import Evidence, recovered
from forensics.engine.weights import WEIGHTS
from forensics.model import Cause, Finding, Hypothesis, Mechanism, Severity
from forensics.notes import ADDRESSES
from forensics.spike_shape import confined_to_batch

W = WEIGHTS
GROWTH_CAUSES = (Cause.UPDATE_SCALE_GROWTH, Cause.OVERFLOW)
"""Families whose earlier departure is a precursor of a loss spike."""


def noisy_or(confs: list[float]) -> float:
    """1 - prod(1 - c): the chance that at least one of independent findings is right."""
    p = 1.0
    for c in confs:
        p *= 1.0 - max(0.0, min(1.0, c))
    return 1.0 - p


def strong(hyps: list[Hypothesis]) -> bool:
    """Some hypothesis names its cause (at or above ``min_cause_conf``)."""
    return any(h.confidence >= W.min_cause_conf for h in hyps)


def _precursors_of(ev: Evidence, first: int | None) -> list[Finding]:
    """Growth departures before a spike family's first step that did not recover long before it."""
    cause_f = [f for fs in ev.families.values() for f in fs]
    return [f for f in cause_f + list(ev.get(codes.DIVERGENCE))
            if (f.cause in GROWTH_CAUSES or f.code == codes.DIVERGENCE)
            and f.confidence >= W.min_cause_conf and f.step is not None and first is not None and f.step < first
            # a departure that recovered long before the spike is not its precursor
            and not (recovered(f) and first - f.step > W.path_window)]


def _data_batch_score(ev: Evidence, fs: tuple[Finding, ...], score: float, against: list[str]) -> float:
    first = min((f.step for f in fs if f.step is not None), default=None)
    if all(recovered(f) for f in fs) and not ev.failed:
        # a spike that recovered by itself: the verdict is transient, the cause still named (DESIGN.md)
        # when the grad norm rules out a precursor; without it the cause stays open
        # (or when the loss is back within a few steps: high on its batch only, spike_shape.py)
        if any(f.evidence.get(keys.GRAD_NORM_LOGGED) is False for f in fs) and not all(
                confined_to_batch(f) for f in fs):
            score *= W.unlogged_grad_norm
        against.append("every spike recovered by itself")
    earlier = _precursors_of(ev, first)
    if earlier:
        score *= W.has_precursor
        what = earlier[0].cause or earlier[0].name
        against.append(f"{earlier[0].code} ({what}) departs earlier, at step {earlier[0].step}: "
                       "the spike has a precursor")
    return score


def family_hypotheses(ev: Evidence) -> list[Hypothesis]:
    """Rule 1: one hypothesis per cause family, noisy-OR of its findings, minus evidence against it."""
    hyps: list[Hypothesis] = []
    for fam, fs in ev.families.items():
        score = noisy_or([f.confidence for f in fs])
        against = [a for f in fs for a in f.against]
        if fam == Cause.DATA_BATCH:
            score = _data_batch_score(ev, fs, score, against)
        if not any(f.confidence >= W.min_cause_conf for f in fs):
            score = min(score, W.min_cause_conf - W.weak_margin)
        mech = max(fs, key=lambda f: f.confidence).mechanism
        support = tuple(f"{f.code} step {f.step}: {f.message}" for f in fs)[:W.support_listed]
        hyps.append(Hypothesis(str(fam), mech, score, support, tuple(dict.fromkeys(against))))
    return hyps


def _addresses(sentence: str, cause: str) -> bool:

    return any(k.replace("_", " ") in sentence and v == cause for k, v in ADDRESSES.items())


def apply_notes(ev: Evidence, hyps: list[Hypothesis]) -> tuple[Evidence, list[Hypothesis]]:
    """Rule 2: remedies the run's notes say were tried and failed argue against the cause they address."""
    for note in ev.get(codes.NOTES):
        bad = set(note.evidence.get(keys.ARGUES_AGAINST, []))
        hyps = [Hypothesis(h.cause, h.mechanism, h.confidence * W.failed_remedy, h.support,
                           h.against + tuple(a for a in note.against if _addresses(a, h.cause)))
                if h.cause in bad else h for h in hyps]
    return ev, hyps


def slow_divergence(ev: Evidence, hyps: list[Hypothesis]) -> tuple[Evidence, list[Hypothesis]]:
    """Rule 3: a divergence no family explains is updates too large for the model (docs/detectors.md#dv01)."""
    dv = ev.get(codes.DIVERGENCE)
    if not dv or strong(hyps):
        return ev, hyps
    cfg = repr(ev.run.meta.get("config_files", {})).lower()
    adapter = "adapter_config" in cfg or "lora" in cfg
    d = dv[0]
    ev = ev.with_family(Cause.UPDATE_SCALE_GROWTH, Finding(
        d.code, d.name, Cause.UPDATE_SCALE_GROWTH, None, d.step, d.segment, W.slow_divergence, d.severity,
        d.message, d.evidence))
    return ev, [h for h in hyps if h.cause != Cause.UPDATE_SCALE_GROWTH] + [Hypothesis(
        Cause.UPDATE_SCALE_GROWTH, "adapter_scale" if adapter else Mechanism.LR_TOO_HIGH, W.slow_divergence,
        (f"{d.code} step {d.step}: {d.message}",
         "the loss turns and keeps rising without a spike: the slow-divergence signature of updates too "
         "large for the model (docs/detectors.md#dv01; BigScience 104B 'non-spike diverging')")
        + (("a LoRA adapter is trained: its effective step scales with alpha/rank",) if adapter else ()),
        ("no grad-norm, update-ratio or attention-logit series confirms the growth",),
    )]


def early_divergence(ev: Evidence, hyps: list[Hypothesis]) -> tuple[Evidence, list[Hypothesis]]:
    """Rule 4: a run that blows up within its first steps, the loss rising before it turns non-finite.

    Applies only when no family explains the failure: the finite loss rises above its first logged value
    before the failure (not an abrupt NaN from a normal loss, which a bad batch gives), within
    ``early_steps`` steps of the start.
    """
    if not ev.failed or ev.failure_step is None or strong(hyps):
        return ev, hyps
    s = ev.run.series("loss")
    if s is None or len(s) < 2:
        return ev, hyps
    first = int(s.steps[0])
    if ev.failure_step - first > W.early_steps:
        return ev, hyps
    fin = np.isfinite(s.values) & (s.steps <= ev.failure_step)
    v = s.values[fin]
    if v.size < 2 or float(np.max(v[1:])) <= float(v[0]):
        return ev, hyps
    k = int(np.flatnonzero(fin)[int(np.argmax(v[1:])) + 1])
    rise_from = int(s.steps[max(0, int(np.flatnonzero(fin)[int(np.argmin(v[:max(1, k)]))]))])
    onset = min(ev.failure_step, rise_from + 1)
    f = Finding(codes.EARLY_DIVERGENCE, codes.ENGINE_FINDINGS[codes.EARLY_DIVERGENCE], Cause.UPDATE_SCALE_GROWTH,
                Mechanism.LR_TOO_HIGH, onset, 0, W.early_divergence, Severity.HIGH,
                f"the loss rises from {v[0]:.4g} to {float(np.max(v[1:])):.4g} and the run fails at step "
                f"{ev.failure_step}, {ev.failure_step - first} steps after its first logged step: updates too large "
                "for the model from the start (peak lr)", {"failure_step": ev.failure_step, "first_step": first,
                                                          "onset_step": onset})
    ev = ev.with_family(Cause.UPDATE_SCALE_GROWTH, f, listed=True)
    return ev, hyps + [Hypothesis(Cause.UPDATE_SCALE_GROWTH, Mechanism.LR_TOO_HIGH, W.early_divergence,
                                  (f"{f.code} step {onset}: {f.message}",),
                                  ("no grad-norm or update series confirms it",))]
