"""AT01 attention.logit_growth: attention logits (or Q/K weight norms) growing without bound.

Rule (docs/detectors.md#at01): the max attention logit exceeds ``max_logit`` (100, the default
threshold of Megatron-LM's ``qk_clip``) while growing, or leaves the trend of its early part
for good (a sustained log-linear rise: ``k_sigma`` (4) robust sigmas and ``min_rel`` (25%) above it, reaching at
least ``near_frac`` (half) of ``max_logit`` and growing ``min_growth`` (1.5x); a crossing counts when the
series stays above ``max_logit`` for ``hold_frac`` (80%) of the rest; ours). From weight norms: Q and K
projection norms of one layer growing while V stays flat (Dehghani et al. 2023, arXiv 2302.05442; Wortsman et al.
2023, arXiv 2309.14322, section 3.1: attention-logit growth, fixed by qk-layernorm): the Q/K-to-V norm
ratio rises for good and ends ``min_ratio_growth`` (1.2x) above its trend (each of Q, K, V with
``min_norm_points``, 8, common steps). Confidence ``confidence`` (0.85) over the threshold or from weight norms,
``confidence_drift_only`` (0.65) for a drift that stays below it.

Source: docs/detectors.md#at01 (the thresholds, where each comes from, the published reports).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from forensics.detectors.base import Detector, fmt, segment_at
from forensics.model import Cause, Finding, Mechanism, RunData, Severity
from forensics.model_parts import qkv_role
from forensics.stats import Drift, sustained_rise, sustained_rise_many

_QKV_RISE = {"log": True, "k_sigma": 4.0, "min_rel": 0.03, "min_run": 3}
"""The Q/K-to-V ratio's sustained rise: 4 robust sigmas and 3% above its early trend for 3 points (our choice)."""
NORM_FLOOR = 1e-30
"""Floor of a norm or ratio that a growth is divided by: guards a zero, far below any weight norm (ours)."""


