"""What the planner does for a bad batch (or a bad data order): skip the batches, or fix the shuffle.

* ``ordering`` (a level shift in the training stream only): resume with a proper shuffle (a Feistel-network
  permutation, not an affine index map) and dump the batches around the onset.
* a recurring excursion (DB02, a period in the evidence): find and drop the data that comes back every period
  (skipping one range would meet it again next cycle), with a replay arm that predicts the next occurrence.
* otherwise: resume unchanged with the batches from the onset skipped (PaLM skipped 200-500 batches), and a
  replay arm that does not skip, to confirm the batch and rule out hardware. Never lower the lr.
"""

from __future__ import annotations

from forensics.engine import keys
from forensics.model import Mechanism, Trial
from forensics.recovery._context import SKIP_BATCHES, Arms, PlanContext

INSPECT_WINDOW = 200
"""Steps from the onset whose batches the "inspect the stream" arm dumps (the skip window)."""
LISTED = 6
"""Occurrences of a recurring excursion named in the trial's text."""


def _ordering(ctx: PlanContext) -> Arms:
    trials = (Trial("fix the data order", "resume with a proper shuffle of the sample order (a pseudo-random "
                    "permutation such as a Feistel network instead of an affine a*x+b mod N index permutation) "
                    "and compare the train loss with the failed run over the same steps", ctx.length,
                    {"shuffle": "feistel"}),
              Trial("inspect the stream", f"dump the batches around step {ctx.onset} and check for correlated runs "
                    "of documents from one source or a mixture boundary", 0,
                    {"inspect_batches": [ctx.onset, ctx.onset + INSPECT_WINDOW]}))
    return Arms(("restore the data-sampler state so both arms see the same tokens up to the onset",), trials,
                ("do not lower the lr: the eval loss and the lr are smooth, only the training stream changed",))


def _recurring(ctx: PlanContext, period: float) -> Arms:
    steps = [int(s) for s in ctx.evidence.get(keys.RECURRING_STEPS) or [ctx.onset]]  # type: ignore[union-attr]
    trials = (Trial("drop the recurring data", f"the loss excursions recur every ~{period:g} steps (steps "
                    f"{', '.join(map(str, steps[:LISTED]))}): dump the batches at those steps, find the samples or "
                    "shard they share, drop them from the dataset and resume; skipping one batch range would meet "
                    "them again next cycle", ctx.length, {"inspect_batches": steps, "drop_recurring": True}),
              Trial("replay", "resume unchanged to confirm the excursion comes back at the next predicted step "
                    f"{steps[-1] + int(round(period))}", ctx.length, {"skip_batches": None}))
    return Arms(("restore the data-sampler position so the predicted steps stay exact",), trials,
                ("do not lower the lr: the excursions follow the data's period, not the optimizer",))


def plan(ctx: PlanContext) -> Arms:
    """Skip the batches from the onset (named when logged) and replay without skipping."""
    if ctx.mechanism == Mechanism.ORDERING:
        return _ordering(ctx)
    period = ctx.evidence.get(keys.RECURRING_PERIOD)
    if isinstance(period, (int, float)) and period > 0:
        return _recurring(ctx, float(period))
    bi = ctx.evidence.get(keys.BATCH_INDEX)
    lo = ctx.onset if bi is None else int(bi)  # type: ignore[call-overload]
    skip = [lo, lo + SKIP_BATCHES - 1]
    named = f" (batch index {bi} at step {ctx.onset})" if bi is not None else ""
    trials = (Trial("skip batches", f"resume unchanged and skip the batches {skip[0]}..{skip[1]}{named} "
                    "(PaLM skipped 200-500 batches)", ctx.length, {"skip_batches": skip}),
              Trial("replay", "resume unchanged WITHOUT skipping to check the spike reproduces on the same "
                    "data (confirms the batch, rules out hardware)", ctx.length, {"skip_batches": None}))
    return Arms(("restore the data-sampler position so the skip range is exact",
                 "inspect the named samples (empty, repeated-token, fully masked or corrupt sequences)"), trials,
                ("do not lower the lr: nothing before the spike shows the optimizer was unstable",))
