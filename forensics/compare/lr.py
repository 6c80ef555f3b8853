"""Peak lr vs warm-up: the two lr schedules, which of them the departure points at, settings read from the logs."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from forensics.compare.departure import SAME_REL, tokens_per_step
from forensics.model import RunData
from forensics.recovery._context import lr_digits

LR_SHARE = 0.75
"""Share of log(lr ratio at the departure) one cause must carry to decide peak lr vs warm-up (our choice)."""
MIN_LR_POINTS = 3
"""Fewest logged lr points to read a schedule from the logs (else the configuration; our choice)."""
PEAK_REACHED = 0.99
"""The warm-up ends at the first logged lr at 99% of the peak (our choice: a ramp that approaches its peak
asymptotically, or a printed rounding, still ends)."""
SAME_LR = 1.05
"""Two lrs within a factor 1.05 at the departure are equal there: neither peak nor warm-up acts (our choice)."""


def lr_schedule_of(run: RunData, cfg: dict[str, Any]) -> dict[str, Any] | None:
    """Peak lr and warm-up length from the logged lr (else from the configuration, linear warm-up assumed).

    Returns:
        ``{"peak_lr" (rounded to :data:`forensics.recovery._context.LR_DIGITS` significant digits: no float32
        noise), "warmup_steps" (steps from the first logged step to 99% of the peak; 0 without a ramp),
        "resolution" (the logging interval of the lr: a warm-up length read from the logs is known to within
        it; 0 from the configuration), "source": "logs" | "config", "steps", "lr"}`` (``steps``/``lr`` arrays:
        the trace, logs only), or ``None`` when neither records a lr.
    """
    s = run.series("lr")
    if s is not None and len(s) >= MIN_LR_POINTS and np.isfinite(s.values).any():
        v = np.where(np.isfinite(s.values), s.values, np.nan)
        peak = float(np.nanmax(v))
        if peak > 0:
            reach = int(np.flatnonzero(v >= PEAK_REACHED * peak)[0])
            ramp = v[0] < 0.5 * peak
            return {"peak_lr": lr_digits(peak), "warmup_steps": int(s.steps[reach] - s.steps[0] + 1) if ramp else 0,
                    "resolution": int(np.median(np.diff(s.steps))), "source": "logs", "steps": s.steps, "lr": v}
    if cfg.get("peak_lr"):
        return {"peak_lr": float(cfg["peak_lr"]), "warmup_steps": int(cfg.get("warmup_steps") or 0),
                "resolution": 0, "source": "config", "steps": None, "lr": None}
    return None


def same_setting(key: str, ps: dict[str, Any], ts: dict[str, Any]) -> bool:
    """The two schedules' ``key`` (``peak_lr`` or ``warmup_steps``) do not differ as far as the logs can tell.

    A peak lr within ``SAME_REL``; a warm-up length within ``SAME_REL`` or within the coarser of the two logging
    intervals (a 5-step and a 10-step log of the same 100-step warm-up read 101 and 91: no difference).
    """
    p, t = float(ps[key]), float(ts[key])
    if math.isclose(p, t, rel_tol=SAME_REL):
        return True
    return key == "warmup_steps" and abs(p - t) <= max(ps.get("resolution", 0), ts.get("resolution", 0))


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
    if abs(math.log(q)) < math.log(SAME_LR):
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
        if p is None or t is None or math.isclose(float(p), float(t), rel_tol=SAME_REL):
            continue
        if key in ("peak_lr", "warmup_steps") and same_setting(key, ps, ts):  # type: ignore[arg-type]
            continue
        matters, why = why_matters(key, p, t, {}, {})
        unit = " (tokens per step: no seq_len recorded)" if key == "global_batch_size" and not (
            same(pc.get("seq_len"), tc.get("seq_len")) and pc.get("seq_len")) else ""
        out.append({"setting": key, "proxy": p, "target": t, "matters": matters,
                    "why": f"read from the logs{unit}: {why}", "source": "logs"})
    return out


