"""What the planner does when no cause is named: arms that tell data, hardware and optimisation apart.

Replay unchanged (does the failure reproduce?), a lower lr with clipping, the batches around the onset
skipped; remedies the notes say already failed are left out (and said so), the notes' open ideas added.
"""

from __future__ import annotations

from forensics.model import Trial
from forensics.recovery._context import SKIP_BATCHES, Arms, PlanContext, notes_say_failed
from forensics.recovery._ideas import idea_trials


def plan(ctx: PlanContext) -> Arms:
    """Replay, lower lr + clip, skip batches (each unless the notes say it failed), the notes' ideas."""
    do_not = [notes_say_failed(ctx, "lower_lr", "lower the lr")] if ctx.failed("lower_lr") else []
    trials = [Trial("replay unchanged", "resume from the checkpoint unchanged to see whether the failure "
                    "reproduces (data or hardware) or not", ctx.length, {})]
    if not ctx.failed("lower_lr"):
        trials.append(Trial("lr x0.5 + clip", f"peak lr x0.5 with a re-warm-up and {ctx.clip_text}", ctx.length,
                            {"peak_lr_factor": 0.5, "warmup_steps": ctx.rewarm, "clip_grad_norm": ctx.clip}))
    if not ctx.failed("skip_data") and not ctx.failed("reshuffle_data"):
        hi = ctx.onset + SKIP_BATCHES - 1
        trials.append(Trial("skip batches", f"resume and skip the batches around the onset ({ctx.onset}..{hi})",
                            ctx.length, {"skip_batches": [ctx.onset, hi]}))
    return Arms((), tuple(trials + idea_trials(ctx)), tuple(do_not))
