"""GS01 grad_scaling.constant_factor: the training loss (and its gradients) off by a constant factor.

Rule: where the run logs both a train loss and an eval loss, the train loss sits at a constant
multiple k >= ``min_factor`` (2) of the eval loss at matched steps (robust relative spread of
the ratio below ``max_spread``, 35%: train loss falls faster than eval loss early on), while the
eval loss itself is normal. The train loss then is mis-normalised, not unstable; when k is close
to the gradient-accumulation factor the loss was summed instead of averaged over micro-batches
(transformers 4.46-4.47 with ``num_items_in_batch``, huggingface/transformers#35663, fixed in
4.48.1 by PR #35651). A sibling run in the same folder whose loss is exactly k times smaller at
every step confirms it.

Confidence ``confidence`` (0.6); plus ``sibling_confidence_gain`` (0.1) for a sibling run whose loss ratio has
at least ``sibling_min_points`` (3) points, a relative spread of at most ``sibling_max_spread`` (1%) and a mean
above ``sibling_min_factor`` (1.5); plus ``ga_confidence_gain`` (0.15) when the factor is within ``ga_tol``
(25%) of the configured gradient-accumulation steps; at most ``max_confidence`` (0.95). A run folder needs
``min_points`` (3) train losses.

Source: docs/detectors.md#gs01 (the thresholds, where each comes from, the published reports).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import polars as pl

from forensics.detectors.base import Detector
from forensics.model import Cause, Finding, Mechanism, RunData, Severity

_GA = re.compile(r"gradient[ _]accumulation[ _]steps['\"]?\s*[=:]\s*['\"]?(\d+)", re.I)


def _folder(source: str) -> str:
    return source.split("/", 1)[0] if "/" in source else ""


@dataclass(frozen=True)
class GradScalingFactor(Detector):
    """Train loss a constant multiple of eval loss (accumulation or adapter scaling bugs)."""

    code = "GS01"
    name = "grad_scaling.constant_factor"
    requires = ("loss", "eval_loss")
    requires_all = True
    min_factor: float = 2.0
    max_spread: float = 0.35
    min_points: int = 3
    confidence: float = 0.6
    sibling_min_points: int = 3
    sibling_max_spread: float = 0.01
    sibling_min_factor: float = 1.5
    sibling_confidence_gain: float = 0.1
    ga_tol: float = 0.25
    ga_confidence_gain: float = 0.15
    max_confidence: float = 0.95

    def detect(self, run: RunData) -> list[Finding]:
        """At most one finding for the worst mis-scaled run folder."""
        loss = run.raw("loss").filter(pl.col("value").is_not_null())
        ev = run.raw("eval_loss").filter(pl.col("value").is_not_null())
        best = None
        per_folder: dict[str, pl.DataFrame] = {}
        for folder in sorted({_folder(s) for s in loss.get_column("source").unique().to_list()}):
            lf = loss.filter(pl.col("source").map_elements(_folder, return_dtype=pl.String) == folder)
            ef = ev.filter(pl.col("source").map_elements(_folder, return_dtype=pl.String) == folder)
            if lf.height < self.min_points or ef.height < 1:
                continue
            lf = lf.group_by("step").agg(pl.col("value").last()).sort("step")
            per_folder[folder] = lf
            ef = ef.group_by("step").agg(pl.col("value").last().alias("eval")).sort("step")
            j = ef.join_asof(lf, on="step", strategy="nearest")
            r = (j.get_column("value") / j.get_column("eval")).to_numpy()
            r = r[np.isfinite(r)]
            if r.size == 0:
                continue
            k = float(np.median(r))
            spread = float(np.median(np.abs(r - k)) / k) if k else 1.0
            if k >= self.min_factor and spread <= self.max_spread and (best is None or k > best[1]):
                best = (folder, k, spread, int(lf.get_column("step")[0]))
        if best is None:
            return []
        folder, k, spread, first = best
        meta_txt = repr({s: v for s, v in run.meta.get("by_source", {}).items() if _folder(s) == folder})
        ga = [int(x) for x in _GA.findall(meta_txt)]
        ga_steps = ga[0] if ga else None
        evidence: dict[str, object] = {"folder": folder or ".", "train_over_eval_loss": round(k, 3),
                                       "ratio_spread": round(spread, 3), "first_step": first,
                                       "gradient_accumulation_steps": ga_steps}
        conf = self.confidence
        msg = f"train loss is {k:.2f}x the eval loss at matched steps"
        factor = k
        for other, of in per_folder.items():
            if other == folder:
                continue
            j = per_folder[folder].join(of, on="step", suffix="_o")
            rr = (j.get_column("value") / j.get_column("value_o")).to_numpy()
            rr = rr[np.isfinite(rr)]
            if (rr.size >= self.sibling_min_points and float(np.std(rr)) <= self.sibling_max_spread * float(np.mean(rr))
                    and np.mean(rr) > self.sibling_min_factor):
                conf += self.sibling_confidence_gain
                factor = float(np.mean(rr))
                evidence["sibling_run"] = other
                evidence["loss_ratio_to_sibling"] = round(factor, 4)
                msg += f"; the sibling run {other} logs exactly {factor:.3f}x lower losses at every step"
                break
        ga_match = bool(ga_steps) and abs(factor - ga_steps) <= self.ga_tol * ga_steps  # type: ignore[operator]
        if ga_match:
            conf += self.ga_confidence_gain
            msg += (f"; the factor matches the gradient-accumulation steps ({ga_steps}): the loss is summed over "
                    "micro-batches instead of averaged")
        return [self.finding(
            cause=Cause.GRAD_SCALING_BUG, mechanism=Mechanism.GA_NORMALISATION if ga_match else None,
            step=first, segment=0,
            confidence=min(conf, self.max_confidence), severity=Severity.HIGH, message=msg + ".", evidence=evidence,
        )]
