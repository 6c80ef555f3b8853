"""The choice: lead-lag between strong families, then the symptom/cause corrections of DESIGN.md section 4.

:func:`choose` takes the earliest strong family (ties: the more confident) and applies, in order:

1. :func:`fp16_makes_overflow`: fp16 evidence makes growth an ``overflow`` (docs/tiny-runs.md#overflow).
2. :func:`collapse_follows_growth`: a loss-scale collapse after a grad-norm departure is update growth.
3. :func:`intentional_is_no_fault`: a deliberate lr change is never the chosen fault.
4. :func:`spike_after_growth`: a "bad batch" that growth precedes is the growth's spike.
5. :func:`growth_after_reset`: growth that starts after an lr reset is its consequence.
6. :func:`lower_lr_failed`: "lr too high" is not the answer when the notes say lower lrs failed.
7. :func:`one_bad_rank`: when one rank departs while the other ranks agree (RK01), the run-level growth, overflow,
   bad-batch or unknown readings are that rank's symptoms: the lr is the same on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from forensics.engine import codes, keys
from forensics.engine.chain import demoted
from forensics.engine.evidence import Evidence
from forensics.engine.rules import GROWTH_CAUSES
from forensics.engine.weights import WEIGHTS
from forensics.model import Cause, Hypothesis, Mechanism

W = WEIGHTS


@dataclass(frozen=True)
class Pick:
    """The state of the choice: evidence, the strong hypotheses in lead-lag order, the chosen one, all."""

    ev: Evidence
    strong: tuple[Hypothesis, ...]
    chosen: Hypothesis | None
    hyps: tuple[Hypothesis, ...]


def _capped(h: Hypothesis, cap: float, why: str) -> Hypothesis:
    return Hypothesis(h.cause, h.mechanism, min(h.confidence, cap), h.support, h.against + (why,))


def fp16_makes_overflow(p: Pick) -> Pick:
    """Rule 1: with an overflow family among the strong ones, growth chosen first becomes the overflow."""
    fams = {h.cause for h in p.strong}
    if p.chosen is not None and Cause.OVERFLOW in fams and p.chosen.cause == Cause.UPDATE_SCALE_GROWTH:
        return replace(p, chosen=next(h for h in p.strong if h.cause == Cause.OVERFLOW))
    return p


def collapse_follows_growth(p: Pick) -> Pick:
    """Rule 2: a loss-scale collapse after a grad-norm (update, attention-logit) departure is growth's symptom."""
    c = p.chosen
    if c is None or c.cause != Cause.OVERFLOW or c.mechanism != Mechanism.LOSS_SCALE_COLLAPSE:
        return p
    ov_step = p.ev.first_step(Cause.OVERFLOW)
    pre = [f for f in p.ev.findings if f.code in codes.GROWTH_LEADERS and f.step is not None
           and f.step < ov_step and f.confidence >= W.min_cause_conf
           and not f.evidence.get(keys.NONFINITE)]  # an inf grad norm on a skipped step is the overflow
    if not pre:
        return p
    g = pre[0]
    growth = Hypothesis(Cause.UPDATE_SCALE_GROWTH, Mechanism.LR_TOO_HIGH, W.collapse_growth,
                        (f"{g.code} step {g.step}: {g.message}",
                         f"the loss scale collapses only later, from step {ov_step}"), ())
    down = _capped(c, W.collapse_cap, f"the collapse follows a {g.name} departure at step {g.step}: "
                                      "overflow is the symptom, growing updates the cause")
    hyps = [down if h is c else h for h in p.hyps if h.cause != Cause.UPDATE_SCALE_GROWTH] + [growth]
    return Pick(p.ev.with_family(Cause.UPDATE_SCALE_GROWTH, g), (growth,), growth, tuple(hyps))


def intentional_is_no_fault(p: Pick) -> Pick:
    """Rule 3: a deliberate lr change (a new schedule) is never the chosen fault."""
    c = p.chosen
    if c is not None and c.cause == Cause.LR_SCHEDULE_RESET and c.mechanism == Mechanism.INTENTIONAL_CHANGE:
        rest = [h for h in p.strong if h is not c]
        return replace(p, chosen=rest[0] if rest else None)
    return p


def spike_after_growth(p: Pick) -> Pick:
    """Rule 4: a "bad batch" that growth (or an overflow) precedes is the growth's spike."""
    c = p.chosen
    if c is None or c.cause != Cause.DATA_BATCH or len(p.strong) <= 1:
        return p
    growth_h = [h for h in p.strong if h.cause in GROWTH_CAUSES
                and p.ev.first_step(h.cause) < p.ev.first_step(Cause.DATA_BATCH)]
    return replace(p, chosen=growth_h[0]) if growth_h else p


