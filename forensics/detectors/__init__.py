"""The detector registry: one module per detector, listed in one explicit tuple.

Validated at import (:func:`_validate`: code and dotted-name patterns, unique codes and names, a module
docstring with a Rule and a Source section), like sqlfluff's and bandit's registries.
"""

from __future__ import annotations

import re
import sys

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


CODE = re.compile(r"^[A-Z]{2,3}[0-9]{2}$")
"""A detector code: two or three capitals and two digits (``SP01``, ``INT01``)."""
DOTTED = re.compile(r"^[a-z][a-z0-9_]*\.[a-z][a-z0-9_]*$")
"""A dotted name: ``family.what`` in lower case (``loss.spike``)."""


def _validate(detectors: tuple[Detector, ...]) -> None:
    """Raise ``RuntimeError`` unless every detector has a well-formed, unique code and name and documents itself.

    The module docstring of each detector starts with ``CODE name:`` and has a ``Rule`` and a ``Source:``
    section (the citation of docs/detectors.md, where its thresholds and their origins are).
    """
    codes = [d.code for d in detectors]
    names = [d.name for d in detectors]
    if len(set(codes)) != len(codes) or len(set(names)) != len(names):
        raise RuntimeError(f"duplicate detector codes or names: {codes} {names}")
    for d in detectors:
        if not CODE.match(d.code) or not DOTTED.match(d.name):
            raise RuntimeError(f"detector {type(d).__name__}: code {d.code!r} or name {d.name!r} is malformed")
        doc = sys.modules[type(d).__module__].__doc__ or ""
        if not doc.startswith(f"{d.code} {d.name}:") or "Rule" not in doc or "Source:" not in doc:
            raise RuntimeError(f"detector {d.code}: its module docstring must start with '{d.code} {d.name}:' "
                               "and have a Rule and a Source: section")


_validate(DETECTORS)

__all__ = ["DETECTORS", "Detector"]
