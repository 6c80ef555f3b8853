"""What the planner does for a gradient-scaling bug: fix the constant factor and rerun.

The run is consistently mis-scaled from its first logged step (gradient accumulation normalised per
micro-batch, an adapter scale alpha/rank): fix the scaling and rerun from the start (or from the checkpoint
a mid-run log started from, :func:`forensics.recovery._resume.resume_point`). Neither a lower lr nor an
earlier checkpoint addresses it.
"""

from __future__ import annotations

from forensics.model import Trial
from forensics.recovery._context import Arms, PlanContext


def plan(ctx: PlanContext) -> Arms:
    """One arm: the scaling fixed, nothing else changed."""
    return Arms((), (Trial("fix the scaling", "fix the constant-factor scaling (e.g. upgrade transformers / patch "
                           "the loss normalisation by num_items_in_batch, or the adapter scale alpha/rank) and rerun",
                           ctx.length, {}),),
                ("do not lower the lr or go back to an earlier checkpoint: the run is consistently mis-scaled, "
                 "not unstable",))
