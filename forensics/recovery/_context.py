"""What every cause's planner is given (:class:`PlanContext`) and returns (:class:`Arms`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from forensics.facts import RunFacts
from forensics.model import RunData, Trial

LR_DIGITS = 7
"""Significant digits of an lr in a trial's settings: a float32 holds about 7.2 decimal digits, so a logged lr of
1.5e-4 read back as 0.0001500000071 is shown as 0.00015; no trainer sets an lr finer."""


def lr_digits(lr: float) -> float:
    """``lr`` rounded to :data:`LR_DIGITS` significant digits (paste-ready, no float32 noise)."""
    return float(f"{lr:.{LR_DIGITS}g}")

CLIP_NORM = 1.0
"""Global-norm clipping threshold proposed (OPT-175B logbook; Wortsman et al. 2023 defaults)."""
CLIP_BITES = 5.0
"""Above this pre-onset median grad norm, clipping at 1.0 would rescale every step: not proposed."""
LR_FACTORS = (0.5, 0.25)
"""Peak-lr factors of the lower-lr arms (PaLM and OPT restarted with lower lrs; docs/detectors.md#recovery-trial)."""
SKIP_BATCHES = 200
"""Batches skipped from the onset on (PaLM skipped 200-500 batches, arXiv 2204.02311 section 5.1)."""
NOTE_CHARS = 120
"""A notes line quoted in a "do not" is cut at a word boundary to this many characters."""
MOMENT_REBUILD = "5/(1-beta2)"
"""Steps at lr=0 that rebuild lost Adam moments (BigScience: the second moment's averaging horizon, five times)."""


@dataclass(frozen=True)
class PlanContext:
    """One diagnosis and what the planner worked out for it before choosing the arms.

    Attributes:
        run: The run; ``facts``: its facts (precision, notes, checkpoints, step unit).
        cause, mechanism, onset: The diagnosis.
        evidence: The chosen cause's main evidence (:func:`forensics.engine.main_evidence`).
        resume: ``resume_from`` (checkpoint, step, why).
        length: Steps each arm runs (capped, :data:`forensics.recovery._resume.TRIAL_MAX`).
        peak_lr: The logged peak lr, or None; ``warmup``: the logged warm-up length (0 when unknown).
        rewarm: Re-warm-up steps of a lower-lr arm (shorter than the trial).
        clip: The clipping threshold to propose, or None when it would rescale every step; ``clip_text`` says it.
    """

    run: RunData
    facts: RunFacts
    cause: str
    mechanism: str | None
    onset: int
    evidence: Mapping[str, object]
    resume: Mapping[str, object]
    length: int
    peak_lr: float | None
    warmup: int
    rewarm: int
    clip: float | None
    clip_text: str

    @property
    def fp16(self) -> bool:
        """The run trained in fp16 (a bf16 arm is worth proposing)."""
        return bool(self.facts.fp16)

    def failed(self, remedy: str) -> bool:
        """The notes say ``remedy`` was tried and failed."""
        return remedy in self.facts.failed_remedies

    def lr_trial(self, factor: float, change: str) -> Trial:
        """An arm at ``factor`` x the peak lr with the re-warm-up and the clipping of this plan."""
        return Trial(f"lr x{factor:g}", change, self.length,
                     {"peak_lr_factor": factor, "peak_lr": self.peak_lr and lr_digits(self.peak_lr * factor),
                      "warmup_steps": self.rewarm, "clip_grad_norm": self.clip})


@dataclass(frozen=True)
class Arms:
    """What a cause's planner proposes: state to restore, trial arms, and what not to do (each with why)."""

    restore: tuple[str, ...] = ()
    trials: tuple[Trial, ...] = ()
    do_not: tuple[str, ...] = ()


Planner = Callable[[PlanContext], Arms]
"""A cause's planner: one module per cause in :mod:`forensics.recovery`."""


def clip_words(text: str, limit: int = NOTE_CHARS) -> str:
    """``text`` cut at a word boundary to at most ``limit`` characters (with an ellipsis)."""
    if len(text) <= limit:
        return text
    return text[:limit].rsplit(" ", 1)[0] + "..."


def notes_say_failed(ctx: PlanContext, remedy: str, what: str) -> str:
    """A "do not" sentence quoting the notes line that says ``remedy`` failed."""
    return f"do not {what} again: the notes record " + {
        "lower_lr": "lower lr attempts that failed (", "skip_data": "data skips that did not help ("}.get(
        remedy, f"{remedy} attempts that failed (") + clip_words(ctx.facts.failed_remedies[remedy][0]) + ")"
