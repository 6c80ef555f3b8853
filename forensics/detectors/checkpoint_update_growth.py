"""CK02 checkpoint.update_growth: update scale and norm growth read from consecutive checkpoints.

Four rules, each at most one finding (cause ``update_scale_growth``), all from the ``tensors`` and
``updates`` tables (DESIGN.md section 2) so they work when nothing of the kind was logged:

1. *Update ratio per step* ``ratio / (step_to - step_from)`` of a layer (``updates`` rows
   ``<prefix>.*`` and ``*``) reaches ``min_ratio_growth`` (2x) its value over the first pair of
   checkpoints after the lr peak, while the lr has not risen (Marin #1368: 2x update-norm spikes
   precede loss spikes; smdebug ``WeightUpdateRatio``) -> ``lr_too_high``.
2. *Q/K vs V*: the geometric mean of the Q and K projection norm growth since the first checkpoint
   reaches ``qk_min_growth`` (2x) and ``qk_vs_v`` (1.5x) the V projection's growth in the same layer:
   attention logits scale with ``|q||k|`` while V stays flat (Dehghani et al. 2023, ViT-22B;
   Wortsman et al. 2023, "Small-scale proxies for large-scale Transformer training instabilities")
   -> ``attention_logit_growth``. Fused QKV matrices are not split (their rows are not separable
   from per-tensor statistics).
3. *Output layer* (``lm_head``/``output``/``embed_out``/``head`` weight) norm growth of
   ``out_min_growth`` (2x) and ``out_vs_rest`` (1.5x) the median growth of the other matrices, still
   growing at the last checkpoint (Wortsman et al. 2023, output-logit divergence; PaLM z-loss)
   -> ``output_logit_divergence``.

   Rules 2 and 3 also ask that the growth be *sustained* at the flagged checkpoint: its rate per step
   is at least ``sustained_floor`` (0.75) times every earlier interval's, scaled up by the rise of
   the mean lr since then (Adam moves each weight by about lr per step: growth that only follows a
   warm-up's lr ramp, or the decelerating rise of early training, is not a runaway).
4. *Adam epsilon*: in a tensor of at least ``min_eps_numel`` coordinates, more than ``eps_share``
   (50%) of the coordinates with ``v > 0`` have ``sqrt(v_hat) <= 10 eps`` (eps from the optimizer's
   param_groups): the update there is set by eps, not by the gradient (Wortsman et al. 2023 section
   3.4; Molybog et al. 2023, "A theory on Adam instability in large-scale ML") -> ``adam_epsilon``.
   Latent risk, not a fault by itself: confidence ``eps_confidence`` (0.4) unless the logged loss went
   non-finite (``eps_confidence_loss_nonfinite``, 0.6).

Rule 1 allows the lr to rise by ``max_lr_rise`` (1.1x: 10%) at most; its confidence is ``ratio_confidence``
(0.55) when two or more layers (or the whole model) grow, ``ratio_confidence_one_layer`` (0.45) for one; rule 2
``qk_confidence`` (0.6), rule 3 ``out_confidence`` (0.55). Q/K/V projections are named by
:func:`forensics.model_parts.qkv_role`. Messages name ``max_named`` (4) layers and ``max_named_others`` (3)
unflagged ones; the evidence lists ``max_listed`` (12) hits and ``max_listed_all`` (24) layers.

Source: docs/detectors.md#ck02 (the thresholds, where each comes from, the published reports).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from forensics.detectors.base import Detector, checkpoint_segment, fmt
from forensics.model import Cause, Finding, Mechanism, RunData, Severity
from forensics.model_parts import is_output_head_tensor, qkv_role

PERCENT = 100
"""A share is shown per cent in a message (a unit, not a threshold)."""


def _norms(run: RunData) -> dict[str, list[tuple[int, float]]]:
    """Parameter name -> [(step, l2)] over checkpoints, finite positive norms only, step order."""
    t = run.tensors.filter((pl.col("role") == "param") & pl.col("step").is_not_null() & pl.col("l2").is_finite()
                           & (pl.col("l2") > 0) & (pl.col("n_nan") + pl.col("n_inf") == 0))
    out: dict[str, list[tuple[int, float]]] = {}
    for name, step, l2 in t.select("tensor", "step", "l2").sort("step").iter_rows():
        out.setdefault(name, []).append((int(step), float(l2)))
    return out


def _growth(series: list[tuple[int, float]], steps: list[int]) -> np.ndarray:
    d = dict(series)
    base = d[steps[0]]
    return np.array([d[s] / base for s in steps])


def _interval_lr(run: RunData, steps: list[int]) -> np.ndarray:
    """Mean logged lr over each checkpoint interval ``(steps[i], steps[i+1]]``; NaN where none was logged."""
    out = np.full(max(len(steps) - 1, 0), np.nan)
    lr = run.series("lr")
    if lr is None or not len(lr):
        return out
    for i in range(len(steps) - 1):
        sel = (lr.steps > steps[i]) & (lr.steps <= steps[i + 1]) & np.isfinite(lr.values)
        if sel.any():
            out[i] = float(np.mean(lr.values[sel]))
    return out


def _sustained(g: np.ndarray, steps: list[int], floor: float, lr: np.ndarray | None = None) -> np.ndarray:
    """Per checkpoint: does the norm keep growing (not the decelerating rise of early training)?

    True where the growth per step over the interval ending at that checkpoint is at least ``floor``
    times each earlier interval's, that earlier rate first scaled up by how much the mean lr rose
    since (``lr``: mean lr per interval, NaN when unknown). Adam moves every weight by about lr per
    step, so a norm that grows faster only because a warm-up is still raising the lr is not running
    away; a falling lr is not credited (the rule never gets looser than per step).
    """
    ok = np.zeros(g.shape[0], dtype=bool)
    rate = np.diff(g) / np.maximum(np.diff(np.asarray(steps, dtype=float)), 1.0)
    lrs = np.full(rate.shape[0], np.nan) if lr is None else np.asarray(lr, dtype=float)
    for i in range(2, g.shape[0]):
        cur = rate[i - 1]
        if not cur > 0:
            continue
        need = 0.0
        for j in range(i - 1):
            rise = lrs[i - 1] / lrs[j] if np.isfinite(lrs[i - 1]) and np.isfinite(lrs[j]) and lrs[j] > 0 else 1.0
            need = max(need, floor * float(rate[j]) * max(1.0, float(rise)))
        ok[i] = cur >= need
    return ok


@dataclass(frozen=True)
class CheckpointUpdateGrowth(Detector):
    """Update-ratio, Q/K, output-layer and Adam-epsilon evidence from checkpoints."""

    code = "CK02"
    name = "checkpoint.update_growth"
    min_ratio_growth: float = 2.0
    qk_min_growth: float = 2.0
    qk_vs_v: float = 1.5
    out_min_growth: float = 2.0
    out_vs_rest: float = 1.5
    sustained_floor: float = 0.75
    eps_share: float = 0.5
    min_eps_numel: int = 1024
    max_lr_rise: float = 1.1
    ratio_confidence: float = 0.55
    ratio_confidence_one_layer: float = 0.45
    qk_confidence: float = 0.6
    out_confidence: float = 0.55
    eps_confidence: float = 0.4
    eps_confidence_loss_nonfinite: float = 0.6
    max_named: int = 4
    max_named_others: int = 3
    max_listed: int = 12
    max_listed_all: int = 24

    def missing(self, run: RunData) -> str | None:
        """Skip reason when no checkpoint tensors were read."""
        return None if run.tensors.height else "needs checkpoint tensors (no readable checkpoint in the run folder)"

    def detect(self, run: RunData) -> list[Finding]:
        """Up to four findings, one per rule of the module docstring."""
        out = []
        norms = _norms(run)
        for rule in (self._ratio, self._qk, self._output):
            f = rule(run, norms)
            if f is not None:
                out.append(f)
        f = self._adam_eps(run)
        if f is not None:
            out.append(f)
        return out

    def _ratio(self, run: RunData, _norms: dict[str, list[tuple[int, float]]]) -> Finding | None:
        u = run.updates
        if u.height == 0:
            return None
        u = u.filter(pl.col("tensor").str.ends_with("*") & pl.col("ratio").is_finite() & (pl.col("step_to") >
                     pl.col("step_from"))).with_columns((pl.col("ratio") / (pl.col("step_to") - pl.col("step_from")))
                                                        .alias("rps")).sort("step_from")
        lr = run.series("lr")
        peak_step = None
        if lr is not None and len(lr) and np.isfinite(lr.values).any():
            peak_step = int(lr.steps[int(np.nanargmax(np.where(np.isfinite(lr.values), lr.values, -np.inf)))])

        def lr_at(step: int) -> float | None:
            if lr is None or not len(lr):
                return None
            i = max(0, min(int(np.searchsorted(lr.steps, step, side="right")) - 1, len(lr) - 1))
            return float(lr.values[i])

        hits = []
        for layer, g in u.group_by("tensor"):
            rows = g.sort("step_from").select("step_from", "step_to", "rps").rows()
            after = [r for r in rows if peak_step is None or r[0] >= peak_step] or rows
            base = after[0]
            for r in after[1:]:
                lb, lr_now = lr_at(base[1]), lr_at(r[1])
                if base[2] > 0 and r[2] >= self.min_ratio_growth * base[2] and (
                        lb is None or lr_now is None or lr_now <= self.max_lr_rise * lb):
                    hits.append({"layer": str(layer[0]), "step_from": int(r[0]), "step_to": int(r[1]),
                                 "ratio_per_step": r[2], "baseline_ratio_per_step": base[2],
                                 "baseline_pair": [int(base[0]), int(base[1])], "growth": r[2] / base[2]})
                    break
        if not hits:
            return None
        hits.sort(key=lambda h: (h["step_from"], -h["growth"]))
        h = hits[0]
        strong = len(hits) >= 2 or any(x["layer"] == "*" for x in hits)
        return self.finding(
            cause=Cause.UPDATE_SCALE_GROWTH, mechanism=Mechanism.LR_TOO_HIGH, step=h["step_from"],
            segment=checkpoint_segment(run, h["step_from"]),
            confidence=self.ratio_confidence if strong else self.ratio_confidence_one_layer, severity=Severity.MEDIUM,
            message=f"update ratio per step of {h['layer']} between checkpoints {h['step_from']} and {h['step_to']} is "
            f"{fmt(h['growth'])}x its value over checkpoints {h['baseline_pair'][0]}-{h['baseline_pair'][1]} "
            f"({len(hits)} layer(s) grow >= {self.min_ratio_growth:g}x) with no lr increase.",
            evidence={"layers": hits[: self.max_listed], "n_layers": len(hits), "lr_peak_step": peak_step},
        )

    def _qk(self, run: RunData, norms: dict[str, list[tuple[int, float]]]) -> Finding | None:
        groups: dict[str, dict[str, str]] = {}
        for name in norms:
            parts = name.split(".")
            which = qkv_role(parts[-2]) if len(parts) >= 2 and parts[-1] == "weight" else None
            if which is not None:
                groups.setdefault(".".join(parts[:-2]), {})[which] = name
        hits, seen = [], []
        for prefix, g in sorted(groups.items()):
            if set(g) != {"q", "k", "v"}:
                continue
            steps = sorted(set.intersection(*(set(dict(norms[g[x]])) for x in "qkv")))
            if len(steps) < 2:
                continue
            gq, gk, gv = (_growth(norms[g[x]], steps) for x in "qkv")
            qk = np.sqrt(gq * gk)
            ok = np.flatnonzero((qk >= self.qk_min_growth) & (qk >= self.qk_vs_v * gv)
                                & _sustained(qk, steps, self.sustained_floor, _interval_lr(run, steps)))
            seen.append({"layer": prefix, "since_step": steps[0], "step": steps[-1], "q_growth": float(gq[-1]),
                         "k_growth": float(gk[-1]), "qk_growth": float(qk[-1]), "v_growth": float(gv[-1]),
                         "flagged": bool(ok.size)})
            if ok.size:
                i = int(ok[0])
                hits.append({"layer": prefix, "step": steps[i], "since_step": steps[0], "qk_growth": float(qk[i]),
                             "v_growth": float(gv[i]), "q_growth": float(gq[i]), "k_growth": float(gk[i]),
                             "qk_growth_last": float(qk[-1]), "v_growth_last": float(gv[-1]),
                             "norms": {x: [[s, v] for s, v in norms[g[x]] if s in steps] for x in "qkv"}})
        if not hits:
            return None
        hits.sort(key=lambda h: (h["step"], -h["qk_growth"]))
        h = hits[0]
        per_layer = ", ".join(f"{x['layer']} Q/K {fmt(x['qk_growth'])}x vs V {fmt(x['v_growth'])}x at checkpoint "
                              f"{x['step']}" for x in hits[: self.max_named])
        more = f" and {len(hits) - self.max_named} more layer(s)" if len(hits) > self.max_named else ""
        rest, k = [x for x in seen if not x["flagged"]], self.max_named_others
        others = ("; other layers at their last checkpoint: " + ", ".join(
            f"{x['layer']} Q/K {fmt(x['qk_growth'])}x vs V {fmt(x['v_growth'])}x" for x in rest[:k])
            + (f" and {len(rest) - k} more" if len(rest) > k else "")) if rest else ""
        return self.finding(
            cause=Cause.UPDATE_SCALE_GROWTH, mechanism=Mechanism.ATTENTION_LOGIT_GROWTH, step=h["step"],
            segment=checkpoint_segment(run, h["step"]), confidence=self.qk_confidence, severity=Severity.HIGH,
            message=f"Q/K projection norms grew faster than V since checkpoint {h['since_step']} in {len(hits)} "
            f"layer(s): {per_layer}{more}: attention logits scale with |q||k|{others}.",
            evidence={"layers": hits[: self.max_listed], "n_layers": len(hits),
                      "all_layers": seen[: self.max_listed_all]},
        )

    def _output(self, run: RunData, norms: dict[str, list[tuple[int, float]]]) -> Finding | None:
        heads = [n for n in norms if is_output_head_tensor(n)]
        if not heads:
            return None
        shapes = dict(run.tensors.filter(pl.col("role") == "param").select("tensor", "shape").unique("tensor").rows())
        rest = [n for n in norms if n not in heads and len(shapes.get(n) or []) == 2]
        head = heads[0]
        steps = [s for s, _ in norms[head]]
        if len(steps) < 2 or not rest:
            return None
        g = _growth(norms[head], steps)
        med = []
        for s in steps:
            vals = [dict(norms[n]).get(s, math.nan) / norms[n][0][1] for n in rest if norms[n][0][0] == steps[0]]
            med.append(float(np.nanmedian(vals)) if vals and np.isfinite(vals).any() else math.nan)
        medv = np.array(med)
        ok = np.flatnonzero((g >= self.out_min_growth) & (g >= self.out_vs_rest * medv)
                            & _sustained(g, steps, self.sustained_floor, _interval_lr(run, steps)))
        if not ok.size:
            return None
        i = int(ok[0])
        return self.finding(
            cause=Cause.UPDATE_SCALE_GROWTH, mechanism=Mechanism.OUTPUT_LOGIT_DIVERGENCE, step=steps[i],
            segment=checkpoint_segment(run, steps[i]), confidence=self.out_confidence, severity=Severity.MEDIUM,
            message=f"output layer {head} norm grew {fmt(float(g[i]))}x since checkpoint {steps[0]} (median of the "
            f"other matrices {fmt(float(medv[i]))}x) without slowing down ({fmt(float(g[-1]))}x at checkpoint "
            f"{steps[-1]}).",
            evidence={"tensor": head, "step": steps[i], "since_step": steps[0], "growth": float(g[i]),
                      "median_other_growth": float(medv[i]), "growth_last": float(g[-1]),
                      "norms": [[s, v] for s, v in norms[head]]},
        )

    def _adam_eps(self, run: RunData) -> Finding | None:
        hits: list[dict[str, Any]] = []
        for c in run.meta.get("checkpoints") or []:
            for e in c.get("adam_eps") or []:
                if e.get("share", 0) > self.eps_share and e.get("numel", 0) >= self.min_eps_numel and c.get("step") \
                        is not None:
                    hits.append({"step": int(c["step"]), "checkpoint": c.get("path"), **e})
        if not hits:
            return None
        hits.sort(key=lambda h: (h["step"], -h["share"]))
        h = hits[0]
        loss = run.series("loss")
        failed = loss is not None and bool((~np.isfinite(loss.values)).any())
        return self.finding(
            cause=Cause.UPDATE_SCALE_GROWTH, mechanism=Mechanism.ADAM_EPSILON, step=h["step"],
            segment=checkpoint_segment(run, h["step"]),
            confidence=self.eps_confidence_loss_nonfinite if failed else self.eps_confidence, severity=Severity.LOW,
            message=f"{fmt(PERCENT * h['share'])}% of the coordinates of {h['tensor']} have sqrt(v) <= 10 eps "
            f"({fmt(h['eps_threshold'])}) at checkpoint {h['step']}: Adam's update there is set by eps, not by the "
            f"gradient ({len(hits)} tensor-checkpoint(s) above {self.eps_share:.0%}).",
            evidence={"tensors": hits[: self.max_listed], "n": len(hits)},
        )
