"""Whether a proxy -> target change of one setting matters for transfer, and why: one rule per setting (:data:`WHY`).

Sources of the mechanisms: Wortsman et al. 2023, "Small-scale proxies for large-scale Transformer
training instabilities", arXiv 2309.14322 (attention-logit growth and qk-layernorm s3.1.1, output-logit
divergence and z-loss s3.1.2, warm-up s3.2.1, independent weight decay s3.2.2, muParam s3.2: numbers
checked against its table of contents; AdamW epsilon s3.4: as recalled, not checked); Yang et al. 2022
(muP/muTransfer), arXiv 2203.03466; Chowdhery et al. 2022 (PaLM z-loss), arXiv 2204.02311.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from forensics.config_diff._read import _num, same
from forensics.model_parts import FP16_MAX

# ----------------------------------------------------------------------------------------------- rules

W23 = "Wortsman et al. 2023, arXiv 2309.14322"


NORM_EPS_FACTOR = 100.0
"""A norm-epsilon change matters when it moves by more than this factor (then it can reach the activation
variance; our choice)."""


def _ratio(p: Any, t: Any) -> float | None:
    return _num(t) / fp if (fp := _num(p)) and _num(t) is not None else None  # type: ignore[operator]


def _x(r: float | None) -> str:
    return "" if r is None else f" (x{r:.3g})"


class Change(NamedTuple):
    """One proxy -> target change of a canonical setting, with both whole configs as context."""

    key: str
    p: Any
    t: Any
    pc: Mapping[str, Any]
    tc: Mapping[str, Any]


def _qk_layernorm(c: Change) -> tuple[bool, str]:
    """Rule for ``qk_layernorm``."""
    p, t = c.p, c.t
    if p and not t:
        return True, ("qk-layernorm dropped: without a norm on queries and keys the q.k logits grow with lr and "
                      f"scale until attention collapses to one-hot (attention-logit growth; {W23} s3.1.1; "
                      "Dehghani et al. 2023, arXiv 2302.05442)")
    return False, "qk-layernorm added in the target: a stabiliser, it cannot explain a target instability"


def _z_loss(c: Change) -> tuple[bool, str]:
    """Rule for ``z_loss``."""
    p, t = c.p, c.t
    if (_num(p) or 0) > 0 and not (_num(t) or 0) > 0:
        return True, ("z-loss dropped: nothing holds log Z near 0, so the output logits can drift away from the "
                      f"log-probabilities (output-logit divergence; {W23} s3.1.2; PaLM z-loss 1e-4 log^2 Z, "
                      "Chowdhery et al. 2022, arXiv 2204.02311)")
    return (_num(t) or 0) < (_num(p) or 0), "z-loss coefficient changed (output-logit control; " + W23 + " s3.1.2)"


def _peak_lr(c: Change) -> tuple[bool, str]:
    """Rule for ``peak_lr``."""
    p, t = c.p, c.t
    r = _ratio(c.p, c.t)
    return True, (f"peak lr {p} -> {t}{_x(r)}: Adam's update size scales with the lr; at high lr small models "
                  f"already show attention-logit growth and output-logit divergence ({W23} s3.1), and under "
                  "standard parametrisation the best lr moves with width (Yang et al. 2022, arXiv 2203.03466)")


def _warmup_steps(c: Change) -> tuple[bool, str]:
    """Rule for ``warmup_steps``, ``warmup_tokens``."""
    key, p, t, pc, tc = c.key, c.p, c.t, c.pc, c.tc
    r = _ratio(c.p, c.t)
    pb, tb = c.pc.get("global_batch_size"), c.tc.get("global_batch_size")
    ps, ts = pc.get("warmup_steps"), tc.get("warmup_steps")
    if key == "warmup_tokens" and same(ps, ts) and pb and tb and not same(pb, tb):
        return True, (f"warm-up kept at {ps} steps while the global batch went {pb} -> {tb}{_x(_ratio(pb, tb))}: "
                      f"warm-up tokens {p} -> {t}; the target reaches its peak lr after the same number of "
                      "updates, so if the lr was raised with the batch Adam gets no more steps to settle its "
                      f"moment estimates; longer warm-up lowers LR sensitivity, more so at scale ({W23} s3.2.1)")
    less = (_num(t) or 0) < (_num(p) or 0)
    return less, (f"warm-up {key.split('_')[1]} {p} -> {t}{_x(r)}: "
                  + ("fewer warm-up updates before the peak lr" if less else "a longer warm-up")
                  + f"; longer warm-up lowers LR sensitivity, more so for larger models ({W23} s3.2.1)")


def _global_batch_size(c: Change) -> tuple[bool, str]:
    """Rule for ``global_batch_size``."""
    p, t = c.p, c.t
    r = _ratio(c.p, c.t)
    return True, (f"global batch {p} -> {t}{_x(r)}: tokens per step and gradient noise change, so the lr and a "
                  "warm-up counted in steps tuned at the proxy's batch do not carry over unchanged")


def _grad_accum(c: Change) -> tuple[bool, str]:
    """Rule for ``grad_accum``."""
    p, t = c.p, c.t
    pb, tb = c.pc.get("global_batch_size"), c.tc.get("global_batch_size")
    same_b = pb is not None and tb is not None and same(pb, tb)
    return not same_b, (f"gradient accumulation {p} -> {t}" + (
        " with the same global batch: harmless unless the loss is not divided by the number of micro-batches "
        "(a constant-factor gradient scaling bug)" if same_b else
        ": the global batch changes with it (see global_batch_size)"))


def _eps(c: Change) -> tuple[bool, str]:
    """Rule for ``eps``."""
    p, t = c.p, c.t
    return True, (f"AdamW epsilon {p} -> {t}: when a parameter's gradient RMS falls towards epsilon (it shrinks "
                  "with width and depth) the update collapses; epsilon 1e-15 instead of 1e-8 fixed it "
                  f"({W23}, AdamW epsilon, s3.4)")


def _beta1(c: Change) -> tuple[bool, str]:
    """Rule for ``beta1``, ``beta2``, ``optimizer``."""
    key, p, t = c.key, c.p, c.t
    return True, (f"{key} {p} -> {t}: the optimizer state sets how fast the update follows a sudden gradient "
                  "change; a slow second moment (beta2 0.999) lets the update blow up when gradients grow "
                  f"(the large-run recipe is (0.9, 0.95), {W23} s2.1)")


def _precision(c: Change) -> tuple[bool, str]:
    """Rule for ``precision``."""
    p, t = c.p, c.t
    if "fp16" in (p, t):
        return True, (f"precision {p} -> {t}: fp16 overflows above {FP16_MAX:.0f}, so growing attention or output "
                      "logits become inf (activation overflow, loss-scale collapse); bf16 keeps fp32's range "
                      "(Micikevicius et al. 2018, arXiv 1710.03740)")
    return True, f"precision {p} -> {t}: fewer mantissa bits round small updates away (bf16 has 8)"


def _d_model(c: Change) -> tuple[bool, str]:
    """Rule for ``d_model``."""
    p, t, pc, tc = c.p, c.t, c.pc, c.tc
    r = _ratio(c.p, c.t)
    if pc.get("mup") and tc.get("mup"):
        return False, f"width {p} -> {t}{_x(r)} with muP on both: the lr is meant to transfer (Yang et al. 2022)"
    return True, (f"width {p} -> {t}{_x(r)} without muP: under standard parametrisation the optimal lr shifts "
                  "with width, so the proxy's lr does not transfer (Yang et al. 2022, arXiv 2203.03466, "
                  f"muTransfer); wider models grow attention logits at lower lr ({W23} s3.1.1)")


def _n_layers(c: Change) -> tuple[bool, str]:
    """Rule for ``n_layers``."""
    p, t = c.p, c.t
    r = _ratio(c.p, c.t)
    return True, (f"depth {p} -> {t}{_x(r)}: instabilities set in at lower lr in deeper models ({W23}); the "
                  "proxy's lr does not transfer across depth without a depth-aware parametrisation")


def _n_heads(c: Change) -> tuple[bool, str]:
    """Rule for ``n_heads``."""
    p, t = c.p, c.t
    return True, (f"heads {p} -> {t}: the head dimension d_model/n_heads changes the 1/sqrt(d_head) scale of the "
                  "attention logits")


def _mup(c: Change) -> tuple[bool, str]:
    """Rule for ``mup``."""
    p, t = c.p, c.t
    return True, (f"muP {p} -> {t}: lr transfer across width holds only under muP (Yang et al. 2022); muParam "
                  f"lowers but does not remove LR sensitivity ({W23} s3.2)")


def _weight_decay(c: Change) -> tuple[bool, str]:
    """Rule for ``weight_decay``."""
    p, t = c.p, c.t
    less = (_num(t) or 0) < (_num(p) or 0)
    return less, (f"weight decay {p} -> {t}: less decay lets parameter norms, and with them attention and "
                  f"output logits, grow; independent weight decay lowers LR sensitivity ({W23} s3.2.2)")


def _init_std(c: Change) -> tuple[bool, str]:
    """Rule for ``init_std``."""
    p, t = c.p, c.t
    r = _ratio(c.p, c.t)
    return True, (f"init std {p} -> {t}{_x(r)}: a larger init raises the initial activations and logits and "
                  "lowers the stable lr (Takase et al. 2023, arXiv 2312.16903)")


def _clip_grad_norm(c: Change) -> tuple[bool, str]:
    """Rule for ``clip_grad_norm``."""
    p, t = c.p, c.t
    looser = not (_num(t) or 0) or ((_num(p) or 0) > 0 and (_num(t) or 0) > (_num(p) or 0))
    return looser, (f"global-norm clipping {p} -> {t}: clipping bounds the update of a spike; "
                    + ("the target clips less or not at all" if looser else "the target clips tighter"))


def _seq_len(c: Change) -> tuple[bool, str]:
    """Rule for ``seq_len``."""
    p, t = c.p, c.t
    return True, (f"sequence length {p} -> {t}: tokens per step and warm-up tokens change, and each query "
                  "attends over more keys, so the largest attention logit grows")


def _norm(c: Change) -> tuple[bool, str]:
    """Rule for ``norm``."""
    p, t = c.p, c.t
    return True, (f"normalisation {p} -> {t}: post-LN needs warm-up and is less stable than pre-LN (Xiong et al. "
                  "2020, arXiv 2002.04745)")


def _norm_eps(c: Change) -> tuple[bool, str]:
    """Rule for ``norm_eps``."""
    p, t = c.p, c.t
    r = _ratio(c.p, c.t)
    big = r is not None and (r > NORM_EPS_FACTOR or r < 1 / NORM_EPS_FACTOR)
    return big, f"norm epsilon {p} -> {t}: matters only when it is comparable to the activation variance"


def _total_steps(c: Change) -> tuple[bool, str]:
    """Rule for ``total_steps``."""
    p, t = c.p, c.t
    return False, (f"total steps {p} -> {t}: the decay horizon moves, so the lr at a matched step differs after "
                   "warm-up; not a stability change by itself")


WHY: Mapping[str, Callable[[Change], tuple[bool, str]]] = MappingProxyType({
    "qk_layernorm": _qk_layernorm,
    "z_loss": _z_loss,
    "peak_lr": _peak_lr,
    "warmup_steps": _warmup_steps,
    "warmup_tokens": _warmup_steps,
    "global_batch_size": _global_batch_size,
    "grad_accum": _grad_accum,
    "eps": _eps,
    "beta1": _beta1,
    "beta2": _beta1,
    "optimizer": _beta1,
    "precision": _precision,
    "d_model": _d_model,
    "n_layers": _n_layers,
    "n_heads": _n_heads,
    "mup": _mup,
    "weight_decay": _weight_decay,
    "init_std": _init_std,
    "clip_grad_norm": _clip_grad_norm,
    "seq_len": _seq_len,
    "norm": _norm,
    "norm_eps": _norm_eps,
    "total_steps": _total_steps,
})
"""Canonical setting -> the rule that says whether its change matters for transfer, and why (mechanism, source)."""


def why_matters(key: str, p: Any, t: Any, pc: Mapping[str, Any], tc: Mapping[str, Any]) -> tuple[bool, str]:
    """Whether a proxy -> target change of one setting matters for transfer, and why (mechanism, source).

    Args:
        key: Canonical setting.
        p: Proxy value (``None`` when not recorded).
        t: Target value (``None`` when not recorded).
        pc: The proxy's whole canonical config (context: batch, muP...).
        tc: The target's whole canonical config.

    Returns:
        ``(matters, why)``.
    """
    rule = WHY.get(key)
    if rule is not None:
        return rule(Change(key, p, t, pc, tc))
    return True, f"{key} {p} -> {t}: the lr schedule differs after warm-up"
