"""The departure test: where the target leaves the proxy's noise band, series by series, by step or by tokens.

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
from typing import Any

import numpy as np

from forensics.model import RunData
from forensics.stats import MAD_TO_SIGMA

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
MIN_BAND_POINTS = 3
"""Finite residuals a window needs for its noise band (fewer: the median band of the other windows; our choice)."""
MIN_ALIGNED = 4
"""Finite aligned proxy points needed before any departure is looked for (our choice)."""
SAME_REL = 0.01
"""Two logged settings (tokens per step, peak lr, warm-up) within 1% of each other are the same (our choice: the
rounding of printed values)."""
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


def noise_band(fp: np.ndarray) -> np.ndarray | None:
    """The proxy's noise band: robust spread of its residuals about a running median, per aligned point.

    A fast but smooth early-training trend is not counted as noise (the residuals are taken about a running
    median of :data:`SMOOTH` points), over a trailing window of :data:`WINDOW` points; ``sqrt(2)``: the gap of
    two noisy runs; :data:`~forensics.stats.MAD_TO_SIGMA`: MAD to a normal sigma.

    Args:
        fp: The proxy's (log-)values at the aligned points, shape (n,); NaN where missing.

    Returns:
        sigma per point, shape (n,) (a point without 3 finite residuals in its window gets the median), or
        ``None`` when no window has 3.
    """
    from scipy.ndimage import median_filter

    n = fp.size
    fin = np.isfinite(fp)
    smooth = np.full(n, np.nan)
    smooth[fin] = median_filter(fp[fin], size=SMOOTH, mode="nearest")
    resid = fp - smooth
    sigma = np.full(n, np.nan)
    for i in range(n):
        hi = max(i + 1, min(WINDOW, n))
        w = resid[max(0, hi - WINDOW):hi]
        w = w[np.isfinite(w)]
        if w.size >= MIN_BAND_POINTS:
            sigma[i] = math.sqrt(2) * MAD_TO_SIGMA * float(np.median(np.abs(w - np.median(w))))
    if np.isnan(sigma).all():
        return None
    return np.where(np.isnan(sigma), np.nanmedian(sigma), sigma)


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
    if np.isfinite(fp).sum() < MIN_ALIGNED:
        return None
    sigma = noise_band(fp)
    if sigma is None:
        return None
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
        if rp and rt and abs(rt / rp - 1) > SAME_REL:
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


