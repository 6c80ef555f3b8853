"""Proxy vs target: what changed in the configuration, where the dynamics parted, which change explains it.

``compare(proxy_path, target_path)`` returns the JSON object of DESIGN.md section 7 (``compare``):
``schema_version``, ``proxy``, ``target``, ``differences`` (:func:`forensics.config_diff.diff`, plus the
settings read from the logs when a configuration lacks them: peak lr, warm-up, tokens per step),
``departure`` (the earliest series where the target leaves the proxy's band, with the gap and the step),
``explanations`` (ranked by the evidence that tells the settings apart) and ``trial`` (the short run that
tests the top one). Extra keys: ``departures`` (per series), ``alignment`` (``"step"`` or ``"tokens"``),
``lr_evidence`` (peak lr vs warm-up), ``mup_check``, ``target_analysis``, ``configs``.

Departure test, for EVERY series both runs log (any writer; the lr and bookkeeping series of
:data:`CONTROLS` excepted, they are evidence, not dynamics), at matched steps, or at matched tokens seen
when the tokens per step differ (the proxy interpolated at the target's tokens):

    g_i = f(target_i) - f(proxy_i)       f = log for positive series (relative log-gap), identity for log Z
    sigma_i = sqrt(2) * 1.4826 * MAD(f(proxy) - running median_5(f(proxy))) over the trailing WINDOW aligned
              points (the proxy's own noise band; a smooth trend is not noise)
    departure = first i with g_i > max(K_SIGMA * sigma_i, floor) and g_i - g_0 > the same band, for SUSTAIN
                consecutive points (or until the target's log ends: a run that departs and dies has nothing after)

floor = 20% for the losses, a factor 5 for the growth series and the rest (:data:`FLOOR`, :data:`FLOOR_GROWTH`:
twice what seeds alone do). g_0, the gap at the first aligned point, is the offset the settings give at
initialisation (a wider model's parameter norm and initial logits are larger from step 1): a departure is a
gap that GROWS beyond the band, not a constant offset.

One-sided (target above the proxy) for the growth series and the losses, because a target that sits
*below* (attention logits of a model without qk-layernorm start smaller) is not an instability;
two-sided for log Z and for series of unknown meaning. Growth series (:data:`GROWTH`) are searched
like the loss, so an attention-logit departure is found while the losses have not parted yet.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from forensics import SCHEMA_VERSION
from forensics.config_diff import diff, extract_config
from forensics.model import RunData

GROWTH = ("attn_logit_max", "output_logit_max", "log_z", "update_ratio", "grad_norm", "param_norm")
"""Growth series, in the order a tie at one step is reported (earliest on the causal path first)."""
LOSSES = ("loss", "eval_loss")
SIGNALS = (*GROWTH, *LOSSES)
"""The named series (canonical metric names); any other series both runs log is searched too, after them."""
CONTROLS = frozenset({"lr", "tokens", "batch_index", "seq_len", "skipped_step", "throughput", "epoch",
                      "global_step", "step", "wall_time", "samples", "runtime", "timestamp", "_runtime",
                      "_timestamp", "_step", "time", "iteration", "consumed_samples"})
"""Series that record what the job was told or how far it went, not how it behaved (never a departure)."""
K_SIGMA = 4.0
"""Departure threshold in robust sigmas of the proxy's own noise band (our choice)."""
FLOOR = math.log(1.2)
"""Minimum departure of a loss: 20% in ratio, twice the largest sustained loss gap (0.08 nats over 5 points)
of three seed-only pairs (runs that differ only in init and data order; ``sample_logs/make_compare_runs.py``)."""
FLOOR_GROWTH = math.log(5.0)
"""Minimum departure of a growth series, of log Z (nats) and of any other series: a factor 5, twice the largest
sustained gap (0.78 nats: attention logits, log Z) of the same seed-only pairs. The instabilities sought grow by
orders of magnitude (Wortsman et al. 2023 s3.1.1: attention logits from ~10 to thousands)."""
SUSTAIN = 5
"""Consecutive aligned points beyond the threshold needed (a departure that stays, not one noisy batch)."""
WINDOW = 20
"""Trailing aligned points over which the proxy's noise band is estimated (our choice)."""
SMOOTH = 5
"""Points of the running median whose residuals are the proxy's noise (our choice)."""
SIGNAL_SETTINGS: dict[str, tuple[str, ...]] = {
    "attn_logit_max": ("qk_layernorm", "peak_lr", "warmup_steps", "d_model"),
    "output_logit_max": ("z_loss", "peak_lr"),
    "log_z": ("z_loss", "peak_lr"),
    "update_ratio": ("peak_lr", "warmup_steps", "global_batch_size"),
    "grad_norm": ("peak_lr", "warmup_steps", "clip_grad_norm"),
}
"""A departing series -> settings whose change acts through it (used when no configuration records one)."""