def growth_after_reset(p: Pick) -> Pick:
    """Rule 5: growth that starts after an lr reset is a consequence of the larger lr, not a second cause."""
    c = p.chosen
    if c is None or c.cause != Cause.LR_SCHEDULE_RESET:
        return p
    lr_step = p.ev.first_step(Cause.LR_SCHEDULE_RESET)
    why = f"starts after the lr discontinuity at step {lr_step}: a consequence of the larger lr"
    hyps = tuple(_capped(h, W.consequence_cap, why)
                 if h.cause == Cause.UPDATE_SCALE_GROWTH and p.ev.first_step(h.cause) > lr_step else h
                 for h in p.hyps)
    return replace(p, hyps=hyps, chosen=next(h for h in hyps if h.cause == Cause.LR_SCHEDULE_RESET))


def lower_lr_failed(p: Pick) -> Pick:
    """Rule 6: lower learning rates already tried and failed (notes): "lr too high" is not an explanation."""
    c = p.chosen
    notes = p.ev.get(codes.NOTES)
    failed_lr = any("lower_lr" in f.evidence.get(keys.FAILED_REMEDIES, {}) for f in notes)
    if c is None or c.cause != Cause.UPDATE_SCALE_GROWTH or c.mechanism != Mechanism.LR_TOO_HIGH or not failed_lr:
        return p
    ideas = {k for f in notes for k in f.evidence.get(keys.IDEAS, {})}
    down = _capped(c, W.failed_lr_cap, "the notes record lower learning rates that failed the same way")
    unknown = Hypothesis(Cause.UNKNOWN, Mechanism.INIT_SCALE if "init_std" in ideas else None, W.failed_lr_unknown,
                         ("the run diverges like an update-scale problem, yet lower lrs did not fix it",)
                         + (("the notes point to the initialisation scale as the open lead",)
                            if "init_std" in ideas else ()), ())
    ev = p.ev.with_family(Cause.UNKNOWN, seed=p.ev.family(Cause.UPDATE_SCALE_GROWTH))
    return replace(p, ev=ev, chosen=unknown, hyps=(*[down if h is c else h for h in p.hyps], unknown))


RANK_SYMPTOMS = (Cause.UPDATE_SCALE_GROWTH, Cause.OVERFLOW, Cause.DATA_BATCH, Cause.GRAD_SCALING_BUG, Cause.UNKNOWN)
"""Readings of the run-level series that one departing rank explains (its series is the run's, or its gradients
entered the average): none of them holds when the other ranks, at the same lr and on the same weights, agree."""


def one_bad_rank(p: Pick) -> Pick:
    """Rule 7: one rank departs while the others agree (RK01): its device or data shard, not the optimisation."""
    rk = [f for f in p.ev.get(codes.RANK) if f.confidence >= W.min_cause_conf]
    hw = next((h for h in p.hyps if h.cause == Cause.HARDWARE_OR_DISTRIBUTED and h.confidence >= W.min_cause_conf),
              None)
    if not rk or hw is None:
        return p
    f = rk[0]
    agree = ", ".join(map(str, f.evidence.get("agreeing_ranks") or [])) or "the other rank"
    why = (f"rank {f.evidence.get('rank')} alone departs from step {f.step} while rank(s) {agree}, at the same lr "
           "and on the same weights, stay healthy: the run-level series show that rank's fault")
    hyps = tuple(demoted(h, why) if h.cause in RANK_SYMPTOMS and h.confidence >= W.min_cause_conf else h
                 for h in p.hyps)
    hw = next(h for h in hyps if h.cause == Cause.HARDWARE_OR_DISTRIBUTED)
    chosen = hw if p.chosen is None or p.chosen.cause in RANK_SYMPTOMS else p.chosen
    return replace(p, hyps=hyps, chosen=chosen)


CORRECTIONS = (fp16_makes_overflow, collapse_follows_growth, intentional_is_no_fault, spike_after_growth,
               growth_after_reset, lower_lr_failed, one_bad_rank)
"""The corrections, in the order :func:`choose` applies them."""


def choose(ev: Evidence, hyps: list[Hypothesis]) -> tuple[Evidence, Hypothesis | None, list[Hypothesis]]:
    """Lead-lag between strong families, then :data:`CORRECTIONS`: ``(evidence, chosen or None, hypotheses)``."""
    strong = sorted((h for h in hyps if h.confidence >= W.min_cause_conf),
                    key=lambda h: (ev.first_step(h.cause), -h.confidence))
    if not strong:
        return ev, None, hyps
    p = Pick(ev, tuple(strong), strong[0], tuple(hyps))
    for fix in CORRECTIONS:
        p = fix(p)
    return p.ev, p.chosen, list(p.hyps)
