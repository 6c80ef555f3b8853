"""What the planner does for a hardware or distributed fault: change the machine (or the collective), not the model.

* ``collective_bug``: DeepSpeed ``overlap_comm`` off (or a larger reduce bucket, another version).
* ``bad_rank`` (RK01: one rank left the others): resume from the last checkpoint before the onset (that rank's
  gradients entered the average from the onset on) with the rank's node excluded or replaced; a second arm
  replays that rank's data shard on a healthy device, which tells the device (the replay is healthy) from the
  shard (it departs again); judged by every rank staying with the ranks' median.
* otherwise: exclude (drain) the faulty node or GPU, burn it in, resume unchanged on the others.

Hyper-parameters, data and the checkpoint stay as they are.
"""

from __future__ import annotations

from forensics.model import Mechanism, Trial
from forensics.recovery._context import Arms, PlanContext


def _bad_rank(ctx: PlanContext) -> Arms:
    rank = ctx.evidence.get("rank")
    agree = ", ".join(map(str, ctx.evidence.get("agreeing_ranks") or [])) or "the other rank"  # type: ignore[call-overload]
    metric = ctx.evidence.get("metric", "loss")
    trials = (
        Trial("exclude the rank's node", f"exclude (or replace) the node/GPU that ran rank {rank}, run a GPU burn-in "
              "and memory test on it, and resume unchanged on healthy hardware with the same data order; judge: "
              f"every rank's {metric} stays with the ranks' median (`forensics analyze` finds no RK01) through "
              f"the onset at step {ctx.onset}", ctx.length, {"exclude_rank": rank, "exclude_node": True}),
        Trial("replay the rank's shard", f"replay rank {rank}'s data shard for the steps from {ctx.onset} on a "
              "healthy device (same checkpoint, same sampler state) and compare its samples with another rank's "
              "shard: a replay that departs again is the shard (corrupt or mis-tokenised data: fix or drop it); "
              "a healthy replay is the device", ctx.length, {"replay_rank_shard": rank, "skip_batches": None}),
    )
    return Arms((f"restore the data-sampler state of every rank so rank {rank}'s shard is replayed exactly",
                 "check that every rank loads the same weights (a corrupted rank trains out of sync)"), trials, (
        f"do not lower the lr or change hyper-parameters: rank(s) {agree} at the same lr are healthy",
        f"do not resume from a checkpoint at or after step {ctx.onset}: rank {rank}'s gradients entered the "
        "average from then on"))


def plan(ctx: PlanContext) -> Arms:
    """One arm on other hardware (or with the collective changed); nothing about the model changes."""
    if ctx.mechanism == Mechanism.BAD_RANK:
        return _bad_rank(ctx)
    if ctx.mechanism == Mechanism.COLLECTIVE_BUG:
        trial = Trial("overlap_comm off", "disable DeepSpeed overlap_comm (or raise reduce_bucket_size, or change "
                      "the deepspeed version) and resume unchanged otherwise", ctx.length, {"overlap_comm": False})
    else:
        trial = Trial("exclude the node", "exclude (drain) the faulty node/GPU, run a benchmark or GPU burn-in on "
                      "it, and resume unchanged on other nodes", ctx.length, {"exclude_node": True})
    return Arms((), (trial,), (
        "do not change hyper-parameters or go further back: the model is fine, the machine is not",
        "do not lower the lr and do not skip data: neither addresses a hardware fault"))
