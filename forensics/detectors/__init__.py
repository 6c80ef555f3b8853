"""The detector registry: one module per detector, listed in one explicit tuple.

Validated at import (unique codes and names), like sqlfluff's and bandit's registries.
"""

from __future__ import annotations

from forensics.detectors.activation_overflow import ActivationOverflow
from forensics.detectors.attention_logits import AttentionLogitGrowth
from forensics.detectors.bad_batch import BadBatch
from forensics.detectors.base import Detector
from forensics.detectors.ckpt_nonfinite import CheckpointNonFinite
from forensics.detectors.ckpt_state import CheckpointStateMismatch
from forensics.detectors.ckpt_update_growth import CheckpointUpdateGrowth
from forensics.detectors.data_ordering import OrderingShift
from forensics.detectors.grad_norm import GradNormDeparture
from forensics.detectors.grad_scaling import GradScalingFactor
from forensics.detectors.hardware import HardwareSignature
from forensics.detectors.integrity import Integrity
from forensics.detectors.loss_divergence import LossDivergence
from forensics.detectors.loss_scale import LossScaleCollapse
from forensics.detectors.loss_spike import LossSpike
from forensics.detectors.lr_schedule import LRScheduleReset
from forensics.detectors.nonfinite import NonFinite
from forensics.detectors.notes import NotesAttempts
from forensics.detectors.output_logits import OutputLogitDivergence
from forensics.detectors.precursor import PrecursorDrift
from forensics.detectors.resume_state import ResumeState
from forensics.detectors.stall import NoProgress
from forensics.detectors.update_ratio import UpdateScaleGrowth
from forensics.detectors.warmup import WarmupInstability

DETECTORS: tuple[Detector, ...] = (
    Integrity(),
    NonFinite(),
    LossSpike(),
    GradNormDeparture(),
    LossDivergence(),
    NoProgress(),
    LossScaleCollapse(),
    ActivationOverflow(),
    LRScheduleReset(),
    ResumeState(),
    WarmupInstability(),
    BadBatch(),
    OrderingShift(),
    UpdateScaleGrowth(),
    PrecursorDrift(),
    AttentionLogitGrowth(),
    OutputLogitDivergence(),
    HardwareSignature(),
    GradScalingFactor(),
    NotesAttempts(),
    CheckpointNonFinite(),
    CheckpointUpdateGrowth(),
    CheckpointStateMismatch(),
)


def _validate(detectors: tuple[Detector, ...]) -> None:
    codes = [d.code for d in detectors]
    names = [d.name for d in detectors]
    if len(set(codes)) != len(codes) or len(set(names)) != len(names):
        raise RuntimeError(f"duplicate detector codes or names: {codes} {names}")


_validate(DETECTORS)

__all__ = ["DETECTORS", "Detector"]