MECHANISMS: dict[str, tuple[str, tuple[str, ...], float]] = {
    "qk_layernorm": ("attention_logit_growth", ("attn_logit_max",), 0.5),
    "z_loss": ("output_logit_divergence", ("log_z", "output_logit_max"), 0.5),
    "peak_lr": ("lr_too_high", ("update_ratio", "grad_norm", "attn_logit_max", "output_logit_max", "log_z"), 0.45),
    "warmup_steps": ("warmup_too_short", ("update_ratio", "grad_norm", "attn_logit_max", "output_logit_max"), 0.4),
    "warmup_tokens": ("warmup_too_short", ("update_ratio", "grad_norm", "attn_logit_max", "output_logit_max"), 0.4),
    "global_batch_size": ("batch_lr_mismatch", ("loss", "update_ratio", "grad_norm", "eval_loss"), 0.4),
    "grad_accum": ("grad_scaling", ("grad_norm",), 0.3),
    "eps": ("adam_epsilon", ("update_ratio",), 0.35),
    "beta1": ("optimizer_state", ("update_ratio", "grad_norm"), 0.25),
    "beta2": ("optimizer_state", ("update_ratio", "grad_norm"), 0.3),
    "optimizer": ("optimizer_state", ("update_ratio", "grad_norm"), 0.3),
    "precision": ("fp16_overflow", ("loss", "grad_norm", "attn_logit_max"), 0.4),
    "d_model": ("width_without_mup", ("attn_logit_max", "update_ratio", "grad_norm", "output_logit_max"), 0.4),
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


def _tokens_curve(run: RunData, cfg: dict[str, Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """(steps, cumulative tokens) from the logged ``tokens`` series, else global batch x seq length x step."""
    s = run.series("tokens")
    if s is not None and len(s) >= 2 and np.isfinite(s.values).all() and s.values[-1] > s.values[0]:
        return s.steps.astype(np.float64), s.values
    if cfg.get("global_batch_size") and cfg.get("seq_len"):
        loss = run.series("loss")
        if loss is not None and len(loss) >= 2:
            st = loss.steps.astype(np.float64)
            return st, st * float(cfg["global_batch_size"]) * float(cfg["seq_len"])
    return None


def tokens_per_step(run: RunData, cfg: dict[str, Any]) -> float | None:
    """Tokens per optimizer step, from the logged tokens or the configuration; ``None`` when unknown."""
    c = _tokens_curve(run, cfg)
    if c is None or c[0][-1] == c[0][0]:
        return None
    return float((c[1][-1] - c[1][0]) / (c[0][-1] - c[0][0]))


def _aligned(proxy: RunData, target: RunData, metric: str, tok: tuple[Any, Any] | None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None] | None:
    """(target steps, proxy values, target values, target tokens or None), matched by step or by tokens."""
    ps, ts = proxy.series(metric), target.series(metric)
    if ps is None or ts is None or len(ps) < SUSTAIN or len(ts) < 2:
        return None
    if tok is not None:
        (pst, ptk), (tst, ttk) = tok
        pt = np.interp(ps.steps, pst, ptk)
        tt = np.interp(ts.steps, tst, ttk)
        inside = (tt >= pt[0]) & (tt <= pt[-1])
        pv = ps.values
        fin = np.isfinite(pv)
        if fin.sum() < 2:
            return None
        # interpolate in log space for positive series (growth is multiplicative), over finite proxy points
        if bool(np.all(pv[fin] > 0)):
            pvi = np.exp(np.interp(tt[inside], pt[fin], np.log(pv[fin])))
        else:
            pvi = np.interp(tt[inside], pt[fin], pv[fin])
        return ts.steps[inside], pvi, ts.values[inside], tt[inside]
    common, pi, ti = np.intersect1d(ps.steps, ts.steps, return_indices=True)
    if common.size >= 0.5 * min(len(ps), len(ts)):
        return common, ps.values[pi], ts.values[ti], None
    # the two runs log at different steps (every 10 vs every step, or offset): the proxy interpolated at the
    # target's steps inside its range (log space for a positive series)
    fin = np.isfinite(ps.values)
    inside = (ts.steps >= ps.steps[0]) & (ts.steps <= ps.steps[-1])
    if fin.sum() < 2 or not inside.any():
        return common, ps.values[pi], ts.values[ti], None
    x, v = ps.steps[fin].astype(np.float64), ps.values[fin]
    tx = ts.steps[inside].astype(np.float64)
    pvi = np.exp(np.interp(tx, x, np.log(v))) if bool(np.all(v > 0)) else np.interp(tx, x, v)
    return ts.steps[inside], pvi, ts.values[inside], None


def departure_of(steps: np.ndarray, proxy: np.ndarray, target: np.ndarray, *, log: bool = True,
                 two_sided: bool = False, floor: float = FLOOR) -> dict[str, Any] | None:
    """First aligned point where the target leaves the proxy's noise band (see the module docstring).

    Args:
        steps: aligned (target) steps, shape (n,).
        proxy: proxy values at those points, shape (n,).
        target: target values at those points, shape (n,).
        log: compare on the log scale (a relative gap; positive series).
        two_sided: count departures below the proxy too.
        floor: the smallest gap that counts (:data:`FLOOR` for losses, :data:`FLOOR_GROWTH` otherwise).

    Returns:
        ``{"step", "index", "delta" (the gap: nats on the log scale), "ratio" (target/proxy, log scale only),
        "threshold", "sigma", "proxy", "target"}`` at the departure, or ``None``. A non-finite target value
        where the proxy is finite counts as beyond the band.
    """
    proxy, target = np.asarray(proxy, dtype=np.float64), np.asarray(target, dtype=np.float64)
    if log:
        with np.errstate(divide="ignore", invalid="ignore"):
            fp = np.log(np.where(proxy > 0, proxy, np.nan))
            ft = np.log(np.where(target > 0, target, np.nan))
    else:
        fp, ft = proxy.copy(), target.copy()
    n = fp.size
    if np.isfinite(fp).sum() < 4:
        return None
    # the proxy's noise band: robust spread of its residuals about a running median (so a fast but smooth
    # early-training trend is not counted as noise), over a trailing window; sqrt(2): the gap of two noisy runs
    from scipy.ndimage import median_filter

    fin = np.isfinite(fp)
    smooth = np.full(n, np.nan)
    smooth[fin] = median_filter(fp[fin], size=SMOOTH, mode="nearest")
    resid = fp - smooth
    sigma = np.full(n, np.nan)
    for i in range(n):
        hi = max(i + 1, min(WINDOW, n))
        w = resid[max(0, hi - WINDOW):hi]
        w = w[np.isfinite(w)]
        if w.size >= 3:
            sigma[i] = math.sqrt(2) * 1.4826 * float(np.median(np.abs(w - np.median(w))))
    if np.isnan(sigma).all():
        return None
    sigma = np.where(np.isnan(sigma), np.nanmedian(sigma), sigma)
    thr = np.maximum(K_SIGMA * sigma, floor)
    d = ft - fp
    fin0 = np.flatnonzero(np.isfinite(d))
    d0 = float(d[fin0[0]]) if fin0.size else 0.0  # the gap at the first aligned point: the initial offset
    bad_target = ~np.isfinite(target) & np.isfinite(proxy)
    with np.errstate(invalid="ignore"):
        if two_sided:
            out_band = (np.abs(d) > thr) & (np.abs(d - d0) > thr)
        else:
            out_band = (d > thr) & (d - d0 > thr)
        beyond = np.where(np.isfinite(d), out_band, bad_target)
    for i in range(n):
        need = min(SUSTAIN, n - i)
        died = need == 1 and bool(bad_target[i])  # the target's last point is non-finite: the job died there
        if (need >= 2 or died) and beyond[i:i + need].all():
            fin = bool(np.isfinite(d[i]))
            return {"step": int(steps[i]), "index": i, "delta": float(d[i]) if fin else float("inf"), "offset": d0,
                    "ratio": float(np.exp(d[i])) if log and fin else None,
                    "threshold": float(thr[i]), "sigma": float(sigma[i]),
                    "proxy": float(proxy[i]), "target": float(target[i])}
    return None


def _series_order(name: str) -> tuple[int, str]:
    base = name.split("/")[0]
    return (SIGNALS.index(base) if base in SIGNALS else len(SIGNALS), name)


def departures(proxy: RunData, target: RunData, pc: dict[str, Any] | None = None,
               tc: dict[str, Any] | None = None) -> tuple[dict[str, dict[str, Any] | None], str]:
    """Departure of every series both runs log (:data:`CONTROLS` excepted), and the alignment used.

    Args:
        proxy: The proxy run.
        target: The target run.
        pc: The proxy's canonical config (tokens per step when the tokens are not logged).
        tc: The target's canonical config.

    Returns:
        ``({series: departure or None}, "step" | "tokens")``; a departure is :func:`departure_of`'s dict plus
        ``"tokens"`` (the target's tokens seen at the departure) when aligned by tokens.
    """
    pc, tc = pc or {}, tc or {}
    pcur, tcur = _tokens_curve(proxy, pc), _tokens_curve(target, tc)
    tok = None
    if pcur is not None and tcur is not None:
        rp, rt = tokens_per_step(proxy, pc), tokens_per_step(target, tc)
        if rp and rt and abs(rt / rp - 1) > 0.01:
            tok = (pcur, tcur)
    shared = sorted(set(proxy.metric_names) & set(target.metric_names), key=_series_order)
    out: dict[str, dict[str, Any] | None] = {}
    for m in shared:
        base = m.split("/")[0]
        if base in CONTROLS or m.startswith(("lr_", "lr-")):
            continue
        al = _aligned(proxy, target, m, tok)
        if al is None or al[0].size < SUSTAIN:
            continue
        steps, pv, tv, ttok = al
        pos = bool(np.all(pv[np.isfinite(pv)] > 0) and np.all(tv[np.isfinite(tv)] > 0))
        known = base in SIGNALS
        dep = departure_of(steps, pv, tv, log=pos and base != "log_z", two_sided=base == "log_z" or not known,
                           floor=FLOOR if base in LOSSES else FLOOR_GROWTH)
        if dep is not None and ttok is not None:
            dep["tokens"] = float(ttok[dep["index"]])
        out[m] = dep
    return out, "tokens" if tok is not None else "step"


def first_departure(deps: dict[str, dict[str, Any] | None]) -> dict[str, Any] | None:
    """The earliest departure (ties: the series earliest on the causal path, :data:`SIGNALS` order).

    Returns:
        ``{"step", "signal", "gap", "ratio", "proxy", "target", "threshold"}`` (and ``tokens`` when aligned
        by tokens), or ``None`` when no series departs.
    """
    hits = [(v["step"], _series_order(m), m) for m, v in deps.items() if v]
    if not hits:
        return None
    step, _, sig = min(hits)
    d = deps[sig] or {}
    out = {"step": step, "signal": sig, "gap": d["delta"], "ratio": d["ratio"], "proxy": d["proxy"],
           "target": d["target"], "threshold": d["threshold"]}
    if "tokens" in d:
        out["tokens"] = d["tokens"]
    return out


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


LR_SHARE = 0.75
"""Share of log(lr ratio at the departure) one cause must carry to decide peak lr vs warm-up (our choice)."""


def lr_schedule_of(run: RunData, cfg: dict[str, Any]) -> dict[str, Any] | None:
    """Peak lr and warm-up length from the logged lr (else from the configuration, linear warm-up assumed).

    Returns:
        ``{"peak_lr", "warmup_steps" (steps from the first logged step to 99% of the peak; 0 without a
        ramp), "source": "logs" | "config", "steps", "lr"}`` (``steps``/``lr`` arrays: the trace, logs
        only), or ``None`` when neither records a lr.
    """
    s = run.series("lr")
    if s is not None and len(s) >= 3 and np.isfinite(s.values).any():
        v = np.where(np.isfinite(s.values), s.values, np.nan)
        peak = float(np.nanmax(v))
        if peak > 0:
            reach = int(np.flatnonzero(v >= 0.99 * peak)[0])
            ramp = v[0] < 0.5 * peak
            return {"peak_lr": peak, "warmup_steps": int(s.steps[reach] - s.steps[0] + 1) if ramp else 0,
                    "source": "logs", "steps": s.steps, "lr": v}
    if cfg.get("peak_lr"):
        return {"peak_lr": float(cfg["peak_lr"]), "warmup_steps": int(cfg.get("warmup_steps") or 0),
                "source": "config", "steps": None, "lr": None}
    return None


def _lr_at(sched: dict[str, Any], step: float) -> float:
    if sched["steps"] is not None:
        return float(np.interp(step, sched["steps"], sched["lr"]))
    w = sched["warmup_steps"]
    return sched["peak_lr"] * (min(1.0, step / w) if w else 1.0)


def lr_evidence(ps: dict[str, Any] | None, ts: dict[str, Any] | None,
                first: dict[str, Any] | None) -> dict[str, Any] | None:
    """Which of peak lr and warm-up the departure points at, from the two lr schedules.

    At the departure step d the target's lr is q x the proxy's; the peak ratio P = peak_t / peak_p carries
    log P of log q and the schedule's shape (a steeper or shorter warm-up ramp) carries log(q / P). The
    cause carrying at least :data:`LR_SHARE` of |log P| + |log(q/P)| decides: a departure inside the
    warm-up with a steeper ramp and the same peak points at the warm-up; a departure after the peak at a
    higher peak lr points at the peak lr. Otherwise both act and the report names the run that separates them.

    Returns:
        ``{"step", "lr_ratio", "peak_ratio", "shape_ratio", "inside_warmup", "decides": "warmup_steps" |
        "peak_lr" | "neither" | "ambiguous", "why", "separate", "source"}``, or ``None`` without a departure
        or without both schedules.
    """
    if ps is None or ts is None or first is None:
        return None
    d = float(first["step"])
    lp, lt = _lr_at(ps, d), _lr_at(ts, d)
    if not (lp > 0 and lt > 0):
        return None
    q, peak = lt / lp, ts["peak_lr"] / ps["peak_lr"]
    shape = q / peak
    wmax = max(ps["warmup_steps"], ts["warmup_steps"])
    inside = d <= wmax
    a, b = abs(math.log(peak)), abs(math.log(shape))
    where = (f"at the departure (step {int(d)}, {'inside' if inside else 'after'} the warm-up: proxy "
             f"{ps['warmup_steps']} steps, target {ts['warmup_steps']}) the target's lr was x{q:.3g} the proxy's "
             f"({lt:.3g} vs {lp:.3g}); peak lr ratio x{peak:.3g}, schedule shape x{shape:.3g}")
    sep = ("rerun the target with the proxy's warm-up and its own peak lr for a few hundred steps past the "
           "departure: a departure that goes away points at the warm-up, one that stays at the peak lr")
    if abs(math.log(q)) < math.log(1.05):
        decides = "neither"
        why = where + ": the lrs were equal there, neither the peak nor the warm-up acts at that step"
    elif b / (a + b) >= LR_SHARE:
        decides = "warmup_steps"
        why = where + (": the steeper warm-up ramp, not the peak, makes the difference" if inside else
                       ": the schedule's shape, not the peak, makes the difference")
    elif a / (a + b) >= LR_SHARE:
        decides = "peak_lr"
        why = where + ": the higher peak lr makes the difference" + (
            " (the ramps have the same shape)" if inside else " (after the peak)")
    else:
        decides, why = "ambiguous", where + ": both the peak and the ramp raise the lr there"
    return {"step": int(d), "lr_ratio": q, "peak_ratio": peak, "shape_ratio": shape, "inside_warmup": inside,
            "decides": decides, "why": why, "separate": sep if decides == "ambiguous" else None,
            "source": "logs" if ps["source"] == ts["source"] == "logs" else "config"}


def log_differences(proxy: RunData, target: RunData, pc: dict[str, Any], tc: dict[str, Any],
                    recorded: set[str]) -> list[dict[str, Any]]:
    """Settings read from the logs (peak lr, warm-up, tokens per step) that differ and no configuration records.

    Returns:
        Difference dicts like :func:`forensics.config_diff.diff`'s, with ``"source": "logs"``.
    """
    from forensics.config_diff import same, why_matters

    out: list[dict[str, Any]] = []
    ps, ts = lr_schedule_of(proxy, {}), lr_schedule_of(target, {})
    vals: dict[str, tuple[Any, Any]] = {}
    if ps is not None and ts is not None:
        vals["peak_lr"] = (ps["peak_lr"], ts["peak_lr"])
        vals["warmup_steps"] = (ps["warmup_steps"], ts["warmup_steps"])
    rp, rt = tokens_per_step(proxy, {}), tokens_per_step(target, {})
    if rp and rt:
        seq = pc.get("seq_len") if same(pc.get("seq_len"), tc.get("seq_len")) else None
        vals["global_batch_size"] = ((rp / seq, rt / seq) if seq else (rp, rt))
    for key, (p, t) in vals.items():
        if key in recorded or pc.get(key) is not None or tc.get(key) is not None:
            continue
        if p is None or t is None or math.isclose(float(p), float(t), rel_tol=0.01):
            continue
        matters, why = why_matters(key, p, t, {}, {})
        unit = " (tokens per step: no seq_len recorded)" if key == "global_batch_size" and not (
            same(pc.get("seq_len"), tc.get("seq_len")) and pc.get("seq_len")) else ""
        out.append({"setting": key, "proxy": p, "target": t, "matters": matters,
                    "why": f"read from the logs{unit}: {why}", "source": "logs"})
    return out


def explain(differences: list[dict[str, Any]], deps: dict[str, dict[str, Any] | None],
            first: dict[str, Any] | None, analysis: Any | None,
            lr_ev: dict[str, Any] | None = None, recorded_same: set[str] | None = None) -> list[dict[str, Any]]:
    """Rank the differences that matter as explanations of the departure, by evidence that tells them apart.

    Score = prior of the setting's mechanism (:data:`MECHANISMS`), +0.35 when the first departing series
    is the mechanism's primary signal (+0.2 when it is one of its signals, -0.15 when it is none of them),
    +0.1 when another predicted signal departs too, +0.15 when the target's own analyze() mechanism supports
    the setting (:data:`ANALYSIS_LINKS`); for peak lr vs warm-up, +0.35 to the one :func:`lr_evidence`
    decides for and -0.25 to the other; -0.3 for a difference derived from another one (warm-up tokens that
    changed only because the batch or the sequence length did); clipped to [0.02, 0.98]. A setting that no
    configuration records but the first departing series points at (:data:`SIGNAL_SETTINGS`) is added at a
    low prior; the target's analyze() finding is added (setting ``None``) when no difference covers it.

    Args:
        differences: :func:`forensics.config_diff.diff` plus :func:`log_differences`.
        deps: :func:`departures`.
        first: :func:`first_departure`.
        analysis: The target's own :class:`forensics.model.Analysis` (``None`` when healthy).
        lr_ev: :func:`lr_evidence`.
        recorded_same: Settings both runs record with equal values (ruled out as explanations).

    Returns:
        ``[{"setting", "mechanism", "confidence", "for", "against", "decided_by"}]``, highest first.
    """
    mech_an = getattr(analysis, "mechanism", None) if analysis is not None else None
    out: list[dict[str, Any]] = []
    covered = False
    names = {d["setting"] for d in differences}
    for d in differences:
        if not d["matters"] or d["setting"] not in MECHANISMS:
            continue
        mech, sigs, score = MECHANISMS[d["setting"]]
        pro, con, decided = [d["why"]], [], []
        if first is not None:
            dep = deps.get(first["signal"]) or {}
            base = first["signal"].split("/")[0]
            where = (f"{first['signal']} departs first, at step {first['step']} (target {_fmt(dep.get('target'))} "
                     f"vs proxy {_fmt(dep.get('proxy'))}, gap {_fmt(dep.get('delta'))} vs band "
                     f"{_fmt(dep.get('threshold'))})")
            if base == sigs[0]:
                score += 0.35
                pro.append(f"{where}: the signal {mech} predicts")
                decided.append(f"first departing series {first['signal']}")
            elif base in sigs:
                score += 0.2
                pro.append(f"{where}: one of the signals {mech} predicts")
            else:
                score -= 0.15
                con.append(f"{where}; {mech} predicts {', '.join(sigs)} first")
            also = [s for s in sigs if s != base and deps.get(s)]
            if also:
                score += 0.1
                pro.append("also departs: " + ", ".join(f"{s} at step {deps[s]['step']}" for s in also))  # type: ignore[index]
        else:
            con.append("no series of the target leaves the proxy's band")
        key = "warmup_steps" if d["setting"] in ("warmup_steps", "warmup_tokens") else d["setting"]
        if lr_ev is not None and key in ("peak_lr", "warmup_steps"):
            if lr_ev["decides"] == key:
                score += 0.35
                pro.append(lr_ev["why"])
                decided.append("the lr ratio at the departure: " + ("schedule shape" if key == "warmup_steps"
                                                                      else "peak ratio"))
            elif lr_ev["decides"] in ("peak_lr", "warmup_steps"):
                score -= 0.25
                con.append(lr_ev["why"])
            elif lr_ev["decides"] == "ambiguous":
                con.append(f"{lr_ev['why']}; what would separate them: {lr_ev['separate']}")
        derived = _derived_from(d, differences)
        if derived:
            score -= 0.3
            con.append(f"follows from the {derived} difference" + (
                "" if derived == "warmup_steps" else " (warm-up steps unchanged)"))
            d.setdefault("derived_from", derived)
        if mech_an and d["setting"] in ANALYSIS_LINKS.get(mech_an, ()):
            score += 0.15
            covered = True
            pro.append(f"the target's own analysis, {analysis.summary}")
        if d.get("source") == "logs":
            score -= 0.05
            con.append("not in either configuration: read from the logged series")
        out.append({"setting": d["setting"], "mechanism": mech, "confidence": round(min(0.98, max(0.02, score)), 3),
                    "for": pro, "against": con, "decided_by": decided})
    if first is not None:
        base = first["signal"].split("/")[0]
        for i, setting in enumerate(SIGNAL_SETTINGS.get(base, ())):
            if setting in names or setting in (recorded_same or set()):
                continue
            mech, _sigs, prior = MECHANISMS[setting]
            score = max(0.02, 0.6 * prior - 0.05 * i)
            pro = [f"{first['signal']} departs first, at step {first['step']}: {mech} acts through it"]
            if mech_an and setting in ANALYSIS_LINKS.get(mech_an, ()):
                score += 0.15
                covered = True
                pro.append(f"the target's own analysis, {analysis.summary}")
            out.append({"setting": setting, "mechanism": mech, "confidence": round(min(0.98, score), 3),
                        "for": pro,
                        "against": [f"neither configuration records {setting}: inferred from the departing series "
                                    "only; check the two runs' code or launch flags"],
                        "decided_by": [f"first departing series {first['signal']}"], "inferred": True})
    if analysis is not None and analysis.cause and not covered:
        out.append({"setting": None, "mechanism": mech_an or analysis.cause,
                    "confidence": round(0.5 * float(analysis.confidence), 3),
                    "for": [f"the target's own analysis: {analysis.summary}"],
                    "against": ["no recorded configuration difference acts through this mechanism"], "decided_by": []})
    out.sort(key=lambda e: -e["confidence"])
    return out


def _derived_from(d: dict[str, Any], differences: list[dict[str, Any]]) -> str | None:
    """The difference that ``d`` follows from (warm-up tokens from the batch or the sequence length)."""
    if d["setting"] != "warmup_tokens":
        return None
    names = {x["setting"] for x in differences}
    roots = [r for r in ("global_batch_size", "seq_len") if r in names]
    if "warmup_steps" in names:
        return None if roots else "warmup_steps"
    for root in roots:
        if root in names:
            return root
    return None


def trial_for(top: dict[str, Any] | None, differences: list[dict[str, Any]], first: dict[str, Any] | None,
              target_cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The short run that tests the top explanation: the target with the proxy's value of that one knob.

    Steps: through the departure step plus a margin of max(50, 50% of it), capped at the target's total steps.
    """
    if top is None or top["setting"] is None:
        return None
    d = next((x for x in differences if x["setting"] == top["setting"]), None)
    if d is None:  # inferred from the departing series: no recorded value to restore
        d = {"setting": top["setting"], "proxy": "the proxy's setting (not recorded)", "target": "an unrecorded value"}
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
            f"{sig} stays inside the proxy's band (max({K_SIGMA:g} robust sigma, "
            f"{'20%' if sig.split('/')[0] in LOSSES else 'x5'})) through step {steps}"
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
        The JSON-ready dict: ``schema_version``, ``proxy``, ``target``, ``differences`` (each with ``source``:
        ``"config"`` or ``"logs"``), ``departure`` (``step``, ``signal``, ``gap`` in nats, ``ratio``, ``proxy``,
        ``target``, ``threshold``, ``tokens`` when aligned by tokens), ``explanations`` (with ``decided_by``),
        ``trial``; plus ``departures`` (every shared series), ``alignment``, ``lr_evidence``, ``mup_check``,
        ``target_analysis``, ``configs``.

    Raises:
        forensics.errors.InputError: either folder is missing or holds no logs.
    """
    from forensics.api import analyze_run, load
    from forensics.config_diff import flat_config, mup_check, same

    proxy, target = load(proxy_path), load(target_path)
    pc, tc = extract_config(proxy), extract_config(target)
    differences = [dict(d, source="config") for d in diff(pc, tc)]
    recorded = {d["setting"] for d in differences}
    differences += log_differences(proxy, target, pc, tc, recorded)
    deps, alignment = departures(proxy, target, pc, tc)
    first = first_departure(deps)
    lr_ev = lr_evidence(lr_schedule_of(proxy, pc), lr_schedule_of(target, tc), first)
    same_keys = {k for k in pc if k != "_found" and k in tc and same(pc[k], tc[k])}
    ps_log, ts_log = lr_schedule_of(proxy, {}), lr_schedule_of(target, {})
    if ps_log is not None and ts_log is not None:  # equal in the logged lr: ruled out, even without a config
        for k in ("peak_lr", "warmup_steps"):
            if math.isclose(ps_log[k], ts_log[k], rel_tol=0.01):
                same_keys.add(k)
    rp, rt = tokens_per_step(proxy, {}), tokens_per_step(target, {})
    if rp and rt and math.isclose(rp, rt, rel_tol=0.01):
        same_keys.add("global_batch_size")
    analysis = analyze_run(target)
    explanations = explain(differences, deps, first, analysis if analysis.verdict != "healthy" else None,
                           lr_ev, same_keys)
    top = explanations[0] if explanations else None
    return {
        "schema_version": SCHEMA_VERSION, "proxy": str(proxy_path), "target": str(target_path),
        "differences": differences, "departure": first, "explanations": explanations,
        "trial": trial_for(top, differences, first, tc),
        "departures": {k: ({kk: vv for kk, vv in v.items() if kk != "index"} if v else None) for k, v in deps.items()},
        "alignment": alignment, "lr_evidence": lr_ev,
        "mup_check": mup_check(flat_config(proxy), flat_config(target), pc, tc, proxy, target),
        "target_analysis": {"verdict": analysis.verdict, "cause": analysis.cause, "mechanism": analysis.mechanism,
                            "onset": dict(analysis.onset) if analysis.onset else None, "summary": analysis.summary},
        "configs": {"proxy": {k: v for k, v in pc.items() if k != "_found"},
                    "target": {k: v for k, v in tc.items() if k != "_found"}},
    }
