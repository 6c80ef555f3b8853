"""Result types shared by parsers, detectors, the engine and the reporters.

Everything here is a frozen dataclass (reporters render, they never patch results).
Leaf module: imports nothing from the rest of the project except :mod:`forensics.schema`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from forensics.schema import empty_events, empty_metrics


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
    """

    format: str
    path: str
    metrics: pa.Table = field(default_factory=empty_metrics)
    events: pa.Table = field(default_factory=empty_events)
    meta: Mapping[str, Any] = field(default_factory=dict)
    skipped: tuple[Skip, ...] = ()
    precision: str = "float64"


@dataclass(frozen=True)
class SourceInfo:
    """One file that was read: path relative to the run folder, format, records, segments."""

    path: str
    format: str
    records: int
    segments: int


@dataclass(frozen=True)
class Series:
    """One metric as a time line, ready for detection.

    ``steps``/``values`` are the *effective* timeline: rows superseded by a later segment
    (TensorBoard's purge rule: a record at step s supersedes earlier records with step >= s)
    are dropped, the rest sorted by step. ``segments`` gives each point's segment.

    Attributes:
        metric: Canonical metric name.
        steps: int64 array, strictly increasing.
        values: float64 array (NaN/inf kept as logged, null as NaN).
        segments: int32 array, same length.
        source: The file the values came from (the most precise source for this metric).
    """

    metric: str
    steps: np.ndarray
    values: np.ndarray
    segments: np.ndarray
    source: str

    def __len__(self) -> int:
        return int(self.steps.shape[0])


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


