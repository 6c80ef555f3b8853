"""Proxy vs target: what changed in the configuration, where the dynamics parted, which change explains it.

``compare(proxy_path, target_path)`` returns the JSON object of DESIGN.md section 7 (``compare``):
``schema_version``, ``proxy``, ``target``, ``differences`` (:func:`forensics.config_diff.diff`),
``departure`` (the earliest signal where the target leaves the proxy's band), ``explanations`` (the
differences that matter, ranked by whether the departing signal is the one their mechanism predicts)
and ``trial`` (the short run that tests the top explanation). Extra keys: ``departures`` (per signal),
``alignment`` (``"step"`` or ``"tokens"``), ``target_analysis`` (the target's own verdict).

Departure test, per signal s in :data:`SIGNALS`, at matched steps (or matched tokens when both runs log
cumulative tokens and the tokens per step differ; the proxy is then interpolated at the target's tokens):

    d_t = f(target_t) - f(proxy_t),   f = log for positive signals, identity for log Z
    sigma = 1.4826 * MAD(diff(f(proxy)))          (the proxy's own step-to-step spread; MAD about the median)
    departure = first t with d_t > max(K_SIGMA * sigma, FLOOR) for SUSTAIN consecutive matched points

(two-sided, |d_t|, for log Z). One-sided for the others, because a target that sits *below* the proxy
(e.g. attention logits of a model without qk-layernorm start smaller) is not an instability.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from forensics import SCHEMA_VERSION
from forensics.config_diff import diff, extract_config
from forensics.model import RunData

SIGNALS = ("attn_logit_max", "log_z", "update_ratio", "grad_norm", "loss")
"""Signals aligned between proxy and target (canonical metric names)."""
K_SIGMA = 4.0
"""Departure threshold in robust sigmas of the proxy's own step-to-step spread (our choice)."""
FLOOR = math.log(1.10)
"""Minimum departure: 10% in ratio (0.095 nats for log Z); guards very smooth series (our choice)."""
SUSTAIN = 5
"""Consecutive matched points beyond the threshold needed (a departure that stays, not one noisy batch)."""

MECHANISMS: dict[str, tuple[str, tuple[str, ...], float]] = {
    "qk_layernorm": ("attention_logit_growth", ("attn_logit_max",), 0.5),
    "z_loss": ("output_logit_divergence", ("log_z",), 0.5),
    "peak_lr": ("lr_too_high", ("update_ratio", "grad_norm", "attn_logit_max", "log_z"), 0.45),
    "warmup_steps": ("warmup_too_short", ("update_ratio", "grad_norm"), 0.4),
    "warmup_tokens": ("warmup_too_short", ("update_ratio", "grad_norm"), 0.4),
    "global_batch_size": ("batch_lr_mismatch", ("update_ratio", "grad_norm"), 0.35),
    "grad_accum": ("grad_scaling", ("grad_norm",), 0.3),
    "eps": ("adam_epsilon", ("update_ratio",), 0.35),
    "beta1": ("optimizer_state", ("update_ratio", "grad_norm"), 0.25),
    "beta2": ("optimizer_state", ("update_ratio", "grad_norm"), 0.3),
    "optimizer": ("optimizer_state", ("update_ratio", "grad_norm"), 0.3),
    "precision": ("fp16_overflow", ("loss", "grad_norm", "attn_logit_max"), 0.4),
    "d_model": ("width_without_mup", ("update_ratio", "attn_logit_max", "grad_norm"), 0.35),
    "n_layers": ("depth", ("grad_norm", "update_ratio"), 0.3),
    "n_heads": ("head_dim", ("attn_logit_max",), 0.25),
    "mup": ("parametrisation", ("update_ratio", "attn_logit_max"), 0.35),
    "weight_decay": ("param_norm_growth", ("attn_logit_max", "log_z", "update_ratio"), 0.25),
    "init_std": ("init_scale", ("grad_norm", "attn_logit_max"), 0.3),
    "clip_grad_norm": ("no_clipping", ("grad_norm", "update_ratio"), 0.3),
    "seq_len": ("context_length", ("attn_logit_max",), 0.25),
    "norm": ("normalisation", ("grad_norm", "update_ratio"), 0.3),
    "norm_eps": ("normalisation", ("grad_norm",), 0.15),
    "lr_schedule": ("schedule", ("update_ratio",), 0.2),
    "total_steps": ("schedule", ("update_ratio",), 0.1),
}
"""Setting -> (mechanism through which a change acts, the signals that should depart first, prior)."""

ANALYSIS_LINKS: dict[str, tuple[str, ...]] = {
    "attention_logit_growth": ("qk_layernorm", "peak_lr", "d_model", "n_heads", "seq_len", "weight_decay"),
    "output_logit_divergence": ("z_loss", "weight_decay", "peak_lr"),
    "lr_too_high": ("peak_lr", "warmup_steps", "warmup_tokens", "global_batch_size", "d_model", "mup",
                    "clip_grad_norm", "beta2"),
    "adam_epsilon": ("eps",),
    "activation_overflow": ("precision", "qk_layernorm"),
    "loss_scale_collapse": ("precision",),
    "init_scale": ("init_std",),
    "ga_normalisation": ("grad_accum",),
}
"""The target's own analyze() mechanism -> the settings whose change it supports."""


