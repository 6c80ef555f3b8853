"""DO01 data.ordering_shift: the train loss steps to a new level while the eval loss does not.

Rule: fit loss = a + b*s + c*s^2 + d*[s >= t] (least squares, s = step) for every candidate
split t and keep the t with the largest t-statistic of the level shift d; a train-loss shift
d > 0 with t-statistic >= ``min_t`` (6) and a relative size >= ``min_rel`` (1%), with no shift
of the eval loss at the same t (its t-statistic < 2 or its shift < 1/3 of the train shift) and
no lr discontinuity there, means the *training stream* changed, not the model: correlated runs
of batches from the data order (e.g. an affine index permutation a*x+b mod N; OLMo/marin
reports), a mixture boundary, or a sampler bug. Requires an eval loss that spans the shift (``min_eval_side``,
3 points, on each side), otherwise it cannot tell data from optimisation and stays silent. The shift must also be
a local step (the median of the points just after t exceeds that just before by ``local_frac`` (half) of the
fitted shift and ``local_k_sigma`` (3) noise sigmas: a smooth decay that the quadratic misses is not a shift)
with an lr that does not jump (``lr_jump_tol``, 5%) at t nor rise around it (``lr_rise``, 5% over
``lr_rise_points``, 10, each side: a cyclic schedule lifts the loss by itself). Confidence ``confidence`` (0.65),
plus ``permutation_confidence_gain`` (0.1) when the run config mentions a permutation. The eval no-shift test is
``eval_min_t`` (2) and ``train_over_eval`` (3); the windows' sizes are the fields ``local_*``, ``min_*``.

Source: docs/detectors.md#do01 (the thresholds, where each comes from, the published reports).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from forensics.detectors.base import Detector, fmt, segment_at
from forensics.model import Cause, Finding, Mechanism, RunData, Severity
from forensics.stats import MAD_TO_SIGMA

TREND_PARAMS = 3
"""Parameters of the quadratic trend ``b0 + b1 x + b2 x^2`` (the fit has one more: the shift ``d``)."""
COLLINEAR_TOL = 1e-12
"""A split whose residualised indicator has a squared norm at most this times n is explained by the trend
(numerically collinear: no shift can be estimated there; ours, a few ulps of float64 per point)."""
SE_FLOOR = 1e-300
"""Floor of the squared standard error of ``d``: a perfect fit gives a huge t instead of a division by zero."""


def level_shift(steps: np.ndarray, y: np.ndarray, t: float | None = None, min_side: int = 5
                ) -> tuple[float, float, float] | None:
    """Best level shift over a quadratic trend: ``y ~ b0 + b1 x + b2 x^2 + d [step >= t]``.

    Every candidate ``t`` (each logged step with ``min_side`` points on either side, or only ``t`` when
    given) is scored by the OLS t-statistic of ``d``. By the Frisch-Waugh-Lovell theorem that is the
    regression of the trend-residualised ``y`` on the trend-residualised step indicator, whose sums are
    suffix sums: O(n) for all candidates instead of one least-squares fit each (O(n^2)).

    Args:
        steps: Steps, shape (n,) (any order).
        y: Values, shape (n,); non-finite values are ignored.
        t: Test only this split step.
        min_side: Points required on each side of a scanned split.

    Returns:
        (split step, shift d in y's units, t-statistic of d) with the largest t-statistic, or None
        when there are fewer than ``2 * min_side + TREND_PARAMS`` finite points or no admissible split.
    """
    ok = np.isfinite(y)
    s, y = np.asarray(steps, float)[ok], np.asarray(y, float)[ok]
    order = np.argsort(s, kind="stable")
    s, y = s[order], y[order]
    n = s.size
    if n < 2 * min_side + TREND_PARAMS:
        return None
    x = (s - s.mean()) / (s.std() or 1.0)
    q, _ = np.linalg.qr(np.column_stack([np.ones(n), x, x * x]))
    ry = y - q @ (q.T @ y)  # y with the trend removed
    suffix_q = np.cumsum(q[::-1], axis=0)[::-1]  # Q^T z_k for z_k = [i >= k]
    suffix_ry = np.cumsum(ry[::-1])[::-1]  # z_k . ry
    cands = np.array([t], float) if t is not None else s[min_side:n - min_side]
    k = np.searchsorted(s, cands, "left")  # the indicator [step >= t] starts at the first such index
    count = n - k
    ok = (count >= (1 if t is not None else min_side)) & (count <= n - 1)
    if not ok.any():
        return None
    k, cands = k[ok], cands[ok]
    zz = (n - k) - np.einsum("ij,ij->i", suffix_q[k], suffix_q[k])  # |residualised indicator|^2
    good = zz > COLLINEAR_TOL * n
    if not good.any():
        return None
    k, cands, zz = k[good], cands[good], zz[good]
    d = suffix_ry[k] / zz
    rss = np.maximum(float(ry @ ry) - d * d * zz, 0.0)
    se = np.sqrt(np.maximum(rss / max(n - TREND_PARAMS - 1, 1) / zz, SE_FLOOR))
    tstat = d / se
    i = int(np.argmax(tstat))
    return float(cands[i]), float(d[i]), float(tstat[i])


@dataclass(frozen=True)
class OrderingShift(Detector):
    """A train-only level shift of the loss (data order or stream change)."""

    code = "DO01"
    name = "data.ordering_shift"
    requires = ("loss",)
    min_t: float = 6.0
    min_rel: float = 0.01
    min_points: int = 20
    min_eval_side: int = 3
    local_min_points: int = 5
    local_max_points: int = 20
    local_parts: int = 3
    local_min_side: int = 3
    local_frac: float = 0.5
    local_k_sigma: float = 3.0
    eval_min_t: float = 2.0
    train_over_eval: float = 3.0
    eval_min_side: int = 2
    lr_min_points: int = 3
    lr_jump_tol: float = 0.05
    lr_rise_points: int = 10
    lr_rise: float = 1.05
    confidence: float = 0.65
    permutation_confidence_gain: float = 0.1

    def _local_step(self, v: np.ndarray, k0: int, d: float) -> bool:
        """True when the finite losses ``v`` step up at index ``k0``: the fitted shift ``d`` is a local step.

        The median of the ``w`` points after ``k0`` exceeds that of the ``w`` before by ``local_frac`` of ``d``
        and ``local_k_sigma`` point-to-point noise sigmas (over ``local_parts`` windows each side), ``w`` between
        ``local_min_points`` and ``local_max_points`` and at most a ``local_parts``-th of either side (each side
        with ``local_min_side`` points at least).
        """
        p = self.local_parts
        w = max(self.local_min_points, min(self.local_max_points, k0 // p, (v.size - k0) // p))
        before, after = v[max(0, k0 - w):k0], v[k0:k0 + w]
        if before.size < self.local_min_side or after.size < self.local_min_side:
            return False
        noise = MAD_TO_SIGMA * float(np.median(np.abs(np.diff(v[max(0, k0 - p * w):k0 + p * w]))))
        local = float(np.median(after) - np.median(before))
        return not local < max(self.local_frac * d, self.local_k_sigma * noise / np.sqrt(2))

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
        if s is None or e is None or len(s) < self.min_points:
            return []
        best = level_shift(s.steps, s.values)
        if best is None:
            return []
        t, d, tstat = best
        med = float(np.nanmedian(s.values))
        if d <= 0 or tstat < self.min_t or d < self.min_rel * abs(med):
            return []
        if np.sum(e.steps < t) < self.min_eval_side or np.sum(e.steps >= t) < self.min_eval_side:
            return []  # too few eval points on a side to tell the train stream from the model
        # the shift is a step at t, not the curvature of a smooth decay that a quadratic trend misses: the
        # points right after t sit above the points right before it, beyond the loss's own noise
        fin = np.isfinite(s.values)
        st_f, v_f = s.steps[fin], s.values[fin]
        if not self._local_step(v_f, int(np.searchsorted(st_f, t)), d):
            return []
        eb = level_shift(e.steps, e.values, t=t, min_side=self.eval_min_side)
        if eb is not None and eb[2] >= self.eval_min_t and eb[1] >= d / self.train_over_eval:
            return []
        lr = run.series("lr")
        if lr is not None and len(lr) > self.lr_min_points:
            i = int(np.searchsorted(lr.steps, t))
            if 0 < i < len(lr):
                a, b = lr.values[i - 1], lr.values[i]
                if np.isfinite(a) and np.isfinite(b) and a > 0 and abs(b / a - 1) > self.lr_jump_tol:
                    return []
                # an lr that rises around t (cyclic schedules, warm restarts) lifts the loss by itself
                j = self.lr_rise_points
                lo_v, hi_v = lr.values[max(0, i - j)], lr.values[min(len(lr) - 1, i + j)]
                if np.isfinite(lo_v) and np.isfinite(hi_v) and lo_v > 0 and hi_v > self.lr_rise * lo_v:
                    return []
        step = int(t)
        cfg = repr(run.meta.get("config_files", {})).lower()
        hints = [h for h in ("permutation", "shuffle", "sampler", "mixture") if h in cfg]
        conf = self.confidence + (self.permutation_confidence_gain if "permutation" in hints else 0.0)
        return [self.finding(
            cause=Cause.DATA_BATCH, mechanism=Mechanism.ORDERING, step=step, segment=segment_at(s, step),
            confidence=conf,
            severity=Severity.MEDIUM,
            message=f"train loss steps up by {fmt(d)} ({d / abs(med):.1%}, t={tstat:.1f}) at step {step} and "
            f"stays there while {em} keeps its trend and the lr is smooth: the training stream changed, "
            "not the model" + (f" (the run config sets {', '.join(hints)})" if hints else "") + ".",
            evidence={"shift": d, "t_statistic": tstat, "eval_metric": em,
                      "eval_shift": eb[1] if eb else None, "eval_t_statistic": eb[2] if eb else None,
                      "config_hints": hints},
        )]
