"""OV02 overflow.activation_range: a forward activation reaches the fp16 range limit.

Rule: fp16's largest finite value is 65504 (IEEE 754 binary16); a logged activation
magnitude (``absmax``, ``max_abs``, ``amax``, ``act_max`` series, per module) at or above
``near_fraction`` (90%) of it, in an fp16 run, is at risk of an activation overflow; the
first value above 65504 (or a ``*fp16_finite*`` flag turning false) is the overflow itself.
Forward overflow is not fixed by a lower lr (HF transformers T5 fp16 reports, #10830/#14189):
the recovery is bf16/fp32 for the block, or clamping. Whether the run is fp16 comes from its
configuration, else from a dynamic fp16 loss scaler in its logs (:func:`infer_fp16_from_metrics`).

Source: docs/detectors.md#ov02 (the thresholds, where each comes from, the published reports).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import polars as pl

from forensics.detectors.base import Detector, fmt, segment_at
from forensics.model import Cause, Finding, Mechanism, RunData, Severity
from forensics.model_parts import FP16_MAX

_ACT_WORDS = ("absmax", "abs_max", "max_abs", "amax", "act_max", "activation_max", "actmax")


def is_fp16(run: RunData) -> bool | None:
    """True/False when the run's precision is known to be fp16 or not; None when unknown (cached per run)."""
    if "__is_fp16__" in run._cache:  # noqa: SLF001 - RunData's cache is ours
        return run._cache["__is_fp16__"]  # type: ignore[return-value]
    run._cache["__is_fp16__"] = _is_fp16(run)  # type: ignore[assignment]
    return run._cache["__is_fp16__"]  # type: ignore[return-value]


def _is_fp16(run: RunData) -> bool | None:
    """The run's fp16-ness: explicit configuration first, then the metrics' own evidence.

    1. Metric names or meta that spell the precision (``fp16`` tags, ``precision: fp16``,
       ``bf16``/``bfloat16``, ``--fp16``), then the canonical config precision
       (:func:`forensics.config_diff.extract_config`): an explicit ``bf16``/``fp32``/``fp8`` wins over
       any inference below and answers False.
    2. Otherwise :func:`infer_fp16_from_metrics`: a dynamic fp16 loss scaler seen in the logs.
    """
    blob = repr(run.meta).lower()
    names = " ".join(run.metric_names).lower()
    if "fp16" in names or "'precision': 'fp16'" in blob or "float16" in blob.replace("bfloat16", ""):
        return True
    if "bf16" in blob or "bfloat16" in blob:
        return False
    if "'fp16': true" in blob or "fp16=true" in blob or "--fp16" in blob:
        return True
    from forensics.config_diff import extract_config  # noqa: PLC0415 - config_diff is not a detector dependency

    declared = extract_config(run).get("precision")
    if declared == "fp16":
        return True
    if declared in ("bf16", "fp32", "fp8"):
        return False
    return True if infer_fp16_from_metrics(run) else None


_POW2_TOL = 1e-3
"""|log2(scale) - round(log2(scale))| below this is a power of two (NeMo prints 4 significant digits)."""

_SCALER_EVENT = re.compile(r"loss scale|fp16", re.I)


