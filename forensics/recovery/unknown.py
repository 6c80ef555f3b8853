"""What the planner does when no cause is named: arms that tell data, hardware and optimisation apart.

Replay unchanged (does the failure reproduce?), a lower lr with clipping, the batches around the onset
skipped; remedies the notes say already failed are left out (and said so), the notes' open ideas added.
A loss non-finite from the first logged step (``keys.FROM_START``, NF02) has no batch to skip and no healthy
step to resume from: the arms check the input data, the precision and the initialisation instead.
"""

from __future__ import annotations

from forensics.engine import keys
from forensics.model import Trial
from forensics.recovery._context import SKIP_BATCHES, Arms, PlanContext, notes_say_failed
from forensics.recovery._ideas import idea_trials


def _from_start(ctx: PlanContext) -> Arms:
    """The loss was never finite: check the data, the precision and the initialisation, one at a time."""
    steps = min(ctx.length, ctx.rewarm) or ctx.length
    trials = [
        Trial("check the data", "load the first batches without training and assert that inputs and labels are "
              "finite and in range (no NaN, no label outside the classes, no empty or fully masked batch)", 0, {}),
        Trial("fp32", "rerun the first steps in fp32 (no autocast, no fp16/bf16): a finite loss there points at "
              "the precision (an fp16 overflow, a log or division of zero)", steps, {"dtype": "float32"}),
        Trial("check the init", "rerun the first steps with the model's default initialisation and check that "
              "every parameter is finite after init and after loading any pretrained weights", steps, {}),
    ]
    return Arms((), tuple(trials), ("do not skip batches or resume from a checkpoint: no step of this run "
                                    "ever had a finite loss",))


def plan(ctx: PlanContext) -> Arms:
    """Replay, lower lr + clip, skip batches (each unless the notes say it failed), the notes' ideas."""
    if ctx.evidence.get(keys.FROM_START):
        return _from_start(ctx)
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
