"""Result types shared by parsers, detectors, the engine and the reporters.

Everything here is a frozen dataclass (reporters render, they never patch results).
Leaf module: imports nothing from the rest of the project except :mod:`forensics.schema` and
:mod:`forensics.rundata` (the run container, :class:`RunData` and :class:`Series`, re-exported here).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import pyarrow as pa

from forensics.rundata import RunData, Series
from forensics.schema import empty_events, empty_metrics

__all__ = [
    "CAUSES", "SEVERITIES", "Analysis", "Cause", "Finding", "Hypothesis", "Mechanism", "ParseResult",
    "RecoveryPlan", "RunData", "Series", "Severity", "Skip", "SourceInfo", "Trial", "Verdict",
]


class Verdict(StrEnum):
    """What the run as a whole was judged to be (DESIGN.md section 5, ``verdict``).

    ``inconclusive``: the training objective (or the records needed to judge) was not found; see
    :mod:`forensics.objective`. Values compare equal to their JSON strings.
    """

    HEALTHY = "healthy"
    ANOMALY = "anomaly"
    TRANSIENT = "transient"
    INCONCLUSIVE = "inconclusive"


class Cause(StrEnum):
    """Cause families of DESIGN.md section 4; every report uses these names."""

    LR_SCHEDULE_RESET = "lr_schedule_reset"
    OVERFLOW = "overflow"
    DATA_BATCH = "data_batch"
    UPDATE_SCALE_GROWTH = "update_scale_growth"
    GRAD_SCALING_BUG = "grad_scaling_bug"
    STATE_NOT_RESTORED = "state_not_restored"
    HARDWARE_OR_DISTRIBUTED = "hardware_or_distributed"
    UNKNOWN = "unknown"


class Mechanism(StrEnum):
    """Mechanisms within a cause family (DESIGN.md section 4, the "mechanisms" column)."""

    # lr_schedule_reset
    RESET_TO_INITIAL = "reset_to_initial"
    OFFSET = "offset"
    HORIZON_CHANGE = "horizon_change"
    MISSING_WARMUP = "missing_warmup"
    INTENTIONAL_CHANGE = "intentional_change"  # recognised, NOT a fault
    # overflow
    ACTIVATION_OVERFLOW = "activation_overflow"
    LOSS_SCALE_COLLAPSE = "loss_scale_collapse"
    NONFINITE_STATE = "nonfinite_state"
    # data_batch
    BAD_BATCH = "bad_batch"
    DATA_REPLAY = "data_replay"
    ORDERING = "ordering"
    # update_scale_growth
    LR_TOO_HIGH = "lr_too_high"
    ATTENTION_LOGIT_GROWTH = "attention_logit_growth"
    OUTPUT_LOGIT_DIVERGENCE = "output_logit_divergence"
    ADAM_EPSILON = "adam_epsilon"
    INIT_SCALE = "init_scale"
    # grad_scaling_bug
    GA_NORMALISATION = "ga_normalisation"
    ACCUMULATION_SCALING = "accumulation_scaling"
    # state_not_restored
    WEIGHTS = "weights"
    OPTIMIZER_STATE = "optimizer_state"
    DATA_SAMPLER = "data_sampler"
    # hardware_or_distributed
    DEVICE_FAULT = "device_fault"
    COLLECTIVE_BUG = "collective_bug"
    SLOW_DEVICE = "slow_device"
    BAD_RANK = "bad_rank"


class Severity(StrEnum):
    """How bad one finding is, lowest first (:data:`SEVERITIES` keeps that order)."""

    INFO = "info"
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    CRITICAL = "critical"


CAUSES = tuple(c.value for c in Cause)
"""Cause families of DESIGN.md section 4, as plain strings (JSON values)."""

SEVERITIES = tuple(s.value for s in Severity)


@dataclass(frozen=True)
class Skip:
    """Something that was not read or not evaluated, and why (a result, never a crash).

    Attributes:
        what: The file (path relative to the run folder, with ``:offset`` or ``:line`` when
            known) or the detector code that was skipped.
        reason: One line for a person.
    """

    what: str
    reason: str


@dataclass(frozen=True)
class ParseResult:
    """What one parser read from one file (or one group of files).

    Attributes:
        format: Parser name, e.g. ``"tensorboard"``.
        path: Source path relative to the run folder.
        metrics: Table with :data:`forensics.schema.METRICS_SCHEMA`; ``segment`` is local to the
            source (0-based, a new one at each step rewind or resume marker); ``run`` may be ``""``.
        events: Table with :data:`forensics.schema.EVENTS_SCHEMA` (local segments too).
        meta: Configuration found in the file (hyper-parameters, precision, framework, ...).
        skipped: Damage found while reading: truncated tails, corrupt records, bad lines.
        precision: How precise the logged values are: ``"float64"``, ``"float32"``, ``"%.6E"``...
        ranks: Each rank's own values of the series compared across ranks
            (:data:`parsers.rank_files.RANK_SCHEMA`), when the file holds (or is one of) several ranks' logs;
            None otherwise.
    """

    format: str
    path: str
    metrics: pa.Table = field(default_factory=empty_metrics)
    events: pa.Table = field(default_factory=empty_events)
    meta: Mapping[str, Any] = field(default_factory=dict)
    skipped: tuple[Skip, ...] = ()
    precision: str = "float64"
    ranks: pa.Table | None = None


@dataclass(frozen=True)
class SourceInfo:
    """One file that was read: path relative to the run folder, format, records, segments."""

    path: str
    format: str
    records: int
    segments: int


@dataclass(frozen=True)
class Finding:
    """One detector's observation. Detectors report; the engine decides.

    Attributes:
        code: Stable detector code, e.g. ``"LR01"``.
        name: Dotted detector name, e.g. ``"lr.schedule_reset"``.
        cause: Cause family (:data:`CAUSES`) this finding argues for, or ``None`` for integrity
            notes that argue for no cause.
        mechanism: Finer label within the cause, or ``None``.
        step: The step the finding is about (its onset), or ``None``.
        segment: Segment of that step, or ``None``.
        confidence: 0..1, how sure the detector is that the cause applies.
        severity: One of :data:`SEVERITIES`.
        message: One sentence for a person, with the numbers.
        evidence: The numbers and steps that support it (JSON-serialisable).
        against: Evidence that argues against this cause (sentences).
    """

    code: str
    name: str
    cause: str | None
    mechanism: str | None
    step: int | None
    segment: int | None
    confidence: float
    severity: str
    message: str
    evidence: Mapping[str, Any] = field(default_factory=dict)
    against: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The JSON form of DESIGN.md section 7 (``findings[]``)."""
        return {
            "code": self.code, "name": self.name, "cause": self.cause, "mechanism": self.mechanism,
            "step": self.step, "segment": self.segment, "confidence": round(float(self.confidence), 3),
            "severity": self.severity, "message": self.message, "evidence": dict(self.evidence),
            "against": list(self.against),
        }


