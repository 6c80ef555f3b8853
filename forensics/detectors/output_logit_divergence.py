"""OL01 output.logit_divergence: output logits (or the output layer's norm) drifting upward.

Rule (docs/detectors.md#ol01; Wortsman et al. 2023, arXiv 2309.14322, section 3.2: output-logit
divergence, mitigated by z-loss 1e-4 * log^2 Z as in PaLM, arXiv 2204.02311 section 5):
the max output logit, |log Z|, or the norm of the output layer (``lm_head``, ``output_layer``,
``embed_out``) leaves the trend of its early part for good (a knee: the growth accelerates): ``k_sigma`` (4)
robust sigmas and ``min_rel_logits`` (25%; ``min_rel_head_norm``, 2%, for a weight norm, which moves slowly)
above the trend for ``min_run`` (5) points, still rising after the onset, and a logit statistic must also
grow ``min_growth_logits`` (1.5x) from the onset to the end (ours, tuned on sample_logs and the corpus).

Source: docs/detectors.md#ol01 (the thresholds, where each comes from, the published reports).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from forensics.detectors.base import Detector, fmt, segment_at
from forensics.model import Cause, Finding, Mechanism, RunData, Severity
from forensics.model_parts import OUTPUT_HEADS, is_output_head_metric
from forensics.stats import sustained_rise

_LOGIT_SERIES = ("output_logit_max", "log_z")
"""The logit statistics OL01 reads (canonical metric names; docs/detectors.md#ol01)."""


@dataclass(frozen=True)
class OutputLogitDivergence(Detector):
    """Growth of output logits, |log Z| or the output-layer norm beyond their early trend."""

    code = "OL01"
    name = "output.logit_divergence"
    needs = (f"one of {', '.join(_LOGIT_SERIES)}, or the norm of an output layer (module "
             f"{', '.join(sorted(OUTPUT_HEADS))}; not a grad norm)")
    k_sigma: float = 4.0
    min_rel_logits: float = 0.25
    min_rel_head_norm: float = 0.02
    min_run: int = 5
    min_growth_logits: float = 1.5
    min_points: int = 12
    confidence: float = 0.75

    def _candidates(self, run: RunData) -> list[str]:
        out = [m for m in _LOGIT_SERIES if run.has(m)]
        out += [m for m in run.metric_names if is_output_head_metric(m) and "grad" not in m.lower()]
        return out

    def missing(self, run: RunData) -> str | None:
        """Needs output_logit_max, log_z, or an output-layer norm series."""
        return None if self._candidates(run) else "needs output_logit_max, log_z or an lm_head norm"

    def detect(self, run: RunData) -> list[Finding]:
        """At most one finding: the earliest sustained rise among the candidate series."""
        best = None
        for m in self._candidates(run):
            s = run.series(m)
            if s is None or len(s) < self.min_points:
                continue
            vals = np.abs(s.values) if m == "log_z" else s.values
            d = sustained_rise(s.steps, vals, log=True, k_sigma=self.k_sigma,
                               min_rel=self.min_rel_head_norm if "head" in m else self.min_rel_logits,
                               min_run=self.min_run)
            if d is None or d.slope_after <= 0:
                continue
            if "head" not in m.lower() and d.growth < self.min_growth_logits:
                continue  # logit statistics (incl. |log Z|) must really grow, not just leave an early trend
            if best is None or d.onset_step < best[0]:
                best = (d.onset_step, m, d, s)
        if best is None:
            return []
        step, m, d, s = best
        return [self.finding(
            cause=Cause.UPDATE_SCALE_GROWTH, mechanism=Mechanism.OUTPUT_LOGIT_DIVERGENCE, step=step,
            segment=segment_at(s, step), confidence=self.confidence, severity=Severity.HIGH,
            message=f"{m} leaves the trend of its early part at step {step} (trend {fmt(d.baseline)}, "
            f"last {fmt(d.last)}, x{d.growth:.3g} since the onset).",
            evidence={"metric": m, "onset_step": step, "trend_at_onset": d.baseline, "last": d.last,
                      "growth_after_onset": d.growth, "log_slope_per_step": d.slope_after},
        )]
