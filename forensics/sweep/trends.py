"""Size trends of a sweep: growth of the trend signals with width or depth at each lr, extrapolated to a target."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from forensics.sweep.predict import fit_line, predict_stable_lr
from forensics.sweep.runs import TREND_SIGNALS

SIZE_KEYS = ("d_model", "n_layers")
"""The size settings a family of groups may differ in (width, depth)."""
PARAMS_PER_LAYER = 12
"""Parameters per layer in units of d_model^2: attention 4 d^2 + MLP 8 d^2 (Kaplan et al. 2020, arXiv 2001.08361,
table 1)."""


def params_to_size(target_params: float, size_key: str, fixed: dict[str, Any], vocab: int | None) -> float | None:
    """The width (or depth) whose Transformer has ``target_params`` parameters, at the family's other sizes.

    Parameter count of a decoder-only Transformer: N = 12 L d^2 + 2 V d (attention 4 d^2 + MLP 8 d^2 per layer,
    untied input and output embeddings; Kaplan et al. 2020, arXiv 2001.08361, table 1, plus the output
    embedding); ``V`` = 0 when the vocabulary size is not recorded.
    """
    v = float(vocab or 0)
    if size_key == "d_model":
        layers = float(fixed.get("n_layers") or 0)
        if layers <= 0:
            return None
        a = PARAMS_PER_LAYER * layers  # the positive root of a d^2 + 2 V d - N = 0
        return float((-v + math.sqrt(v * v + a * float(target_params))) / a)
    d = float(fixed.get("d_model") or 0)
    if d <= 0:
        return None
    return float((target_params - 2 * v * d) / (PARAMS_PER_LAYER * d * d))




def size_trends(groups: list[dict[str, Any]], target_width: float | None = None,
                target_params: float | None = None, vocab: int | None = None
                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Growth of the trend signals with size at each fixed lr, and the predicted largest stable lr.

    For each family of groups that differ only in one size setting (:data:`SIZE_KEYS`): at every lr all
    its groups swept, per signal of :data:`TREND_SIGNALS`, the points (size, max of the signal over the run),
    the growth of each run (log of its max over its first value, nats) and the exponent b of a line through
    log max against log size (max ~ size^b), extrapolated to the target size.

    Args:
        groups: :func:`group_summary` results.
        target_width: Width to extrapolate to (``d_model`` families).
        target_params: Parameter count to extrapolate to (converted to the family's size by
            :func:`params_to_size`).
        vocab: Vocabulary size for the parameter count (``None``: not counted).

    Returns:
        ``(trends, predictions)``: trends ``[{"family", "key", "size_key", "lr", "signal", "points",
        "growth", "slope", "target_size", "target_d_model", "predicted"}]`` and one
        :func:`predict_stable_lr` result per family (with ``family``, ``key``, ``size_key``).
    """
    trends: list[dict[str, Any]] = []
    preds: list[dict[str, Any]] = []
    for size_key in SIZE_KEYS:
        fam: dict[str, list[dict[str, Any]]] = {}
        for g in groups:
            if g["key"].get(size_key) is None:
                continue
            rest = {k: v for k, v in g["key"].items() if k != size_key}
            fam.setdefault(repr(sorted(rest.items(), key=str)), []).append(g)
        for fid, members in fam.items():
            if len({g["key"][size_key] for g in members}) < 2:
                continue
            rest = {k: v for k, v in members[0]["key"].items() if k != size_key}
            target = None
            if size_key == "d_model" and target_width:
                target = float(target_width)
            elif target_params:
                target = params_to_size(target_params, size_key, {**rest, **_fixed_sizes(members, size_key)}, vocab)
            for lr in sorted(set.intersection(*({r["lr"] for r in g["runs"]} for g in members))):
                for signal in TREND_SIGNALS:
                    trend = _trend(members, size_key, lr, signal, target)
                    if trend is not None:
                        trends.append({"family": fid, "key": rest, **trend})
            p = predict_stable_lr(members, size_key, target)
            preds.append({"family": fid, "key": rest, **p})
    return trends, preds


def _trend(members: list[dict[str, Any]], size_key: str, lr: float, signal: str,
           target: float | None) -> dict[str, Any] | None:
    """One signal's max against size at one lr across a family, the power-law fit and its extrapolation."""
    pts, growth = [], []
    for g in sorted(members, key=lambda g: g["key"][size_key]):
        rs = [r for r in g["runs"] if r["lr"] == lr]
        vals = [r["signatures"].get(f"{signal}_max") for r in rs]
        vals = [v for v in vals if v is not None and math.isfinite(v) and v > 0]
        gr = [r["signatures"].get(f"{signal}_growth") for r in rs]
        gr = [v for v in gr if v is not None and math.isfinite(v)]
        if vals:
            pts.append([g["key"][size_key], float(np.mean(vals))])
            growth.append([g["key"][size_key], float(np.mean(gr)) if gr else None])
    if len(pts) < 2:
        return None
    f = fit_line(np.log([p[0] for p in pts]), np.log([p[1] for p in pts]))
    pred = float(math.exp(f["a"] + f["b"] * math.log(target))) if target else None
    return {"size_key": size_key, "lr": lr, "signal": signal, "points": pts, "growth": growth, "slope": f["b"],
            "residual_se": f["se"], "target_size": target,
            "target_d_model": target if size_key == "d_model" else None, "predicted": pred}


def _fixed_sizes(members: list[dict[str, Any]], size_key: str) -> dict[str, Any]:
    """The other size setting of a family, read from its runs' configs when the key does not vary."""
    other = "n_layers" if size_key == "d_model" else "d_model"
    vals = {g.get("_sizes", {}).get(other) for g in members}
    return {other: next(iter(vals))} if len(vals) == 1 and None not in vals else {}


