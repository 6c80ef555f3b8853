"""What the planner does for growing updates: a lower peak lr, a re-warm-up and clipping, or the mechanism's fix.

* ``attention_logit_growth``: qk-layernorm (Wortsman et al. 2023, Dehghani et al. 2023);
  ``output_logit_divergence``: z-loss or weight decay on the head, never a lower lr (the logits grow at a low lr).
* lr too high: a longer warm-up when the spikes come while the lr ramps up (WU01), peak lr x0.5 and x0.25 with
  a re-warm-up and global-norm clipping 1.0, bf16 when the run was fp16; the notes' open ideas.
* lower lrs already tried and failed (notes): what was not tried (the notes' ideas, else a smaller init std).
"""

from __future__ import annotations

import numpy as np

from forensics.engine import keys
from forensics.model import Mechanism, Trial
from forensics.recovery._context import LR_FACTORS, Arms, PlanContext, notes_say_failed
from forensics.recovery._ideas import Z_LOSS, Z_LOSS_TEXT, idea_trials

WARMUP_LONGER = 2
"""The longer warm-up arm reaches the same peak lr over this many times the logged warm-up."""
RESTORE = "restore optimizer and scheduler state from the checkpoint (only the trial knobs change)"
LR_MECHANISMS = (Mechanism.LR_TOO_HIGH, Mechanism.INIT_SCALE, None)
"""Mechanisms a lower lr addresses (None: the detector did not say)."""


def _lower_lr_failed(ctx: PlanContext) -> Arms:
    trials = idea_trials(ctx) or [
        Trial("smaller init std", "restart with a smaller initialisation std (e.g. --init-method-std 0.006 or "
              "sqrt(2/(5*hidden)); Le Scao et al. 2022, Takase et al. 'Spike No More')", ctx.length,
              {"init_std": "smaller"})]
    return Arms((RESTORE,), tuple(trials), (notes_say_failed(ctx, "lower_lr", "lower the lr"),))


def _lr_arms(ctx: PlanContext) -> list[Trial]:
    """Longer warm-up (when spikes came during the ramp and it fits in the trial), lower lrs, bf16, ideas."""
    out = []
    longer = WARMUP_LONGER * ctx.warmup
    if keys.SPIKE_STEPS in ctx.evidence and ctx.warmup and longer < ctx.length:  # WU01 (docs/detectors.md#wu01)
        out.append(Trial("longer warm-up", f"the same peak lr reached over a warm-up twice as long "
                         f"({longer} steps instead of {ctx.warmup}) and {ctx.clip_text}", ctx.length,
                         {"warmup_steps": longer, "clip_grad_norm": ctx.clip}))
    first, second = LR_FACTORS
    broke = _lr_at_onset(ctx)
    if broke is not None and ctx.peak_lr and broke < first * ctx.peak_lr:
        # the run broke while the lr was still below the first arm's peak: bound the arms by that lr (user test U12)
        scale = broke / ctx.peak_lr
        for f, lead in ((first, f"with a re-warm-up of {ctx.rewarm} steps"), (second, "with the same re-warm-up")):
            out.append(ctx.lr_trial(f * scale, f"peak lr {f * broke:.4g} (x{f:g} the lr {broke:.4g} "
                                    f"at which the run broke at step {ctx.onset}; x{f * scale:.3g} of the logged "
                                    f"peak {ctx.peak_lr:.4g}) {lead} and {ctx.clip_text}"))
    else:
        out.append(ctx.lr_trial(first, f"peak lr x{first:g} with a re-warm-up of {ctx.rewarm} steps and "
                                f"{ctx.clip_text}"))
        out.append(ctx.lr_trial(second, f"peak lr x{second:g} with the same re-warm-up and {ctx.clip_text}"))
    if ctx.fp16:
        out.append(Trial("bf16", "train in bf16 instead of fp16: loss-scale swings and 1e5 grad norms stop "
                         "mattering (BigScience's stable 176B run changed to bf16)", ctx.length, {"precision": "bf16"}))
    return out + idea_trials(ctx)


def _lr_at_onset(ctx: PlanContext) -> float | None:
    """The last finite logged lr at or before the onset, or None."""
    lr = ctx.run.series("lr")
    if lr is None:
        return None
    ok = np.flatnonzero(np.isfinite(lr.values) & (lr.values > 0) & (lr.steps <= ctx.onset))
    return float(lr.values[ok[-1]]) if ok.size else None


def plan(ctx: PlanContext) -> Arms:
    """The mechanism's fix, else lower lrs with a re-warm-up and clipping."""
    if ctx.mechanism in LR_MECHANISMS and ctx.failed("lower_lr"):
        return _lower_lr_failed(ctx)
    trials: list[Trial] = []
    if ctx.mechanism == Mechanism.ATTENTION_LOGIT_GROWTH:
        trials.append(Trial("qk-layernorm", "add qk-layernorm (LayerNorm on queries and keys before the dot "
                            "product; Wortsman et al. 2023, Dehghani et al. 2023) and resume",
                            ctx.length, {"qk_layernorm": True}))
    if ctx.mechanism == Mechanism.OUTPUT_LOGIT_DIVERGENCE:
        trials.append(Trial("z-loss", f"add z-loss {Z_LOSS_TEXT} * log^2 Z on the output logits (PaLM; Wortsman et "
                            "al. 2023), or a logit soft-cap", ctx.length, {"z_loss": Z_LOSS}))
        trials.append(Trial("weight decay on the head", "keep the lr; apply weight decay to the output layer "
                            "and check that the lm_head norm stops accelerating", ctx.length,
                            {"head_weight_decay": True}))
        return Arms((RESTORE,), tuple(trials), ("do not lower the lr: the divergence grows at a low lr; it is the "
                                                "logits, not the step size",))
    return Arms((RESTORE,), tuple(trials + _lr_arms(ctx)))