@dataclass(frozen=True)
class AttentionLogitGrowth(Detector):
    """Attention-logit growth from logged max logits or from per-layer Q/K/V weight norms."""

    code = "AT01"
    name = "attention.logit_growth"
    max_logit: float = 100.0
    min_ratio_growth: float = 1.2
    min_points: int = 12
    k_sigma: float = 4.0
    min_rel: float = 0.25
    hold_frac: float = 0.8
    near_frac: float = 0.5
    min_growth: float = 1.5
    min_norm_points: int = 8
    confidence: float = 0.85
    confidence_drift_only: float = 0.65

    def missing(self, run: RunData) -> str | None:
        """Needs ``attn_logit_max`` (global or per layer) or per-layer q/k/v weight norms."""
        if any(m.startswith("attn_logit_max") for m in run.metric_names) or self._qkv_triples(run):
            return None
        return "needs attn_logit_max or per-layer q/k/v projection norms"

    def detect(self, run: RunData) -> list[Finding]:
        """At most one finding: the earliest sustained growth, with per-layer evidence."""
        best: tuple[int, str, dict[str, object]] | None = None
        for m in [m for m in run.metric_names if m.startswith("attn_logit_max")]:
            s = run.series(m)
            if s is None or len(s) < self.min_points:
                continue
            d = sustained_rise(s.steps, s.values, log=True, k_sigma=self.k_sigma, min_rel=self.min_rel)
            fin = np.where(np.isfinite(s.values), s.values, np.nan)
            vmax = float(np.nanmax(fin)) if np.isfinite(fin).any() else float("nan")
            above = (s.values > self.max_logit) | np.isposinf(s.values)
            cross = None
            if above.any():
                # first crossing after which the series stays above the threshold for hold_frac of the rest
                c = np.concatenate([[0], np.cumsum(above)])
                idx = np.flatnonzero(above)
                stays = (c[above.size] - c[idx]) / (above.size - idx) >= self.hold_frac
                cross = int(idx[np.argmax(stays)]) if stays.any() else None
            onset = None
            if d is not None and vmax >= self.near_frac * self.max_logit and d.growth >= self.min_growth:
                onset = d.onset_step
            if cross is not None and (onset is None or int(s.steps[cross]) < onset):
                onset = int(s.steps[cross])
            if onset is None:
                continue
            ev = {"metric": m, "onset_step": onset, "max_value": vmax, "last_value": float(s.values[-1]),
                  "qk_clip_threshold": self.max_logit, "exceeds_qk_clip_threshold": bool(above.any()),
                  "first_sustained_crossing": int(s.steps[cross]) if cross is not None else None,
                  "drift_onset": d.onset_step if d is not None else None,
                  "value_at_onset": float(s.values[np.searchsorted(s.steps, onset)])}
            if best is None or onset < best[0]:
                best = (onset, m, ev)
        for onset, what, ev in self._qkv_growth(run):
            if best is None or onset < best[0]:
                best = (onset, what, ev)
        if best is None:
            return []
        step, what, ev = best
        s_any = run.series(str(ev["metric"])) if "layer" not in ev else None
        seg = segment_at(s_any, step) if s_any is not None else 0
        if "layer" in ev:
            msg = (f"{what}: Q/K projection norms grow {ev['qk_norm_growth']}x while V grows "
                   f"{ev['v_norm_growth']}x; the Q/K-to-V ratio leaves its band at step {step}")
        else:
            msg = (f"{what} rises for good from step {step} ({fmt(ev['value_at_onset'])} there, max "
                   f"{fmt(ev['max_value'])}; the qk-clip threshold is {fmt(self.max_logit)})")
        conf = self.confidence if ("layer" in ev or ev.get("exceeds_qk_clip_threshold")) else self.confidence_drift_only
        return [self.finding(cause=Cause.UPDATE_SCALE_GROWTH, mechanism=Mechanism.ATTENTION_LOGIT_GROWTH, step=step,
                             segment=seg, confidence=conf, severity=Severity.HIGH, message=msg + ".", evidence=ev)]

    def _qkv_growth(self, run: RunData) -> list[tuple[int, str, dict[str, object]]]:
        """(onset, what, evidence) per layer whose Q/K-to-V norm ratio rises for good.

        Every layer's ratio sqrt(|q k|) / |v| is computed as one (layers x steps) frame and tested by one
        :func:`forensics.stats.sustained_rise_many` call when the layers share a step axis and are finite; a layer
        that does not (other steps, a NaN) is tested on its own.
        """
        rows: list[tuple[str, tuple[str, str, str], np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        for layer, (q, k, v) in self._qkv_triples(run).items():
            sq, sk, sv = run.series(q), run.series(k), run.series(v)
            if sq is None or sk is None or sv is None or len(sv) < self.min_norm_points:
                continue
            steps, qv, kv, vv = sq.steps, sq.values, sk.values, sv.values
            if not (np.array_equal(steps, sk.steps) and np.array_equal(steps, sv.steps)):
                steps = np.intersect1d(np.intersect1d(sq.steps, sk.steps, assume_unique=True), sv.steps,
                                       assume_unique=True)
                qv = sq.values[np.searchsorted(sq.steps, steps)]
                kv = sk.values[np.searchsorted(sk.steps, steps)]
                vv = sv.values[np.searchsorted(sv.steps, steps)]
            if steps.size < self.min_norm_points:
                continue
            rows.append((layer, (q, k, v), steps, qv, kv, vv))
        if not rows:
            return []
        with np.errstate(all="ignore"):
            ratios = [np.sqrt(np.abs(qv * kv)) / np.where(vv != 0, np.abs(vv), np.nan) for *_, qv, kv, vv in rows]
        drifts: list[Drift | None] = [None] * len(rows)
        st0 = rows[0][2]
        frame = [i for i, r in enumerate(rows) if np.array_equal(r[2], st0) and np.all(np.isfinite(ratios[i]))
                 and np.all(ratios[i] > 0)]
        if frame:
            for i, d in zip(frame, sustained_rise_many(st0, [ratios[i] for i in frame], **_QKV_RISE),
                            strict=True):
                drifts[i] = d
        alone = set(range(len(rows))) - set(frame)
        for i in sorted(alone):
            drifts[i] = sustained_rise(rows[i][2], ratios[i], **_QKV_RISE)
        out = []
        for (layer, (q, k, v), _steps, qv, kv, vv), d in zip(rows, drifts, strict=True):
            if d is None or (d.last / max(d.baseline, NORM_FLOOR)) < self.min_ratio_growth:
                continue
            growth_qk = float(np.sqrt(abs(qv[-1] * kv[-1])) / max(np.sqrt(abs(qv[0] * kv[0])), NORM_FLOOR))
            growth_v = float(abs(vv[-1]) / max(abs(vv[0]), NORM_FLOOR))
            ev = {"metric": f"{q}, {k} vs {v}", "layer": layer, "onset_step": d.onset_step,
                  "qk_norm_growth": round(growth_qk, 2), "v_norm_growth": round(growth_v, 2),
                  "q_norm": [float(qv[0]), float(qv[-1])], "k_norm": [float(kv[0]), float(kv[-1])],
                  "v_norm": [float(vv[0]), float(vv[-1])]}
            out.append((d.onset_step, f"{layer} Q/K vs V norms", ev))
        return out

    @staticmethod
    def _qkv_triples(run: RunData) -> dict[str, tuple[str, str, str]]:
        """Per layer: (q metric, k metric, v metric) among weight-norm metrics, self-attention only."""
        groups: dict[str, dict[str, str]] = {}
        for m in run.metric_names:
            low = m.lower()
            if "cross" in low or not any(t in low for t in ("norm", "wnorm")):
                continue
            leaf = low.rsplit(".", 1)[-1] if low.endswith("_proj") or low[-1:] in "qkv" else low
            tail = leaf.rsplit("/", 1)[-1]
            which = qkv_role(tail)
            if which is None:
                continue
            layer = m[: len(m) - len(tail)]
            groups.setdefault(layer, {})[which] = m
        return {layer: (g["q"], g["k"], g["v"]) for layer, g in groups.items() if {"q", "k", "v"} <= g.keys()}