@dataclass(frozen=True)
class Hypothesis:
    """A ranked candidate cause with what argues for and against it."""

    cause: str
    mechanism: str | None
    confidence: float
    support: tuple[str, ...] = ()
    against: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``hypotheses[]``; ``support`` is written as ``for``)."""
        return {
            "cause": self.cause, "mechanism": self.mechanism, "confidence": round(float(self.confidence), 3),
            "for": list(self.support), "against": list(self.against),
        }


@dataclass(frozen=True)
class Trial:
    """One arm of a controlled recovery trial.

    Attributes:
        name: Short label, e.g. ``"lr x0.5 + re-warm-up"``.
        change: What differs from the failed run, as an action a person can take.
        steps: How many steps to run (through the onset plus a margin).
        settings: Machine-readable knobs: ``peak_lr_factor``, ``warmup_steps``, ``clip_grad_norm``,
            ``skip_batches`` ([lo, hi]), ``precision``, ...
    """

    name: str
    change: str
    steps: int
    settings: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``recovery.trials[]``)."""
        return {"name": self.name, "change": self.change, "steps": self.steps, "settings": dict(self.settings)}


@dataclass(frozen=True)
class RecoveryPlan:
    """The controlled recovery trial (DESIGN.md section 5).

    Attributes:
        resume_from: ``{"checkpoint": path | None, "step": int, "why": str}``.
        restore: State to restore or rebuild before resuming (sentences).
        trials: Two to four short arms.
        success_criteria: How to judge the arms, with numbers from the run's pre-onset statistics.
        do_not: What the evidence says NOT to do, each with why.
    """

    resume_from: Mapping[str, Any]
    restore: tuple[str, ...]
    trials: tuple[Trial, ...]
    success_criteria: tuple[str, ...]
    do_not: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``recovery``)."""
        return {
            "resume_from": dict(self.resume_from), "restore": list(self.restore),
            "trials": [t.to_dict() for t in self.trials], "success_criteria": list(self.success_criteria),
            "do_not": list(self.do_not),
        }

    def actions_text(self) -> str:
        """All recommended actions as one string (everything but ``do_not``), for matching."""
        rf = self.resume_from
        parts = [f"resume from {rf.get('checkpoint') or 'a checkpoint'} (step {rf.get('step')})",
                 str(rf.get("why", ""))]
        parts += list(self.restore)
        for t in self.trials:
            parts += [t.name, t.change]
        parts += list(self.success_criteria)
        return "\n".join(parts)


@dataclass(frozen=True)
class Analysis:
    """The engine's verdict on one run (DESIGN.md section 7)."""

    run: str
    verdict: Verdict
    cause: str | None
    mechanism: str | None
    confidence: float
    onset: Mapping[str, int] | None
    hypotheses: tuple[Hypothesis, ...]
    findings: tuple[Finding, ...]
    recovery: RecoveryPlan | None
    sources: tuple[SourceInfo, ...]
    skipped: tuple[Skip, ...]
    summary: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict)
