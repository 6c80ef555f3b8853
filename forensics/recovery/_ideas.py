"""Trial arms for the remedies the run folder's notes propose as open ideas (NT01)."""

from __future__ import annotations

from forensics.model import Trial
from forensics.recovery._context import PlanContext, clip_words

IDEA_CHARS = 200
"""A notes line quoted in a trial's settings is cut to this many characters."""
Z_LOSS = 1e-4
"""z-loss coefficient on log^2 Z of the output logits (PaLM; Wortsman et al. 2023)."""
Z_LOSS_TEXT = "1e-4"


def idea_trials(ctx: PlanContext) -> list[Trial]:
    """Trials for the remedies the notes list as open ideas."""
    ideas, length, fp16 = ctx.facts.ideas, ctx.length, ctx.fp16
    out = []
    if "init_std" in ideas:
        out.append(Trial("smaller init std", "restart FROM SCRATCH (the initialisation only acts at step 0) with a "
                         "smaller initialisation std (--init-method-std, e.g. 0.006 instead of 0.02), as the run's "
                         "notes propose", length,
                         {"init_std": "smaller", "notes": clip_words(ideas["init_std"][0], IDEA_CHARS)}))
    if "precision" in ideas:
        out.append(Trial("bf16" if fp16 else "fp32 softmax", "bf16 instead of fp16, or fp32 for the softmax/attention "
                         "(the notes propose it)", length, {"precision": "bf16" if fp16 else "fp32"}))
    if "qk_norm" in ideas:
        out.append(Trial("qk-layernorm", "add qk-layernorm (the notes propose it)", length, {"qk_layernorm": True}))
    if "z_loss" in ideas:
        out.append(Trial("z-loss", f"add z-loss {Z_LOSS_TEXT} (the notes propose it)", length, {"z_loss": Z_LOSS}))
    return out
