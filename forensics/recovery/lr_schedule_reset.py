"""What the planner does for an lr schedule reset at a resume: restore the scheduler (and optimizer) state.

The schedule, not its level, changed: resume with the scheduler restored (chainable schedulers derive the next
lr from the optimizer's param_groups, so the optimizer state too); for a changed decay horizon, an arm with
the first launch's horizon. Never lower the peak lr.
"""

from __future__ import annotations

from forensics.engine import keys
from forensics.model import Mechanism, Trial
from forensics.recovery._context import Arms, PlanContext


def plan(ctx: PlanContext) -> Arms:
    """Restore the scheduler and optimizer state; check the resumed lr against the schedule."""
    exp = ctx.evidence.get(keys.EXPECTED_LR)
    if ctx.evidence.get(keys.INSIDE_PROCESS):
        return _inside_process(ctx, exp)
    restore = (
        "restore the LR scheduler state (scheduler.load_state_dict) from the checkpoint"
        + (f"; the lr at step {ctx.onset} should be {float(exp):.4g}" if isinstance(exp, (int, float)) else ""),
        "restore the optimizer state (optimizer.load_state_dict) too: chainable schedulers derive the next lr "
        "from the optimizer's param_groups, so restoring only the scheduler is not enough",
        "check the resumed lr against the schedule on the first logged step before letting it run",
    )
    trials = [Trial("scheduler restored", "resume with the scheduler and optimizer state restored; nothing else "
                    "changed", ctx.length, {"restore_scheduler": True, "restore_optimizer": True})]
    if ctx.mechanism == Mechanism.HORIZON_CHANGE:
        trials.append(Trial("original horizon", "keep the original total steps / decay horizon of the first launch "
                            "(max_steps, num_train_epochs, lr-decay-iters)", ctx.length, {"keep_horizon": True}))
    return Arms(restore, tuple(trials), ("do not lower the peak lr: the schedule, not its level, changed",))


def _inside_process(ctx: PlanContext, exp: object) -> Arms:
    """The lr left its schedule inside one process, with no resume (user test U11): find what set it."""
    unit, at = ctx.facts.step_unit, ctx.onset
    lr = f" ({float(exp):.4g})" if isinstance(exp, (int, float)) else ""
    restore = (
        f"find what set the lr off its schedule at {unit} {at} inside one process, no resume set it: an lr "
        "callback (LearningRateScheduler, ReduceLROnPlateau, a custom hook), a hot-edited config, a manual "
        "change of the optimizer's param_groups; remove it",
        f"check the lr at {unit} {at} against the schedule{lr} on the first logged {unit} past it",
    )
    trials = [Trial("schedule's lr", f"resume before {unit} {at} with the schedule's lr{lr} kept through it; "
                    "nothing else changed", ctx.length, {"keep_schedule": True,
                                                          **({"lr_at_onset": float(exp)}
                                                             if isinstance(exp, (int, float)) else {})})]
    return Arms(restore, tuple(trials), ("do not lower the peak lr: the lr was set off the schedule, the schedule's "
                                         "level did not fail",))
