"""The recovery planner: a controlled recovery trial for each cause (DESIGN.md section 5).

One module per cause answers "what do we do for it" (:data:`PLANNERS`): :mod:`.lr_schedule_reset`,
:mod:`.overflow`, :mod:`.data_batch`, :mod:`.update_scale_growth`, :mod:`.grad_scaling_bug`,
:mod:`.state_not_restored`, :mod:`.hardware_or_distributed`, :mod:`.unknown`. Shared parts: where to resume and
for how long (:mod:`._resume`), the success criteria (:mod:`._criteria`), the framework's launch arguments
(:mod:`._launch_args`). A transient anomaly gets a monitoring plan (:func:`monitor_plan`).

Literature behind the defaults (docs/detectors.md#recovery-trial): resume from the newest checkpoint at least
100 steps before the onset (PaLM, arXiv 2204.02311 section 5.1); short arms run through the onset plus a
margin: unchanged with the onset's batches skipped (PaLM skipped 200-500 batches), peak lr x0.5 and x0.25 with
a re-warm-up, global-norm clipping 1.0 (OPT-175B logbook; Wortsman et al. 2023 defaults), bf16 instead of
fp16; rebuilding lost Adam moments with lr=0 for 5/(1-beta2) steps (BigScience). Success criteria come from
the run's own pre-onset statistics.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

from forensics.engine import keys
from forensics.facts import RunFacts, run_facts
from forensics.model import Cause, Finding, Mechanism, RecoveryPlan, RunData, Trial
from forensics.recovery import (
    data_batch,
    grad_scaling_bug,
    hardware_or_distributed,
    lr_schedule_reset,
    overflow,
    state_not_restored,
    unknown,
    update_scale_growth,
)
from forensics.recovery._context import CLIP_BITES, CLIP_NORM, Arms, PlanContext, Planner, notes_say_failed
from forensics.recovery._criteria import Criterion, criteria, fitting, pre_onset_stats
from forensics.recovery._launch_args import with_launch_args
from forensics.recovery._resume import finite_checkpoints, resume_point, trial_length

PLANNERS: Mapping[Cause, Planner] = MappingProxyType({
    Cause.LR_SCHEDULE_RESET: lr_schedule_reset.plan,
    Cause.OVERFLOW: overflow.plan,
    Cause.DATA_BATCH: data_batch.plan,
    Cause.UPDATE_SCALE_GROWTH: update_scale_growth.plan,
    Cause.GRAD_SCALING_BUG: grad_scaling_bug.plan,
    Cause.STATE_NOT_RESTORED: state_not_restored.plan,
    Cause.HARDWARE_OR_DISTRIBUTED: hardware_or_distributed.plan,
    Cause.UNKNOWN: unknown.plan,
})
"""Cause -> its planner (exhaustive over :class:`forensics.model.Cause`; a test checks it)."""

MAX_TRIALS = 4
"""Arms in one plan at most (DESIGN.md section 5: two to four short arms)."""
REWARM_MIN = 50
"""Shortest re-warm-up of a lower-lr arm, when the run logged a warm-up (our choice)..."""
REWARM_MAX = 2000
"""...and the longest (our choice), before the cap by the trial length."""
REWARM_DEFAULT = 100
"""Re-warm-up when the run's warm-up is unknown (our choice)."""
REWARM_SHARE = 4
"""A re-warm-up is at most 1/REWARM_SHARE of the trial: always shorter than the trial."""
MONITOR_STEPS = 1000
"""Steps a transient anomaly is monitored over (our choice)."""

_finite_checkpoints = finite_checkpoints  # the name tests and older callers use


