"""What the planner does for an overflow: bf16 (or fp32 for the offending block), a finite checkpoint.

* ``nonfinite_state`` (NaN/inf in the weights or Adam moments of a checkpoint): resume from the newest
  checkpoint whose tensors are all finite, or keep the weights and rebuild the moments with lr=0 for
  5/(1-beta2) steps (BigScience); bf16 when the run was fp16.
* otherwise (an activation overflow or a loss-scale collapse): bf16 instead of fp16, or fp32 for the block
  that overflows; reset the loss scaler. A forward overflow is not fixed by a lower lr; a collapse that
  growing updates precede gets a lower-lr arm (and qk-layernorm when attention logits grew).
"""

from __future__ import annotations

from forensics.engine import keys
from forensics.model import Mechanism, Trial
from forensics.recovery._context import MOMENT_REBUILD, Arms, PlanContext

BF16 = Trial("bf16", "train in bf16 instead of fp16 (same range as fp32, no loss scaler needed)", 0,
             {"precision": "bf16"})


def _nonfinite_state(ctx: PlanContext) -> Arms:
    trials = [Trial("finite checkpoint", "resume unchanged from the verified finite checkpoint and watch the "
                    "optimizer state (non-finite checks on exp_avg/exp_avg_sq every save)", ctx.length, {}),
              Trial("rebuilt moments", f"load the weights, reset exp_avg/exp_avg_sq, run lr=0 for {MOMENT_REBUILD} "
                    "steps, then resume", ctx.length, {"reset_optimizer_moments": True})]
    if ctx.fp16:
        trials.append(Trial("bf16", "train in bf16 instead of fp16", ctx.length, {"precision": "bf16"}))
    return Arms(("resume from the newest checkpoint whose weights AND optimizer moments are all finite "
                 "(verified tensor by tensor)",
                 "if only the moments went bad: keep the weights, rebuild the Adam moments with lr=0 for "
                 f"{MOMENT_REBUILD} steps, then resume the schedule"),
                tuple(trials), ("never resume from a checkpoint with non-finite weights or optimizer moments",))


def plan(ctx: PlanContext) -> Arms:
    """bf16 / fp32 for the block, a reset loss scaler, and a lower lr only when growth precedes the overflow."""
    if ctx.mechanism == Mechanism.NONFINITE_STATE:
        return _nonfinite_state(ctx)
    ev = ctx.evidence
    module = ev.get(keys.MODULE) if "/" in str(ev.get(keys.METRIC, "")) else "attention scores (q.k) and softmax"
    trials = [Trial(BF16.name, BF16.change, ctx.length, BF16.settings),
              Trial("fp32 for the offending block", "keep fp16 but run the overflowing block (attention "
                    "softmax/scores or the FFN output) in fp32; unscale gradients before clipping",
                    ctx.length, {"precision": "fp16", "fp32_modules": module})]
    restore = ("never resume from a checkpoint with non-finite weights or optimizer moments",
               "reset the loss scaler to its initial scale on resume")
    growth = ev.get(keys.GROWTH_PRECURSOR)
    if ctx.mechanism == Mechanism.ACTIVATION_OVERFLOW and not growth:
        return Arms(restore, tuple(trials), ("do not lower the lr: the overflow is in the forward pass, a lower lr "
                                             "does not bound activations",))
    why = (f"{growth['mechanism']} from step {growth['step']} precedes the overflow"  # type: ignore[index]
           if isinstance(growth, dict) else "a loss-scale collapse is often a symptom of growing updates")
    trials.append(ctx.lr_trial(0.5, f"peak lr x0.5 with a re-warm-up and {ctx.clip_text} ({why})"))
    if isinstance(growth, dict) and growth.get("mechanism") == Mechanism.ATTENTION_LOGIT_GROWTH:
        trials.append(Trial("qk-layernorm", "add qk-layernorm so attention logits stay bounded in fp16",
                            ctx.length, {"qk_layernorm": True}))
    return Arms(restore, tuple(trials))
