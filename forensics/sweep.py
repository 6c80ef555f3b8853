"""Learning-rate sweeps: final loss against lr, LR sensitivity, largest stable lr, size trends.

``sweep(root)`` returns the JSON object of DESIGN.md section 7 (``sweep``). Every sub-folder of ROOT that
holds training logs is one run; its peak lr and other settings come from its configuration
(:func:`forensics.config_diff.extract_config`). Runs are grouped by every canonical setting that varies
across ROOT except the lr (the group ``key``, e.g. ``{"d_model": 64, "qk_layernorm": false}``).

Per run: the final loss L = mean of the finite losses over the last 5% of the logged points (at least 1);
``diverged`` when the loss is non-finite anywhere (the job died or NaN-ed), when L exceeds the initial
loss, or when the engine finds a failure (non-finite values, loss divergence, unrecovered spike:
:func:`forensics.engine.decide`'s ``failure_step``); the divergence step is the first of those.

LR sensitivity (Wortsman et al. 2023, "Small-scale proxies for large-scale Transformer training
instabilities", arXiv 2309.14322, section 2.2, "LR vs. loss curves and learning rate sensitivity")::

    LR sensitivity = E_{eta in [a, b]} [ min(L(eta), L0) - min_{eta'} L(eta') ]

with L(eta) the final loss of the run at peak lr eta, L0 the loss at initialisation (so a run that
diverged, or ended above where it started, counts as L0 and a NaN run is not an infinite penalty), and
the expectation taken over the swept lrs (the paper sweeps a log-spaced grid over [3e-4, 3e-1]). The
paper's section text could not be retrieved here to quote; this is the definition as recalled and as
summarised by the paper's introduction ("the deviation from optimal performance when varying LR across
orders of magnitude"). Runs repeated at one lr (seeds) are averaged first. Lower is flatter.

Largest stable lr: the largest lr whose runs did not diverge and whose final loss is within
``STABLE_MARGIN`` x (L0 - best loss) of the best loss (our choice: 5% of the loss reduction the best run
achieved). Size trend (the paper predicts attention-logit growth before it emerges from how the max
attention logit scales with model size; section number not checked): at each lr swept at several d_model
with otherwise equal settings, a linear fit of log(signal at the end) on log(d_model), extrapolated to
``target_d_model``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from forensics import SCHEMA_VERSION
from forensics.config_diff import extract_config
from forensics.errors import InputError
from forensics.model import RunData

TAIL = 0.05
"""Share of the last logged points averaged into the final loss (at least one point)."""
STABLE_MARGIN = 0.05
"""A stable run's final loss is within this share of (L0 - best loss) of the best loss (our choice)."""
TREND_SIGNALS = ("attn_logit_max", "grad_norm")
"""Signals whose scaling with d_model is fitted and extrapolated."""
_DERIVED = {"peak_lr", "warmup_tokens"}


def lr_sensitivity(lrs: list[float], losses: list[float], l0: float) -> float:
    """LR sensitivity of Wortsman et al. 2023 (s2.2): E_eta[min(L(eta), L0)] - min_eta L(eta).

    Args:
        lrs: peak lr of each run (repeats are averaged).
        losses: final loss of each run; non-finite means diverged and counts as ``l0``.
        l0: loss at initialisation.

    Returns:
        The sensitivity (>= 0; 0 for a perfectly flat curve or a single lr); NaN when ``lrs`` is empty.
    """
    per_lr: dict[float, list[float]] = {}
    for lr, loss in zip(lrs, losses, strict=True):
        capped = min(loss, l0) if math.isfinite(loss) else l0
        per_lr.setdefault(float(lr), []).append(capped)
    if not per_lr:
        return float("nan")
    curve = np.array([np.mean(v) for v in per_lr.values()])
    return float(np.mean(curve) - np.min(curve))


def _tail(values: np.ndarray, frac: float = TAIL) -> float:
    n = max(1, int(round(values.size * frac)))
    tail = values[-n:]
    tail = tail[np.isfinite(tail)]
    return float(np.mean(tail)) if tail.size else float("nan")


