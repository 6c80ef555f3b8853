"""What the planner does for a hardware or distributed fault: change the machine (or the collective), not the model.

* ``collective_bug``: DeepSpeed ``overlap_comm`` off (or a larger reduce bucket, another version).
* otherwise: exclude (drain) the faulty node or GPU, burn it in, resume unchanged on the others.

Hyper-parameters, data and the checkpoint stay as they are.
"""

from __future__ import annotations

from forensics.model import Mechanism, Trial
from forensics.recovery._context import Arms, PlanContext


def plan(ctx: PlanContext) -> Arms:
    """One arm on other hardware (or with the collective changed); nothing about the model changes."""
    if ctx.mechanism == Mechanism.COLLECTIVE_BUG:
        trial = Trial("overlap_comm off", "disable DeepSpeed overlap_comm (or raise reduce_bucket_size, or change "
                      "the deepspeed version) and resume unchanged otherwise", ctx.length, {"overlap_comm": False})
    else:
        trial = Trial("exclude the node", "exclude (drain) the faulty node/GPU, run a benchmark or GPU burn-in on "
                      "it, and resume unchanged on other nodes", ctx.length, {"exclude_node": True})
    return Arms((), (trial,), (
        "do not change hyper-parameters or go further back: the model is fine, the machine is not",
        "do not lower the lr and do not skip data: neither addresses a hardware fault"))