def _rewarm(warm: int, length: int) -> int:
    """Re-warm-up steps: the run's warm-up within [REWARM_MIN, REWARM_MAX], at most a quarter of the trial."""
    rewarm = max(REWARM_MIN, min(warm, REWARM_MAX)) if warm else REWARM_DEFAULT
    return max(1, min(rewarm, length // REWARM_SHARE))


def _context(run: RunData, facts: RunFacts, cause: str, mechanism: str | None, onset: int,
             evidence: Mapping[str, object], stats: dict[str, float]) -> PlanContext:
    length, resume = trial_length(facts, onset, resume_point(run, facts, cause, mechanism, onset,
                                                             inside_process=bool(evidence.get(keys.INSIDE_PROCESS))))
    warm = int(stats.get("warmup_steps", 0) or 0)
    gmed = stats.get("grad_norm_median")
    clip = CLIP_NORM if gmed is None or gmed < CLIP_BITES else None
    clip_text = (f"global-norm clipping {CLIP_NORM}" if clip else
                 f"the run's current clipping (pre-onset grad norms, median {gmed or 0:.4g}, are far above "
                 f"{CLIP_NORM}: a threshold of {CLIP_NORM} would rescale every step)")
    return PlanContext(run, facts, cause, mechanism, onset, MappingProxyType(dict(evidence)), resume, length,
                       stats.get("peak_lr"), warm, _rewarm(warm, length), clip, clip_text)


def _from_scratch(arms: Arms) -> Arms:
    """A restart from step 0: nothing to restore; every arm from the same initialisation and data order."""
    restore = [r for r in arms.restore if "checkpoint" not in r and "resum" not in r]
    restore.append("start every arm from the same initialisation and data order (same seed) so they compare")
    trials = tuple(Trial(t.name, t.change.replace(" and resume", " and rerun from the start"), t.steps, t.settings)
                   for t in arms.trials)
    return Arms(tuple(restore), trials, arms.do_not)


def plan(run: RunData, cause: str | None, mechanism: str | None, onset: int | None,
         evidence: Mapping[str, object] | None = None, *, transient: bool = False, facts: RunFacts | None = None,
         findings: Sequence[Finding] = ()) -> RecoveryPlan | None:
    """Build the recovery plan for one diagnosis.

    Args:
        run: The run (for checkpoints and pre-onset statistics).
        cause: Chosen cause family, or None when healthy (then no plan).
        mechanism: Mechanism within the cause.
        onset: First anomalous step.
        evidence: Evidence of the chosen cause's main finding (expected lr, batch index, ...).
        transient: The anomaly recovered by itself: monitor, do not go back to a checkpoint.
        facts: The run's facts (computed here when None).
        findings: The analysis' findings (a criterion the failed run already met is not a criterion).

    Returns:
        A :class:`RecoveryPlan`, or None for a healthy run.
    """
    if cause is None or onset is None:
        return None
    facts = facts or run_facts(run)
    if transient:
        return monitor_plan(run, onset)
    stats = pre_onset_stats(run, onset)
    ctx = _context(run, facts, cause, mechanism, onset, evidence or {}, stats)
    arms = PLANNERS.get(cause, unknown.plan)(ctx)  # type: ignore[call-overload]
    if ctx.failed("skip_data") and cause != Cause.DATA_BATCH:
        arms = Arms(arms.restore, arms.trials, (*arms.do_not, notes_say_failed(ctx, "skip_data", "skip data")))
    if ctx.resume.get("checkpoint") is None and ctx.resume.get("step") == 0:
        arms = _from_scratch(arms)
    trials = [with_launch_args(t, facts.framework, ctx.resume) for t in {t.name: t for t in arms.trials}.values()]
    crit = criteria(stats, ctx.length, unit=facts.step_unit, cause=cause,
                    expected_lr=ctx.evidence.get(keys.EXPECTED_LR), onset=onset,
                    resumed=not ctx.evidence.get(keys.INSIDE_PROCESS))
    if mechanism == Mechanism.BAD_RANK:  # judged across ranks: the run-level series were the bad rank's
        crit.insert(0, Criterion("", "ranks", f"every rank's {ctx.evidence.get('metric', 'loss')} stays with the "
                                 "ranks' median through the trial: `forensics analyze` on it finds no rank departing "
                                 "(RK01)"))
    length = max((t.steps for t in trials[:MAX_TRIALS]), default=0)
    return RecoveryPlan(resume_from=dict(ctx.resume), restore=arms.restore, trials=tuple(trials[:MAX_TRIALS]),
                        success_criteria=fitting(crit, run, onset, length, findings), do_not=arms.do_not)


def monitor_plan(run: RunData, onset: int) -> RecoveryPlan:
    """Plan for a transient anomaly: keep training and monitor; nothing to undo."""
    stats = pre_onset_stats(run, onset)
    last = int(run.metrics.get_column("step").max()) if run.metrics.height else onset  # type: ignore[arg-type]
    crit = [c.text for c in criteria(stats, MONITOR_STEPS)][:-1]
    crit.append(f"`forensics analyze` on the continuing run stays healthy over the next {MONITOR_STEPS} steps")
    return RecoveryPlan(
        resume_from={"checkpoint": None, "step": last,
                     "why": "no resume needed: the run recovered by itself; keep training from where it is"},
        restore=(),
        trials=(Trial("monitor", "keep training and monitor the loss and grad norm; if a second spike "
                      "follows within a few thousand steps, treat it as an anomaly and analyse again", MONITOR_STEPS,
                      {"action": "monitor"}),),
        success_criteria=tuple(crit),
        do_not=("do not go back to an earlier checkpoint or change hyper-parameters for a spike that recovered",),
    )


__all__ = ["MAX_TRIALS", "PLANNERS", "Arms", "PlanContext", "Planner", "monitor_plan", "plan"]
