"""Finding codes the engine reads, as named constants, and the findings the engine itself makes.

The engine keys on detector codes only through these names; ``tests/test_engine_package.py`` checks that
every detector constant is a registered detector code and that the engine's own codes are not.
"""

from __future__ import annotations

from types import MappingProxyType

NONFINITE = "NF01"
"""nonfinite.loss (a non-finite loss or grad norm)."""
LOSS_SPIKE = "SP01"
"""loss.spike (a loss departure; ``recovered_step`` says whether it came back)."""
DIVERGENCE = "DV01"
"""loss.divergence (a loss that turns and keeps rising)."""
GRAD_NORM = "GN01"
"""grad_norm.departure."""
UPDATE_RATIO = "UP01"
"""update_ratio departure."""
ATTENTION_LOGITS = "AT01"
"""attention-logit growth."""
STALL = "ST01"
"""no progress (a loss that stops improving)."""
NOTES = "NT01"
"""notes.attempts (failed remedies and open ideas from the run folder's notes)."""
INTEGRITY = "INT01"
"""integrity.segments (restarts and damaged inputs)."""
RESUME_STATE = "RS01"
"""resume.state_not_restored."""
LR_SCHEDULE = "LR01"
"""lr.schedule_reset."""
BAD_BATCH = "DB01"
RECURRING_BATCH = "DB02"
WARMUP = "WU01"
LOSS_SCALE = "OV01"
ACTIVATION = "OV02"
PRECURSOR = "PR01"
HARDWARE = "HW01"
DATA_ORDERING = "DO01"
GRAD_SCALING = "GS01"
RANK = "RK01"
"""rank.departure (one rank leaves the other ranks of the job)."""

DETECTOR_CODES = (NONFINITE, LOSS_SPIKE, DIVERGENCE, GRAD_NORM, UPDATE_RATIO, ATTENTION_LOGITS, STALL, NOTES,
                  INTEGRITY, RESUME_STATE, LR_SCHEDULE, BAD_BATCH, RECURRING_BATCH, WARMUP, LOSS_SCALE, ACTIVATION,
                  PRECURSOR, HARDWARE, DATA_ORDERING, GRAD_SCALING, RANK)
"""Every detector code named here (each must be in :data:`forensics.detectors.DETECTORS`)."""

FAILURE_PRECURSORS = (GRAD_NORM, LOSS_SPIKE, DIVERGENCE, NONFINITE, STALL)
"""Findings whose earliest step is the onset of a failure no cause explains."""
CHAIN_FOLLOWERS = (GRAD_NORM, LOSS_SPIKE, NONFINITE, DIVERGENCE)
"""Departures that join a causal chain after its onset unless they recovered first."""
GROWTH_LEADERS = (GRAD_NORM, UPDATE_RATIO, ATTENTION_LOGITS)
"""Departures that, before a loss-scale collapse, make growing updates the cause and the collapse a symptom."""
AT_RESUME_CODES = (RESUME_STATE, LR_SCHEDULE)
"""Findings located at the first step of a resumed process."""

# the engine's own findings
CAUSAL_CHAIN = "ENG01"
FAILED_ATTEMPTS = "INT02"
EARLY_DIVERGENCE = "DV02"
NO_LEARNING = "ST02"
NONFINITE_START = "NF02"

ENGINE_FINDINGS = MappingProxyType({
    CAUSAL_CHAIN: "engine.causal_chain",
    FAILED_ATTEMPTS: "integrity.failed_attempts",
    EARLY_DIVERGENCE: "loss.early_divergence",
    NO_LEARNING: "loss.no_learning",
    NONFINITE_START: "nonfinite.from_start",
})
"""Code -> dotted name of each finding the engine makes (no detector makes these)."""
NOT_ON_CHAIN = (INTEGRITY, FAILED_ATTEMPTS, NOTES)
"""Findings never listed as a link of the causal chain."""

SIGNAL = MappingProxyType({
    GRAD_NORM: "grad_norm", LOSS_SPIKE: "loss", NONFINITE: "non-finite value", DIVERGENCE: "loss",
    BAD_BATCH: "loss", RECURRING_BATCH: "recurring loss excursions", WARMUP: "loss", LR_SCHEDULE: "lr",
    RESUME_STATE: "loss at the resume",
    LOSS_SCALE: "loss_scale", ACTIVATION: "activation", UPDATE_RATIO: "update_ratio", PRECURSOR: "precursor",
    ATTENTION_LOGITS: "attn_logit_max", HARDWARE: "throughput", DATA_ORDERING: "loss level",
    GRAD_SCALING: "loss / eval_loss", RANK: "one rank's series", NO_LEARNING: "loss",
    NONFINITE_START: "non-finite loss",
})
"""Code -> the signal a chain link names."""