@dataclass
class RunData:
    """Everything read from one run folder. Built by :func:`parsers.discover.load_run`.

    Attributes:
        run: The run folder as given.
        metrics: Long metrics table (polars) with global segments.
        events: Events table (polars) with global segments.
        meta: Merged configuration and facts (``precision``, ``framework``, hyper-parameters).
        sources: Files read.
        skipped: Files or records not read, and why.
        tensors: Per-checkpoint tensor statistics (:data:`forensics.schema.TENSORS_SCHEMA`), may be empty.
        updates: Update ratios between consecutive checkpoints (:data:`forensics.schema.UPDATES_SCHEMA`).
    """

    run: str
    metrics: pl.DataFrame
    events: pl.DataFrame
    meta: dict[str, Any]
    sources: list[SourceInfo]
    skipped: list[Skip]
    tensors: pl.DataFrame = field(default_factory=pl.DataFrame)
    updates: pl.DataFrame = field(default_factory=pl.DataFrame)
    _cache: dict[str, Series | None] = field(default_factory=dict, repr=False)

    @property
    def metric_names(self) -> list[str]:
        """Canonical metric names present, sorted."""
        if self.metrics.height == 0:
            return []
        if "__metric_names__" not in self._cache:  # one pass over the long table per run (cleared with the cache)
            self._cache["__metric_names__"] = sorted(self.metrics.get_column("metric").unique().to_list())  # type: ignore[assignment]
        return list(self._cache["__metric_names__"])  # type: ignore[arg-type]

    def has(self, metric: str) -> bool:
        """True when the metric has at least one row."""
        s = self.series(metric)
        return s is not None and len(s) > 0

    @property
    def n_segments(self) -> int:
        """Number of global segments (1 when the run never restarted)."""
        if self.metrics.height == 0:
            return 1
        return int(self.metrics.get_column("segment").max()) + 1  # type: ignore[arg-type, operator]

    def raw(self, metric: str) -> pl.DataFrame:
        """Every row of one metric, all sources and segments, in read order."""
        if "__by_metric__" not in self._cache:  # one pass over the long table per run, not one filter per metric
            self._cache["__by_metric__"] = self.metrics.partition_by("metric", as_dict=True)  # type: ignore[assignment]
        part = self._cache["__by_metric__"].get((metric,))  # type: ignore[union-attr]
        return part if part is not None else self.metrics.clear()

    def series(self, metric: str) -> Series | None:
        """The effective timeline of one metric (see :class:`Series`), or ``None`` if absent.

        When several sources log the metric, the one with the most rows wins (ties: the first
        in the most precise format); rows superseded by a later segment are dropped.
        """
        if metric in self._cache:
            return self._cache[metric]
        df = self.raw(metric).filter(pl.col("value").is_not_null())  # JSON null = not logged
        if df.height == 0:
            self._cache[metric] = None
            return None
        # the files of one source group (parsers.discover: e.g. lightning_logs/version_0, version_1) are
        # one timeline; the group with the most rows wins
        present = set(df.get_column("source").unique().to_list())
        groups = {s: g for s, g in (self.meta.get("source_groups") or {}).items() if s in present}
        df = df.with_columns((pl.col("source").replace(groups) if groups else pl.col("source")).alias("_g"))
        counts = df.group_by("_g").len().sort(["len", "_g"], descending=[True, False])
        df = df.filter(pl.col("_g") == counts.get_column("_g")[0]).with_row_index("_i")
        per_file = df.group_by("source").len().sort(["len", "source"], descending=[True, False])
        best = per_file.get_column("source")[0]
        # later segment wins for a repeated step (TensorBoard purge rule); within a segment the last row wins
        df = df.sort(["step", "segment", "_i"]).unique(subset=["step"], keep="last", maintain_order=True)
        # a step logged in segment k but followed by a lower-numbered step in segment k+1 is superseded
        segs = df.get_column("segment").to_numpy()
        steps = df.get_column("step").to_numpy()
        if segs.size and segs.max() > 0:
            starts = df.group_by("segment").agg(pl.col("step").min()).sort("segment")
            seg_ids = starts.get_column("segment").to_numpy()
            seg_min = starts.get_column("step").to_numpy()
            # for each segment: the smallest start step among all LATER segments (suffix minimum)
            later_min = np.full(seg_ids.shape[0], np.iinfo(np.int64).max)
            for k in range(seg_ids.shape[0] - 2, -1, -1):
                later_min[k] = min(later_min[k + 1], seg_min[k + 1])
            limit = later_min[np.searchsorted(seg_ids, segs)]
            df = df.filter(pl.Series(steps < limit))
        vals = df.get_column("value").cast(pl.Float64).fill_null(float("nan")).to_numpy()
        out = Series(
            metric=metric,
            steps=df.get_column("step").to_numpy().astype(np.int64),
            values=np.asarray(vals, dtype=np.float64),
            segments=df.get_column("segment").to_numpy().astype(np.int32),
            source=str(best),
        )
        self._cache[metric] = out
        return out

    def view(self, max_segment: int) -> RunData:
        """The run as it stood at the end of segment ``max_segment`` (later segments dropped).

        Used to analyse a failed attempt that a later restart rolled back and superseded.
        """
        keep = pl.col("segment") <= max_segment
        return RunData(
            run=self.run, metrics=self.metrics.filter(keep),
            events=self.events.filter(keep) if self.events.height else self.events,
            meta=self.meta, sources=self.sources, skipped=self.skipped,
            tensors=self.tensors.filter(pl.col("step") <= self.metrics.filter(keep).get_column("step").max())
            if self.tensors.height and self.metrics.height else self.tensors,
            updates=self.updates,
        )

    def rolled_back_segments(self) -> list[int]:
        """Segments that a later restart rolled back: a later segment starts before their last step.

        Such a segment is a failed (or abandoned) attempt whose rows the effective timeline hides.
        """
        if self.metrics.height == 0:
            return []
        span = self.metrics.group_by("segment").agg(pl.col("step").min().alias("lo"), pl.col("step").max().alias("hi"))
        rows = sorted(span.iter_rows())
        out = []
        for i, (seg, _lo, hi) in enumerate(rows):
            if any(lo2 < hi for _s2, lo2, _h2 in rows[i + 1:]):
                out.append(int(seg))
        return out

    def segment_starts(self) -> dict[int, int]:
        """First logged step of each global segment."""
        if self.metrics.height == 0:
            return {}
        return {
            int(s): int(v)
            for s, v in self.metrics.group_by("segment").agg(pl.col("step").min()).sort("segment").iter_rows()
        }
