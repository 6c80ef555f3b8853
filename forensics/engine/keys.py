"""Evidence keys the engine and the planner read, one name per fact (STYLE.md item 14).

Detectors write these keys into ``Finding.evidence``; the engine reads them only through these names.
"""

from __future__ import annotations

RECOVERED_STEP = "recovered_step"
"""First step back inside the pre-departure band (int), or None when the series did not recover.

NF01 writes it too: the step after which the series stays finite (None: non-finite for good).
"""
NONFINITE = "nonfinite"
"""The departure is a non-finite value (an inf grad norm on a skipped fp16 step is the overflow itself)."""
GRAD_NORM_LOGGED = "grad_norm_logged"
"""DB01: whether a grad-norm series was there to rule out a precursor."""
ARGUES_AGAINST = "argues_against"
"""NT01: the causes that the failed remedies address."""
FAILED_REMEDIES = "failed_remedies"
"""NT01: remedy -> the notes lines saying it failed."""
IDEAS = "ideas"
"""NT01: remedy -> the notes lines proposing it."""
GROWTH_PRECURSOR = "growth_precursor"
"""Main evidence: the update-growth finding that precedes another cause (code, mechanism, step)."""
SPIKE_STEPS = "spike_steps"
"""WU01: the steps of the spikes seen while the lr ramps up."""
EXPECTED_LR = "expected_lr"
"""LR01: the lr the schedule gives at the onset."""
INSIDE_PROCESS = "inside_process"
"""LR01: the lr left its schedule inside one process (no resume set it): a callback or a manual change."""
BATCH_INDEX = "batch_index"
"""DB01: the batch logged at the spike, when known."""
RECURRING_PERIOD = "period"
"""DB02: the period in steps at which the loss excursions recur."""
RECURRING_STEPS = "steps"
"""DB02: the steps of every occurrence, the first is the onset."""
FROM_START = "nonfinite_from_start"
"""NF02: the loss is non-finite from the first logged step (the planner checks init, data and precision)."""
MODULE = "module"
METRIC = "metric"

SIZE_FORMATS = (("z", "z={:.1f}"), ("relative_difference", "{:.0%} off the schedule"),
                ("relative_change", "{:+.1%}"), ("train_over_eval_loss", "x{:.2f}"), ("shift", "+{:.3g}"),
                ("halvings", "{:.0f} halvings"), ("value", "{:.4g}"), ("loss_after", "{:.4g}"))
"""Evidence key -> how a chain link states the size of its departure (the first key present wins)."""
RATIO_AS_LRS = 10.0
"""A ``relative_difference`` of at least this (1,000 %) is stated as the two lrs instead (ours: against a schedule
decayed to ~0 a percentage means nothing, user test U18)."""