def run_summary(run: RunData, name: str) -> dict[str, Any] | None:
    """One run's row: lr, final loss, divergence, instability signatures; ``None`` without a lr or loss."""
    from forensics.engine import decide

    cfg = extract_config(run)
    loss = run.series("loss")
    lr = cfg.get("peak_lr")
    if lr is None and run.series("lr") is not None:
        lr = float(np.nanmax(run.series("lr").values))  # type: ignore[union-attr]
    if loss is None or lr is None or len(loss) == 0:
        return None
    vals = loss.values
    finite = np.isfinite(vals)
    initial = float(vals[finite][0]) if finite.any() else float("nan")
    final = _tail(vals) if finite.all() else float("nan")
    steps: list[int] = []
    why: list[str] = []
    if not finite.all():
        steps.append(int(loss.steps[np.flatnonzero(~finite)[0]]))
        why.append("non-finite loss")
    if math.isfinite(final) and final > initial:
        above = np.flatnonzero(finite & (vals > initial))
        steps.append(int(loss.steps[above[0]]) if above.size else int(loss.steps[-1]))
        why.append("final loss above the initial loss")
    failure = decide(run).failure_step
    if failure is not None:
        steps.append(int(failure))
        why.append("engine failure step (non-finite value, loss divergence or unrecovered spike)")
    sig: dict[str, Any] = {}
    for m in ("attn_logit_max", "grad_norm"):
        s = run.series(m)
        if s is not None and len(s):
            sig[f"{m}_end"] = _tail(s.values)
            sig[f"{m}_max"] = float(np.nanmax(np.where(np.isfinite(s.values), s.values, np.nan)))
    lz = run.series("log_z")
    if lz is not None and len(lz) >= 2:
        sig["log_z_drift"] = _tail(lz.values) - _tail(lz.values[::-1])  # end minus start (first 5%)
    return {"run": name, "lr": float(lr), "final_loss": final if math.isfinite(final) else None,
            "initial_loss": initial, "diverged": bool(steps), "divergence_step": min(steps) if steps else None,
            "divergence_reason": why, "signatures": sig, "config": {k: v for k, v in cfg.items() if k != "_found"}}


def _group_key(cfg: dict[str, Any], varying: list[str]) -> dict[str, Any]:
    return {k: cfg.get(k) for k in varying}


