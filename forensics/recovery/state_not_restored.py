"""What the planner does when a resume did not restore the state: resume again and verify every state.

Weights, optimizer moments, scheduler and data sampler are checked against the checkpoint; lost Adam
moments are rebuilt with lr=0 for 5/(1-beta2) steps (BigScience) before the schedule resumes.
"""

from __future__ import annotations

from forensics.model import Trial
from forensics.recovery._context import MOMENT_REBUILD, Arms, PlanContext


def plan(ctx: PlanContext) -> Arms:
    """A verified resume."""
    return Arms(("resume again and verify what is loaded: weights, optimizer moments, scheduler, data sampler",
                 f"if optimizer moments were lost: run with lr=0 for {MOMENT_REBUILD} steps to rebuild them, "
                 "then resume"),
                (Trial("verified resume", "resume with every state verified against the checkpoint", ctx.length, {}),))
