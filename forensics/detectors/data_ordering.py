"""DO01 data.ordering_shift: the train loss steps to a new level while the eval loss does not.

Rule: fit loss = a + b*s + c*s^2 + d*[s >= t] (least squares, s = step) for every candidate
split t and keep the t with the largest t-statistic of the level shift d; a train-loss shift
d > 0 with t-statistic >= ``min_t`` (6) and a relative size >= ``min_rel`` (1%), with no shift
of the eval loss at the same t (its t-statistic < 2 or its shift < 1/3 of the train shift) and
no lr discontinuity there, means the *training stream* changed, not the model: correlated runs
of batches from the data order (e.g. an affine index permutation a*x+b mod N; OLMo/marin
reports), a mixture boundary, or a sampler bug. Requires an eval loss that spans the shift,
otherwise it cannot tell data from optimisation and stays silent.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from forensics.detectors.base import Detector, fmt, segment_at
from forensics.model import Finding, RunData


def level_shift(steps: np.ndarray, y: np.ndarray, t: float | None = None, min_side: int = 5
                ) -> tuple[float, float, float] | None:
    """Best level shift (t, shift d, t-statistic of d) over a quadratic trend; ``t`` fixed if given."""
    ok = np.isfinite(y)
    s, y = np.asarray(steps, float)[ok], np.asarray(y, float)[ok]
    n = s.size
    if n < 2 * min_side + 3:
        return None
    x = (s - s.mean()) / (s.std() or 1.0)
    cands = [t] if t is not None else list(s[min_side:n - min_side])
    best = None
    for tt in cands:
        step_ind = (s >= tt).astype(float)
        if step_ind.sum() < (1 if t is not None else min_side) or step_ind.sum() > n - 1:
            continue
        a = np.column_stack([np.ones(n), x, x * x, step_ind])
        coef, *_ = np.linalg.lstsq(a, y, rcond=None)
        resid = y - a @ coef
        dof = max(n - 4, 1)
        sigma2 = float(resid @ resid) / dof
        try:
            cov = sigma2 * np.linalg.inv(a.T @ a)
        except np.linalg.LinAlgError:
            continue
        se = float(np.sqrt(max(cov[3, 3], 1e-300)))
        tstat = float(coef[3] / se)
        if best is None or tstat > best[2]:
            best = (float(tt), float(coef[3]), tstat)
    return best


@dataclass(frozen=True)
class OrderingShift(Detector):
    """A train-only level shift of the loss (data order or stream change)."""

    code = "DO01"
    name = "data.ordering_shift"
    requires = ("loss",)
    min_t: float = 6.0
    min_rel: float = 0.01

    def _eval_metric(self, run: RunData) -> str | None:
        if run.has("eval_loss"):
            return "eval_loss"
        cands = [m for m in run.metric_names if m.startswith(("eval/", "val/", "valid/")) and m.endswith("loss")]
        return cands[0] if cands else None

    def missing(self, run: RunData) -> str | None:
        """Needs a train loss and an eval loss."""
        if not run.has("loss"):
            return "needs the metric loss"
        return None if self._eval_metric(run) else "needs an eval loss to tell a data shift from optimisation"

    def detect(self, run: RunData) -> list[Finding]:
        """At most one finding: the level shift and why it is the data."""
        s = run.series("loss")
        em = self._eval_metric(run)
        e = run.series(em) if em else None
        if s is None or e is None or len(s) < 20:
            return []
        best = level_shift(s.steps, s.values)
        if best is None:
            return []
        t, d, tstat = best
        med = float(np.nanmedian(s.values))
        if d <= 0 or tstat < self.min_t or d < self.min_rel * abs(med):
            return []
        if np.sum(e.steps < t) < 2 or np.sum(e.steps >= t) < 2:
            return []
        eb = level_shift(e.steps, e.values, t=t, min_side=2)
        if eb is not None and eb[2] >= 2.0 and eb[1] >= d / 3:
            return []
        lr = run.series("lr")
        if lr is not None and len(lr) > 3:
            i = int(np.searchsorted(lr.steps, t))
            if 0 < i < len(lr):
                a, b = lr.values[i - 1], lr.values[i]
                if np.isfinite(a) and np.isfinite(b) and a > 0 and abs(b / a - 1) > 0.05:
                    return []
        step = int(t)
        cfg = repr(run.meta.get("config_files", {})).lower()
        hints = [h for h in ("permutation", "shuffle", "sampler", "mixture") if h in cfg]
        conf = 0.65 + (0.1 if "permutation" in hints else 0.0)
        return [self.finding(
            cause="data_batch", mechanism="ordering", step=step, segment=segment_at(s, step), confidence=conf,
            severity="medium",
            message=f"train loss steps up by {fmt(d)} ({100 * d / abs(med):.1f}%, t={tstat:.1f}) at step {step} and "
            f"stays there while {em} keeps its trend and the lr is smooth: the training stream changed, "
            "not the model" + (f" (the run config sets {', '.join(hints)})" if hints else "") + ".",
            evidence={"shift": d, "t_statistic": tstat, "eval_metric": em,
                      "eval_shift": eb[1] if eb else None, "eval_t_statistic": eb[2] if eb else None,
                      "config_hints": hints},
        )]