def group_summary(key: dict[str, Any], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """LR sensitivity, best and largest stable lr of one group of runs (differing only in lr)."""
    runs = sorted(runs, key=lambda r: (r["lr"], r["run"]))
    l0 = float(np.median([r["initial_loss"] for r in runs if math.isfinite(r["initial_loss"])] or [np.nan]))
    losses = [r["final_loss"] if r["final_loss"] is not None else float("nan") for r in runs]
    lrs = [r["lr"] for r in runs]
    sens = lr_sensitivity(lrs, losses, l0) if math.isfinite(l0) else float("nan")
    ok = [(r["lr"], r["final_loss"]) for r in runs if r["final_loss"] is not None]
    best_lr, best = min(ok, key=lambda t: t[1]) if ok else (None, float("nan"))
    margin = STABLE_MARGIN * (l0 - best) if math.isfinite(best) else float("nan")
    by_lr: dict[float, list[dict[str, Any]]] = {}
    for r in runs:
        by_lr.setdefault(r["lr"], []).append(r)
    stable = [lr for lr, rs in by_lr.items()
              if all(not r["diverged"] and r["final_loss"] is not None and r["final_loss"] <= best + margin
                     for r in rs)]
    return {"key": key, "lr_sensitivity": sens, "largest_stable_lr": max(stable) if stable else None,
            "best_lr": best_lr, "best_loss": best, "initial_loss": l0, "stable_margin": margin,
            "runs": [{k: r[k] for k in ("run", "lr", "final_loss", "diverged", "divergence_step",
                                        "divergence_reason", "signatures")} for r in runs]}


def size_trends(groups: list[dict[str, Any]], target_d_model: int | None) -> list[dict[str, Any]]:
    """Fit log(signal at the end) = a + b log(d_model) at each lr shared by groups that differ only in d_model.

    Returns:
        ``[{"key", "lr", "signal", "points": [[d_model, value], ...], "slope", "target_d_model",
        "predicted"}]``; ``predicted`` is ``None`` without a target size.
    """
    fam: dict[str, list[dict[str, Any]]] = {}
    for g in groups:
        if g["key"].get("d_model") is None:
            continue
        rest = {k: v for k, v in g["key"].items() if k != "d_model"}
        fam.setdefault(repr(sorted(rest.items())), []).append(g)
    out = []
    for members in fam.values():
        if len({g["key"]["d_model"] for g in members}) < 2:
            continue
        rest = {k: v for k, v in members[0]["key"].items() if k != "d_model"}
        lrs = sorted(set.intersection(*({r["lr"] for r in g["runs"]} for g in members)))
        for lr in lrs:
            for signal in TREND_SIGNALS:
                pts = []
                for g in sorted(members, key=lambda g: g["key"]["d_model"]):
                    vals = [r["signatures"].get(f"{signal}_end") for r in g["runs"] if r["lr"] == lr]
                    vals = [v for v in vals if v is not None and math.isfinite(v) and v > 0]
                    if vals:
                        pts.append([int(g["key"]["d_model"]), float(np.mean(vals))])
                if len(pts) < 2:
                    continue
                x, y = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
                slope, icpt = np.polyfit(x, y, 1)
                pred = float(np.exp(icpt + slope * math.log(target_d_model))) if target_d_model else None
                out.append({"key": rest, "lr": lr, "signal": signal, "points": pts, "slope": float(slope),
                            "target_d_model": target_d_model, "predicted": pred})
    return out


def find_runs(root: Path) -> tuple[list[tuple[str, RunData]], list[dict[str, str]]]:
    """Load every run folder under ``root``, named by its path relative to ``root``; unreadable ones are skipped.

    Run folders are found with the audit's rules (:func:`forensics.audit_runs.find_runs`: a folder that
    holds logs is a run; a folder of runs is a container), so ``ROOT/sweep_a/run_1`` works as well as
    ``ROOT/run_1``.
    """
    from forensics.api import load
    from forensics.audit_runs import find_runs as audit_find_runs

    runs, skipped = [], []
    for sub in map(Path, audit_find_runs(root)):
        name = sub.relative_to(root).as_posix() if sub != root else sub.name
        try:
            runs.append((name, load(sub)))
        except InputError as exc:
            skipped.append({"what": name, "reason": exc.message})
    return runs, skipped


def sweep(root: str | Path, target_d_model: int | None = None) -> dict[str, Any]:
    """Analyse an lr sweep (DESIGN.md section 7, ``sweep``).

    Args:
        root: Folder whose sub-folders are the runs.
        target_d_model: Width to extrapolate the size trends to (optional).

    Returns:
        ``schema_version``, ``root``, ``groups`` (each: ``key``, ``lr_sensitivity``, ``largest_stable_lr``,
        ``best_lr``, ``runs``), plus ``size_trends``, ``skipped`` and ``notes``.

    Raises:
        InputError: ``root`` is not a folder, or no sub-folder holds a run with a loss and a peak lr.
    """
    path = Path(root).expanduser()
    if not path.is_dir():
        raise InputError(root, "no such folder" if not path.exists() else "not a folder (give the sweep root)")
    loaded, skipped = find_runs(path)
    rows = []
    for name, run in loaded:
        row = run_summary(run, name)
        if row is None:
            skipped.append({"what": name, "reason": "no loss series or no peak lr (config or logged lr)"})
        else:
            rows.append(row)
    if not rows:
        raise InputError(root, "no run folders with a loss and a peak lr found under it")
    keys = sorted({k for r in rows for k in r["config"]} - _DERIVED)
    varying = [k for k in keys if len({repr(r["config"].get(k)) for r in rows}) > 1]
    grouped: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {}
    for r in rows:
        key = _group_key(r["config"], varying)
        grouped.setdefault(repr(sorted(key.items())), (key, []))[1].append(r)
    groups = [group_summary(k, rs) for k, rs in grouped.values()]
    groups.sort(key=lambda g: [repr(g["key"].get(k)) for k in varying])
    notes = []
    grids = {tuple(sorted({r["lr"] for r in g["runs"]})) for g in groups}
    if len(grids) > 1:
        notes.append("the groups swept different lr grids: their LR sensitivities are not directly comparable")
    if "d_model" in varying and target_d_model is None:
        notes.append("several d_model: give --target-d-model to extrapolate the size trends")
    return {"schema_version": SCHEMA_VERSION, "root": str(root), "groups": groups,
            "size_trends": size_trends(groups, target_d_model), "skipped": skipped, "notes": notes,
            "varying": varying}