def _aligned(proxy: RunData, target: RunData, metric: str, by_tokens: bool) -> tuple[np.ndarray, ...] | None:
    """(target steps, proxy values, target values) at matched steps, or at matched tokens."""
    ps, ts = proxy.series(metric), target.series(metric)
    if ps is None or ts is None or len(ps) < SUSTAIN or len(ts) < SUSTAIN:
        return None
    if by_tokens:
        ptok, ttok = proxy.series("tokens"), target.series("tokens")
        pt = np.interp(ps.steps, ptok.steps, ptok.values)  # type: ignore[union-attr]
        tt = np.interp(ts.steps, ttok.steps, ttok.values)  # type: ignore[union-attr]
        inside = (tt >= pt[0]) & (tt <= pt[-1])
        pv = np.interp(tt[inside], pt, ps.values)
        return ts.steps[inside], pv, ts.values[inside]
    common, pi, ti = np.intersect1d(ps.steps, ts.steps, return_indices=True)
    return common, ps.values[pi], ts.values[ti]


def _tokens_differ(proxy: RunData, target: RunData) -> bool:
    """True when both log cumulative tokens and the tokens per step differ by more than 1%."""
    rates = []
    for run in (proxy, target):
        s = run.series("tokens")
        if s is None or len(s) < 2 or s.steps[-1] == s.steps[0]:
            return False
        rates.append((s.values[-1] - s.values[0]) / (s.steps[-1] - s.steps[0]))
    return bool(rates[0] > 0 and abs(rates[1] / rates[0] - 1) > 0.01)


def departure_of(steps: np.ndarray, proxy: np.ndarray, target: np.ndarray, *, log: bool = True,
                 two_sided: bool = False) -> dict[str, Any] | None:
    """First matched step where the target leaves the proxy's band (see the module docstring).

    Args:
        steps: matched steps (n,).
        proxy: proxy values at those steps.
        target: target values at those steps.
        log: compare on the log scale (positive signals).
        two_sided: count departures below the proxy too.

    Returns:
        ``{"step", "delta", "threshold", "sigma", "proxy", "target"}`` at the departure, or ``None``.
        A non-finite target value where the proxy is finite counts as beyond the band.
    """
    f = (lambda v: np.log(np.where(v > 0, v, np.nan))) if log else (lambda v: np.asarray(v, dtype=np.float64))
    fp, ft = f(proxy), f(target)
    dp = np.diff(fp[np.isfinite(fp)])
    if dp.size < 3:
        return None
    sigma = 1.4826 * float(np.median(np.abs(dp - np.median(dp))))
    thr = max(K_SIGMA * sigma, FLOOR)
    d = ft - fp
    bad_target = ~np.isfinite(target) & np.isfinite(proxy)
    beyond = np.where(np.isfinite(d), (np.abs(d) if two_sided else d) > thr, bad_target)
    for i in range(0, beyond.size - SUSTAIN + 1):
        if beyond[i:i + SUSTAIN].all():
            return {"step": int(steps[i]), "delta": float(d[i]) if np.isfinite(d[i]) else float("inf"),
                    "threshold": thr, "sigma": sigma, "proxy": float(proxy[i]), "target": float(target[i])}
    return None


