"""The detector registry: one module per detector, listed in one explicit tuple.

Validated at import (:func:`_validate`: code and dotted-name patterns, unique codes and names, the module
named for the dotted name (``loss.spike`` lives in ``loss_spike.py``), a module docstring with a Rule and a
Source section), like sqlfluff's and bandit's registries. Only detectors live here (and ``base.py``, the
contract): helpers they share are in ``forensics/`` (``stats``, ``signals``, ``spike_shape``, ``resume_rows``,
``notes``).
"""

from __future__ import annotations

import re
import sys

from forensics.detectors.attention_logit_growth import AttentionLogitGrowth
from forensics.detectors.base import Detector
from forensics.detectors.checkpoint_nonfinite_state import CheckpointNonFinite
from forensics.detectors.checkpoint_state_mismatch import CheckpointStateMismatch
from forensics.detectors.checkpoint_update_growth import CheckpointUpdateGrowth
from forensics.detectors.data_bad_batch import BadBatch
from forensics.detectors.data_ordering_shift import OrderingShift
from forensics.detectors.data_recurring_batch import RecurringBatch
from forensics.detectors.grad_norm_departure import GradNormDeparture
from forensics.detectors.grad_scaling_constant_factor import GradScalingFactor
from forensics.detectors.hardware_signature import HardwareSignature
from forensics.detectors.integrity_segments import Integrity
from forensics.detectors.loss_divergence import LossDivergence
from forensics.detectors.loss_no_progress import NoProgress
from forensics.detectors.loss_spike import LossSpike
from forensics.detectors.lr_schedule_reset import LRScheduleReset
from forensics.detectors.lr_warmup_instability import WarmupInstability
from forensics.detectors.nonfinite_first import NonFinite
from forensics.detectors.notes_attempts import NotesAttempts
from forensics.detectors.output_logit_divergence import OutputLogitDivergence
from forensics.detectors.overflow_activation_range import ActivationOverflow
from forensics.detectors.overflow_loss_scale_collapse import LossScaleCollapse
from forensics.detectors.precursor_drift import PrecursorDrift
from forensics.detectors.rank_departure import RankDeparture
from forensics.detectors.resume_state import ResumeState
from forensics.detectors.update_scale_growth import UpdateScaleGrowth

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
    RecurringBatch(),
    OrderingShift(),
    UpdateScaleGrowth(),
    PrecursorDrift(),
    AttentionLogitGrowth(),
    OutputLogitDivergence(),
    HardwareSignature(),
    RankDeparture(),
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
        module = type(d).__module__
        if module.rsplit(".", 1)[-1] != d.name.replace(".", "_"):
            raise RuntimeError(f"detector {d.code}: module {module} must be named for its dotted name {d.name!r} "
                               f"({d.name.replace('.', '_')}.py)")
        doc = sys.modules[module].__doc__ or ""
        if not doc.startswith(f"{d.code} {d.name}:") or "Rule" not in doc or "Source:" not in doc:
            raise RuntimeError(f"detector {d.code}: its module docstring must start with '{d.code} {d.name}:' "
                               "and have a Rule and a Source: section")


_validate(DETECTORS)

__all__ = ["DETECTORS", "Detector"]
