"""Which rival explanations of a diagnosis the logged evidence could check: the coverage that caps its confidence.

A diagnosis is only as strong as the alternatives it could rule out. A NaN with the loss alone reads the same
whether a batch, an lr blow-up or an fp16 overflow caused it; a loss jump at a resume reads the same whether the
optimizer state or the lr scheduler was not restored. So the confidence of a fault is capped by the share of
its *rivals* (the causes that produce the same observable pattern) for which at least one signal that tells
them apart was logged. A rival no commonly logged signal can tell apart (a hardware fault behind a one-step
spike: only a replay shows it, which the recovery plan asks for) is not listed: it would cap every run alike
and say nothing about this one.

The table is domain reasoning, fixed before any corpus was scored with it (sources per row, docs/detectors.md
#coverage):

* a spike or NaN blamed on a **batch** could be an lr jump (``lr``) or the end of an update-scale growth
  (its precursor shows in ``grad_norm``, ``update_ratio``, ``param_norm``, attention or output logits: OPT-175B
  logbook, Wortsman et al. 2023); a NaN could be an fp16 overflow (``loss_scale`` / ``skipped_step``, or the
  precision known not to be fp16);
* a jump at a resume blamed on **state not restored** could be the lr scheduler (``lr``) and, when it is a NaN,
  a loss scaler restarted at its initial scale (``loss_scale``);
* an **lr schedule reset** is read from ``lr`` itself, against the resume's state (RS01 reads the loss): no
  rival left unchecked when it fires;
* an **overflow** could be an lr blow-up (``lr``) or a growth (``grad_norm``, ``update_ratio``, logits);
* an **update-scale growth** could be driven by the lr (``lr``); a NaN at its end by fp16 (``loss_scale``);
* a **grad-scaling bug** (train/eval loss at a constant factor) could be an lr change (``lr``);
* a **hardware or distributed** fault could be a growth (``grad_norm``, ``update_ratio``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from forensics.model import Cause

GROWTH_SIGNALS = ("grad_norm", "update_ratio", "param_norm", "attn_logit_max", "output_logit_max")
"""Signals in which an update-scale growth shows before the loss does (Wortsman et al. 2023, sections 3.1-3.4)."""
OVERFLOW_SIGNALS = ("loss_scale", "skipped_step")
"""Signals of a dynamic fp16 loss scaler (PyTorch GradScaler, DeepSpeed, Megatron: halvings and skipped steps)."""


@dataclass(frozen=True)
class Rival:
    """A cause that produces the same observable pattern as the diagnosed one, and what tells them apart.

    Attributes:
        cause: The rival cause.
        signals: Canonical metrics; any one of them logged checks the rival.
        nonfinite_only: The rival matters only when the diagnosed pattern is a non-finite loss or grad norm.
        ruled_out_by_precision: Precision known not to be fp16 checks it too (an fp16-only failure).
    """

    cause: Cause
    signals: tuple[str, ...]
    nonfinite_only: bool = False
    ruled_out_by_precision: bool = False


_LR = Rival(Cause.LR_SCHEDULE_RESET, ("lr",))
_GROWTH = Rival(Cause.UPDATE_SCALE_GROWTH, GROWTH_SIGNALS)
_FP16 = Rival(Cause.OVERFLOW, OVERFLOW_SIGNALS, nonfinite_only=True, ruled_out_by_precision=True)

RIVALS: dict[Cause, tuple[Rival, ...]] = {
    Cause.DATA_BATCH: (_LR, _GROWTH, _FP16),
    Cause.STATE_NOT_RESTORED: (_LR, _FP16),
    Cause.LR_SCHEDULE_RESET: (),
    Cause.OVERFLOW: (_LR, _GROWTH),
    Cause.UPDATE_SCALE_GROWTH: (_LR, _FP16),
    Cause.GRAD_SCALING_BUG: (_LR,),
    Cause.HARDWARE_OR_DISTRIBUTED: (Rival(Cause.UPDATE_SCALE_GROWTH, ("grad_norm", "update_ratio")),),
}
"""Diagnosed cause -> its rivals (module docstring). A transient without a cause is judged as a batch."""


def rivals_checked(cause: str | None, has: Callable[[str], bool], nonfinite: bool,
                   fp16: bool | None) -> tuple[float, list[str], list[str]]:
    """The share of the diagnosis's rivals that a logged signal could check, and which were not.

    Args:
        cause: The diagnosed cause (None for a transient without one: judged as a batch).
        has: ``metric -> bool``, True when the run logged that canonical metric (``RunData.has``).
        nonfinite: The diagnosed pattern includes a non-finite loss or grad norm (NF01 fired).
        fp16: The run's precision is fp16 (True), known not fp16 (False), or unknown (None).

    Returns:
        ``(share, checked, unchecked)``: share in [0, 1] (1.0 when the cause has no rival), the rival causes
        checked, and one line per rival not checked naming the signals that would have.
    """
    if cause == Cause.UNKNOWN:
        return 1.0, [], []
    table = RIVALS.get(Cause(cause), ()) if cause in set(Cause) else RIVALS[Cause.DATA_BATCH]
    live = [r for r in table if nonfinite or not r.nonfinite_only]
    checked: list[str] = []
    unchecked: list[str] = []
    for r in live:
        if any(has(m) for m in r.signals) or (r.ruled_out_by_precision and fp16 is False):
            checked.append(str(r.cause))
        else:
            unchecked.append(f"{r.cause} (log {' or '.join(r.signals)})")
    share = len(checked) / len(live) if live else 1.0
    return share, checked, unchecked