def departures(proxy: RunData, target: RunData) -> tuple[dict[str, dict[str, Any] | None], str]:
    """Departure of each signal of :data:`SIGNALS` logged by both runs, and the alignment used."""
    by_tokens = _tokens_differ(proxy, target)
    out: dict[str, dict[str, Any] | None] = {}
    for m in SIGNALS:
        al = _aligned(proxy, target, m, by_tokens)
        if al is None or al[0].size < SUSTAIN:
            continue
        out[m] = departure_of(*al, log=m != "log_z", two_sided=m == "log_z")
    return out, "tokens" if by_tokens else "step"


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def explain(differences: list[dict[str, Any]], deps: dict[str, dict[str, Any] | None],
            first: dict[str, Any] | None, analysis: Any | None) -> list[dict[str, Any]]:
    """Rank the differences that matter as explanations of the departure.

    Score = prior of the setting's mechanism (:data:`MECHANISMS`), +0.35 when the first departing signal
    is the mechanism's primary signal (+0.2 when it is one of its signals, -0.15 when it is none of them),
    +0.1 when another predicted signal departs too, +0.15 when the target's own analyze() mechanism
    supports the setting (:data:`ANALYSIS_LINKS`); clipped to [0.02, 0.98]. The target's analyze()
    finding is added as an explanation of its own (setting ``None``) when no difference covers it.

    Returns:
        ``[{"setting", "mechanism", "confidence", "for", "against"}]``, highest confidence first.
    """
    mech_an = getattr(analysis, "mechanism", None) if analysis is not None else None
    out: list[dict[str, Any]] = []
    covered = False
    for d in differences:
        if not d["matters"] or d["setting"] not in MECHANISMS:
            continue
        mech, sigs, score = MECHANISMS[d["setting"]]
        pro, con = [d["why"]], []
        if first is not None:
            dep = deps[first["signal"]] or {}
            where = (f"{first['signal']} departs first, at step {first['step']} (target {_fmt(dep.get('target'))} "
                     f"vs proxy {_fmt(dep.get('proxy'))})")
            if first["signal"] == sigs[0]:
                score += 0.35
                pro.append(f"{where}: the signal {mech} predicts")
            elif first["signal"] in sigs:
                score += 0.2
                pro.append(f"{where}: one of the signals {mech} predicts")
            else:
                score -= 0.15
                con.append(f"{where}; {mech} predicts {', '.join(sigs)} first")
            also = [s for s in sigs if s != first["signal"] and deps.get(s)]
            if also:
                score += 0.1
                pro.append("also departs: " + ", ".join(f"{s} at step {deps[s]['step']}" for s in also))  # type: ignore[index]
        else:
            con.append("no signal of the target leaves the proxy's band")
        if mech_an and d["setting"] in ANALYSIS_LINKS.get(mech_an, ()):
            score += 0.15
            covered = True
            pro.append(f"the target's own analysis, {analysis.summary}")
        out.append({"setting": d["setting"], "mechanism": mech, "confidence": round(min(0.98, max(0.02, score)), 3),
                    "for": pro, "against": con})
    if analysis is not None and analysis.cause and not covered:
        out.append({"setting": None, "mechanism": mech_an or analysis.cause,
                    "confidence": round(0.5 * float(analysis.confidence), 3),
                    "for": [f"the target's own analysis: {analysis.summary}"],
                    "against": ["no recorded configuration difference acts through this mechanism"]})
    out.sort(key=lambda e: -e["confidence"])
    return out


def trial_for(top: dict[str, Any] | None, differences: list[dict[str, Any]], first: dict[str, Any] | None,
              target_cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The short run that tests the top explanation: the target with the proxy's value of that one knob.

    Steps: through the departure step plus a margin of max(50, 50% of it), capped at the target's total steps.
    """
    if top is None or top["setting"] is None:
        return None
    d = next(x for x in differences if x["setting"] == top["setting"])
    total = target_cfg.get("total_steps")
    dep = first["step"] if first else None
    steps = dep + max(50, dep // 2) if dep is not None else min(total or 1000, 1000)
    if total:
        steps = min(steps, int(total))
    sig = first["signal"] if first else "loss"
    return {
        "name": f"restore {d['setting']}",
        "change": f"run the target with {d['setting']} = {d['proxy']} (the proxy's value; the target has "
                  f"{d['target']}), everything else unchanged, same seed and data order",
        "setting": d["setting"], "value": d["proxy"], "steps": int(steps),
        "control": "the unchanged target for the same steps (or its logged run), to rule out noise",
        "success_criteria": [
            f"{sig} stays inside the proxy's band (max({K_SIGMA:g} robust sigma, 10%)) through step {steps}"
            + (f", where the target left it at step {dep}" if dep is not None else ""),
            "loss at matched steps within the proxy's step-to-step spread",
        ],
    }


def compare(proxy_path: str | Path, target_path: str | Path) -> dict[str, Any]:
    """Compare a proxy run with its target run (DESIGN.md section 7, ``compare``).

    Args:
        proxy_path: The run folder of the proxy (the run that trained well).
        target_path: The run folder of the target (the run that did not).

    Returns:
        The JSON-ready dict: ``schema_version``, ``proxy``, ``target``, ``differences``, ``departure``,
        ``explanations``, ``trial`` (plus ``departures``, ``alignment``, ``target_analysis``, ``configs``).

    Raises:
        forensics.errors.InputError: either folder is missing or holds no logs.
    """
    from forensics.api import analyze_run, load

    proxy, target = load(proxy_path), load(target_path)
    pc, tc = extract_config(proxy), extract_config(target)
    differences = diff(pc, tc)
    deps, alignment = departures(proxy, target)
    hits = [(v["step"], SIGNALS.index(m), m) for m, v in deps.items() if v]
    first = None
    if hits:
        step, _, sig = min(hits)
        first = {"step": step, "signal": sig}
    analysis = analyze_run(target)
    explanations = explain(differences, deps, first, analysis if analysis.verdict != "healthy" else None)
    top = explanations[0] if explanations else None
    return {
        "schema_version": SCHEMA_VERSION, "proxy": str(proxy_path), "target": str(target_path),
        "differences": differences, "departure": first, "explanations": explanations,
        "trial": trial_for(top, differences, first, tc),
        "departures": deps, "alignment": alignment,
        "target_analysis": {"verdict": analysis.verdict, "cause": analysis.cause, "mechanism": analysis.mechanism,
                            "onset": dict(analysis.onset) if analysis.onset else None, "summary": analysis.summary},
        "configs": {"proxy": {k: v for k, v in pc.items() if k != "_found"},
                    "target": {k: v for k, v in tc.items() if k != "_found"}},
    }