def infer_fp16_from_metrics(run: RunData) -> str | None:
    """Why the logs show a dynamic fp16 loss scaler at work, or None when they do not.

    Rule: dynamic loss scalers exist only for fp16 (bf16 and fp32 share fp32's exponent range and
    need none). Their scale is a power of two that moves by factors of two: PyTorch
    ``torch.amp.GradScaler`` (``init_scale=2**16``, ``growth_factor=2.0``, ``backoff_factor=0.5``),
    DeepSpeed ``DynamicLossScaler`` (``initial_scale_power=16``, scale factor 2, "Attempted loss
    scale: X, reducing to Y"), Megatron and fairseq ("overflow detected, setting loss scale to: X")
    alike (docs/detectors.md#loss-scalers and docs/detectors.md#ov01). Evidence, any one suffices:

    * a ``loss_scale`` series whose positive values are all powers of two, at least one > 1, that
      changes by a factor 2**k between two logged values, or that comes with skipped steps
      (``skipped_step`` > 0);
    * a ``loss_scale_change`` event, or an ``overflow_skip``/``error`` event that names the loss
      scale (DeepSpeed, fairseq, "Current loss scale already at minimum").

    Not evidence: a constant ``loss scale: 1.0`` (what Megatron prints in a bf16 run; docs/formats.md#bf16-loss-scale:
    "a constant, not a collapsed fp16 scale"), and a bare "OVERFLOW! Skipping step" or skipped
    iteration counter with no scale (bf16/fp32 DeepSpeed engines and Megatron print those too).
    """
    s = run.series("loss_scale")
    if s is not None and len(s) > 0:
        v = s.values[np.isfinite(s.values) & (s.values > 0)]  # fairseq prints tiny scales as 0
        if v.size and float(v.max()) > 1.0:
            e = np.log2(v)
            if bool(np.all(np.abs(e - np.round(e)) < _POW2_TOL)):
                steps = np.round(np.diff(e))
                if bool(np.any(steps != 0)):
                    return (f"the logged loss scale moves by factors of 2 ({v[0]:g} .. {v.min():g}): a dynamic "
                            "fp16 loss scaler")
                sk = run.series("skipped_step")
                if sk is not None and float(np.nansum(sk.values)) > 0:
                    return f"a power-of-two loss scale ({v[0]:g}) with skipped steps: a dynamic fp16 loss scaler"
    if run.events.height:
        for row in run.events.filter(pl.col("kind").is_in(["loss_scale_change", "overflow_skip", "error"])
                                     ).iter_rows(named=True):
            msg = str(row["message"] or "")
            if row["kind"] == "loss_scale_change" or _SCALER_EVENT.search(msg):
                if row["kind"] == "error" and "minimum" not in msg.lower():
                    continue
                return f"a loss-scaler event: {msg[:120]}"
    return None


@dataclass(frozen=True)
class ActivationOverflow(Detector):
    """Forward activations at the fp16 limit (an overflow a lower lr does not fix)."""

    code = "OV02"
    name = "overflow.activation_range"
    near_fraction: float = 0.9

    def _fp16_nonfinite_loss(self, run: RunData) -> list[Finding]:
        """An fp16 run whose loss turns non-finite with no activation series: an overflow, moderately sure."""
        loss = run.series("loss")
        if loss is None:
            return []
        bad = np.flatnonzero(~np.isfinite(loss.values))
        if not bad.size:
            return []
        step = int(loss.steps[bad[0]])
        return [self.finding(
            cause=Cause.OVERFLOW, mechanism=Mechanism.ACTIVATION_OVERFLOW, step=step,
            segment=int(loss.segments[bad[0]]),
            confidence=0.55, severity=Severity.HIGH,
            message=f"the loss of this fp16 run turns non-finite at step {step}; with no activation or loss-scale "
            "series logged, an fp16 overflow is the most likely reading (log absmax/loss scale to confirm).",
            evidence={"first_nonfinite_step": step, "fp16_known": True, "activation_series": False},
        )]

    def _metrics(self, run: RunData) -> list[str]:
        out = [m for m in run.metric_names if any(w in m.lower() for w in _ACT_WORDS)]
        if is_fp16(run):  # logit maxima are forward values too; in fp16 they overflow at 65504
            out += [m for m in run.metric_names if m.startswith(("attn_logit_max", "output_logit_max"))]
        return out

    def missing(self, run: RunData) -> str | None:
        """Needs a logged activation-magnitude series (absmax/amax per module)."""
        if is_fp16(run) and run.has("loss"):
            return None
        return None if self._metrics(run) else (
            "needs an activation magnitude series (absmax, amax, act_max; logit maxima in fp16 runs)")

    def detect(self, run: RunData) -> list[Finding]:
        """At most one finding: the earliest activation at the fp16 limit."""
        fp16 = is_fp16(run)
        if fp16 is False:
            return []
        best = None
        for m in self._metrics(run):
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
        conf = 0.9 if (fp16 and over_step is not None) else 0.7 if over_step is not None else 0.55
        return [self.finding(
            cause=Cause.OVERFLOW, mechanism=Mechanism.ACTIVATION_OVERFLOW, step=step, segment=segment_at(s, step),
            confidence=conf, severity=Severity.CRITICAL,
            message=f"{m} reaches {fmt(float(s.values[i]))} at step {step}, "
            + ("beyond" if over_step is not None else "within 10% of") + " the fp16 limit of 65504"
            + (f"; it had been within 10% of the limit since step {near_step}"
               if near_step is not None and near_step < step else "") + ".",
            evidence={"metric": m, "module": module, "value_at_onset": float(s.values[i]), "fp16_max": FP16_MAX,
                      "first_over_step": over_step, "first_near_limit_step": near_step,
                      "fp16_known": fp16},
        )]
