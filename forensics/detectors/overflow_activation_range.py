"""OV02 overflow.activation_range: a forward activation reaches the fp16 range limit.

Rule: fp16's largest finite value is 65504 (IEEE 754 binary16); a logged activation
magnitude (``absmax``, ``max_abs``, ``amax``, ``act_max`` series, per module) at or above
``near_fraction`` (90%) of it, in an fp16 run, is at risk of an activation overflow; the
first value above 65504 (or a ``*fp16_finite*`` flag turning false) is the overflow itself.
Forward overflow is not fixed by a lower lr (HF transformers T5 fp16 reports, #10830/#14189):
the recovery is bf16/fp32 for the block, or clamping. Whether the run is fp16 comes from its
configuration, else from a dynamic fp16 loss scaler in its logs (:func:`forensics.facts.infer_fp16_from_metrics`).

Source: docs/detectors.md#ov02 (the thresholds, where each comes from, the published reports).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from forensics.detectors.base import Detector, fmt, segment_at
from forensics.facts import RunFacts, run_facts
from forensics.model import Cause, Finding, Mechanism, RunData, Severity
from forensics.model_parts import FP16_MAX

_ACT_WORDS = ("absmax", "abs_max", "max_abs", "amax", "act_max", "activation_max", "actmax")


@dataclass(frozen=True)
class ActivationOverflow(Detector):
    """Forward activations at the fp16 limit (an overflow a lower lr does not fix)."""

    code = "OV02"
    name = "overflow.activation_range"
    uses_facts = True
    needs = (f"an activation-magnitude series (a name with {', '.join(_ACT_WORDS)}); in an fp16 run also "
             "attn_logit_max, output_logit_max or the loss")
    near_fraction: float = 0.9
    over_fp16_confidence: float = 0.9
    over_confidence: float = 0.7
    near_confidence: float = 0.55
    loss_only_confidence: float = 0.55

    def _fp16_nonfinite_loss(self, run: RunData) -> list[Finding]:
        """An fp16 run whose loss turns non-finite with no activation series: an overflow, moderately sure."""
        loss = run.series("loss")
        if loss is None:
            return []
        bad = np.flatnonzero(~np.isfinite(loss.values))
        if not bad.size:
            return []
        step = int(loss.steps[bad[0]])
        missing = "activation series" + ("" if run.has("loss_scale") else " or loss scale")
        confirm = "absmax" + ("" if run.has("loss_scale") else "/loss scale")
        return [self.finding(
            cause=Cause.OVERFLOW, mechanism=Mechanism.ACTIVATION_OVERFLOW, step=step,
            segment=int(loss.segments[bad[0]]),
            confidence=self.loss_only_confidence, severity=Severity.HIGH,
            message=f"the loss of this fp16 run turns non-finite at step {step}; with no {missing} logged, an fp16 "
            f"overflow is the most likely reading (log {confirm} to confirm).",
            evidence={"first_nonfinite_step": step, "fp16_known": True, "activation_series": False},
        )]

    def _metrics(self, run: RunData, facts: RunFacts) -> list[str]:
        out = [m for m in run.metric_names if any(w in m.lower() for w in _ACT_WORDS)]
        if facts.fp16:  # logit maxima are forward values too; in fp16 they overflow at 65504
            out += [m for m in run.metric_names if m.startswith(("attn_logit_max", "output_logit_max"))]
        return out

    def missing(self, run: RunData, facts: RunFacts | None = None) -> str | None:
        """Needs a logged activation-magnitude series (absmax/amax per module)."""
        facts = facts or run_facts(run)
        if facts.fp16 and run.has("loss"):
            return None
        return None if self._metrics(run, facts) else (
            "needs an activation magnitude series (absmax, amax, act_max; logit maxima in fp16 runs)")

    def detect(self, run: RunData, facts: RunFacts | None = None) -> list[Finding]:
        """At most one finding: the earliest activation at the fp16 limit."""
        facts = facts or run_facts(run)
        fp16 = facts.fp16
        if fp16 is False:
            return []
        best = None
        for m in self._metrics(run, facts):
            s = run.series(m)
            if s is None or len(s) == 0:
                continue
            v = s.values
            near = np.flatnonzero(np.isfinite(v) & (v >= self.near_fraction * FP16_MAX))
            over = np.flatnonzero((np.isfinite(v) & (v > FP16_MAX)) | (np.isinf(v)))
            if not over.size and not near.size:
                continue
            i_onset = int(over[0]) if over.size else int(near[0])
            cand = (int(s.steps[i_onset]), m, s, i_onset, int(s.steps[near[0]]) if near.size else None)
            if best is None or cand[0] < best[0]:
                best = cand
        if best is None:
            return self._fp16_nonfinite_loss(run) if fp16 else []
        step, m, s, i, near_step = best
        over_step = step if (not np.isfinite(s.values[i]) or s.values[i] > FP16_MAX) else None
        module = m.split("/", 1)[1] if "/" in m else m
        conf = (self.over_fp16_confidence if (fp16 and over_step is not None) else self.over_confidence
                if over_step is not None else self.near_confidence)
        near = f"within {1 - self.near_fraction:.0%} of"
        return [self.finding(
            cause=Cause.OVERFLOW, mechanism=Mechanism.ACTIVATION_OVERFLOW, step=step, segment=segment_at(s, step),
            confidence=conf, severity=Severity.CRITICAL,
            message=f"{m} reaches {fmt(float(s.values[i]))} at step {step}, "
            + ("beyond" if over_step is not None else near) + " the fp16 limit of 65504"
            + (f"; it had been {near} the limit since step {near_step}"
               if near_step is not None and near_step < step else "") + ".",
            evidence={"metric": m, "module": module, "value_at_onset": float(s.values[i]), "fp16_max": FP16_MAX,
                      "first_over_step": over_step, "first_near_limit_step": near_step,
                      "fp16_known": fp16},
        )]
