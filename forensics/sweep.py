"""Learning-rate sweeps: final loss against lr, LR sensitivity, largest stable lr, size trends and predictions.

``sweep(root)`` returns the JSON object of DESIGN.md section 7 (``sweep``). Runs are found at any depth
under ROOT (:func:`forensics.layout.find_runs`: a run is the folder holding one run's logs, so
``ROOT/sweep_a/width_32/lr_0.01/`` works as well as ``ROOT/run_1``). Each run's peak lr and settings come
from its configuration (:func:`forensics.config_diff.extract_config`, plus any other configuration key
that varies across ROOT); a setting no configuration records is read from the run's folder names as a
fallback (``width_32``, ``qkln-off``, ``lr3e-02``, ``d64``..., :data:`NAME_KEYS`), and the report says so.
Runs are grouped by every setting that varies except the lr (the group ``key``); ``nesting`` orders the
settings as the folders nest them and ``tree`` is the nested grouping.

Per run: the final loss L = the last logged ``eval_loss`` when the run logs one (the paper's final
validation loss), else the mean of the finite training losses over the last 5% of the logged points;
``diverged`` when the loss is non-finite anywhere, when L exceeds the initial loss, or when the engine
finds a failure (:func:`forensics.engine.decide`'s ``failure_step``); the divergence step is the first of those.

LR sensitivity (Wortsman et al. 2023, "Small-scale proxies for large-scale Transformer training
instabilities", arXiv 2309.14322, section 2.2)::

    LR sensitivity = E_{eta in [a, b]} [ min(L(eta), L0) - min_{eta'} L(eta') ]

with L0 the loss at initialisation (a diverged run counts as L0) and the expectation over the swept
(log-spaced) lrs; runs repeated at one lr are averaged first. Lower is flatter. ``lr_sensitivity_common``
takes the expectation over the lrs every group swept, so groups with different grids compare.

Largest stable lr: the largest lr whose runs did not diverge and whose final loss is within
``STABLE_MARGIN`` x (L0 - best loss) of the best loss (our choice: 5%).

Size trends (:func:`size_trends`): for groups that differ only in width (``d_model``) or depth
(``n_layers``), at each lr they share, the growth of the attention logits, output logits and update ratios
(log of the run's max over its first value, and the exponent b of max ~ size^b), extrapolated to the
target size (``--target-width`` or ``--target-params``), and the predicted largest stable lr there
(:func:`predict_stable_lr`), with its uncertainty.
"""

from __future__ import annotations

import math
import re
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from forensics import SCHEMA_VERSION
from forensics.config_diff import ALIASES, extract_config, flat_config
from forensics.errors import InputError
from forensics.model import RunData

TAIL = 0.05
"""Share of the last logged points averaged into the final training loss (at least one point)."""
STABLE_MARGIN = 0.05
"""A stable run's final loss is within this share of (L0 - best loss) of the best loss (our choice)."""
TREND_SIGNALS = ("attn_logit_max", "output_logit_max", "update_ratio", "grad_norm")
"""Signals whose growth with size is fitted and extrapolated (Wortsman et al. 2023 s3.1: attention and output
logits; update ratios and gradient norms as the optimizer-side view)."""
SIZE_KEYS = ("d_model", "n_layers")
WEAK_SEPARATION = 0.1
"""Below this gap (nats) between stable and unstable runs' log max, a signal threshold is called weak (our choice)."""
_DERIVED = {"peak_lr", "warmup_tokens"}
NAME_KEYS: dict[str, str] = {
    "d": "d_model", "dmodel": "d_model", "d_model": "d_model", "width": "d_model", "w": "d_model",
    "hidden": "d_model", "hidden_size": "d_model", "n_embd": "d_model", "dim": "d_model",
    "qkln": "qk_layernorm", "qk": "qk_layernorm", "qknorm": "qk_layernorm", "qk_norm": "qk_layernorm",
    "qk_ln": "qk_layernorm", "qk_layernorm": "qk_layernorm", "lr": "peak_lr", "wd": "weight_decay",
    "bs": "global_batch_size", "batch": "global_batch_size", "l": "n_layers", "layers": "n_layers",
    "depth": "n_layers", "n_layers": "n_layers", "zloss": "z_loss", "z": "z_loss", "z_loss": "z_loss",
    "warmup": "warmup_steps", "wu": "warmup_steps", "heads": "n_heads", "h": "n_heads", "seed": "seed",
}
"""Folder-name prefixes read as settings when no configuration records them."""
_VALUE = r"(?:on|off|true|false|yes|no|[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?)"
_TOKEN = re.compile(rf"^(?P<k>[a-z][a-z_]*?)[-=_]?(?P<v>{_VALUE})$", re.I)
_IGNORED_RAW = re.compile(r"(?:^|\.)(?:seed|data_seed|run_name|name|output_dir|logging_dir|wandb\w*|_wandb|"
                          r"report_to|project|entity|group|tags?|notes|dir|path|id|run_id|timestamp|"
                          r"max_steps|steps|param_groups|width_mult|output_mult)$")


# ----------------------------------------------------------------------------------------------- per run


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


def settings_from_name(rel: str) -> dict[str, Any]:
    """Settings read from a run's relative path (``width_32/qkln_off/lr_3e-02`` -> d_model, qk_layernorm, lr)."""
    out: dict[str, Any] = {}
    for part in PurePosixPath(rel).parts:
        toks = re.split(r"[_/]+|(?<=[a-z0-9])-(?=[a-z])", part.lower())
        i = 0
        while i < len(toks):
            t = toks[i]
            pair = None
            if i + 1 < len(toks) and re.fullmatch(r"[a-z]+", t) and re.fullmatch(_VALUE, toks[i + 1], re.I):
                pair = (t, toks[i + 1])
                i += 1
            elif m := _TOKEN.match(t):
                pair = (m.group("k"), m.group("v"))
            i += 1
            if pair is None or pair[0].rstrip("_-=") not in NAME_KEYS:
                continue
            key, raw = NAME_KEYS[pair[0].rstrip("_-=")], pair[1]
            val: Any
            if raw in ("on", "true", "yes"):
                val = True
            elif raw in ("off", "false", "no"):
                val = False
            else:
                f = float(raw)
                val = int(f) if f.is_integer() and key not in ("peak_lr", "weight_decay", "z_loss") else f
            out[key] = val
    return out


def run_summary(run: RunData, name: str) -> dict[str, Any] | None:
    """One run's row: lr, final loss, divergence, instability signatures; ``None`` without a lr or loss."""
    from forensics.engine import decide

    cfg = {k: v for k, v in extract_config(run).items() if k != "_found"}
    from_name = settings_from_name(name)
    named = {}
    for k, v in from_name.items():
        if k not in cfg and k != "seed":
            cfg[k] = v
            named[k] = v
    loss = run.series("loss")
    lr = cfg.get("peak_lr")
    if lr is None and run.series("lr") is not None:
        lr = float(np.nanmax(run.series("lr").values))  # type: ignore[union-attr]
        named.setdefault("peak_lr", "logged lr (max)")
    if loss is None or lr is None or len(loss) == 0:
        return None
    vals = loss.values
    finite = np.isfinite(vals)
    initial = float(vals[finite][0]) if finite.any() else float("nan")
    ev = run.series("eval_loss")
    final_src = "train loss, mean of the last 5%"
    final = _tail(vals) if finite.all() else float("nan")
    if ev is not None and len(ev) and finite.all():
        last = ev.values[-1]
        final, final_src = (float(last), f"eval_loss at step {int(ev.steps[-1])}") if math.isfinite(last) else (
            float("nan"), "eval_loss non-finite")
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
    for m in TREND_SIGNALS:
        s = run.series(m)
        if s is None or not len(s):
            continue
        v = np.where(np.isfinite(s.values), s.values, np.nan)
        if np.isnan(v).all():
            continue
        sig[f"{m}_end"] = _tail(s.values)
        sig[f"{m}_max"] = float(np.nanmax(v))
        first = v[np.isfinite(v)][0]
        if first > 0 and sig[f"{m}_max"] > 0:
            sig[f"{m}_growth"] = float(math.log(sig[f"{m}_max"] / first))
    lz = run.series("log_z")
    if lz is not None and len(lz) >= 2:
        sig["log_z_drift"] = _tail(lz.values) - _tail(lz.values[::-1])  # end minus start (first 5%)
    flat = flat_config(run)
    raw = {k: v for k, v in flat.items() if isinstance(v, str | int | float | bool) and not _IGNORED_RAW.search(k)}
    return {"run": name, "lr": float(lr), "final_loss": final if math.isfinite(final) else None,
            "final_loss_source": final_src, "initial_loss": initial, "diverged": bool(steps),
            "divergence_step": min(steps) if steps else None, "divergence_reason": why, "signatures": sig,
            "config": cfg, "raw_config": raw, "from_name": named, "seed": flat.get("seed", from_name.get("seed")),
            "n_params_hint": {"vocab_size": flat.get("vocab_size")}}


# ----------------------------------------------------------------------------------------------- groups


def group_summary(key: dict[str, Any], runs: list[dict[str, Any]], common: list[float] | None = None
                  ) -> dict[str, Any]:
    """LR sensitivity, best and largest stable lr of one group of runs (differing only in lr)."""
    runs = sorted(runs, key=lambda r: (r["lr"], r["run"]))
    l0 = float(np.median([r["initial_loss"] for r in runs if math.isfinite(r["initial_loss"])] or [np.nan]))
    losses = [r["final_loss"] if r["final_loss"] is not None else float("nan") for r in runs]
    lrs = [r["lr"] for r in runs]
    sens = lr_sensitivity(lrs, losses, l0) if math.isfinite(l0) else float("nan")
    sens_common = None
    if common and math.isfinite(l0):
        keep = [i for i, lr in enumerate(lrs) if any(math.isclose(lr, c, rel_tol=1e-6) for c in common)]
        if keep:
            sens_common = lr_sensitivity([lrs[i] for i in keep], [losses[i] for i in keep], l0)
    ok = [(r["lr"], r["final_loss"]) for r in runs if r["final_loss"] is not None and not r["diverged"]]
    ok = ok or [(r["lr"], r["final_loss"]) for r in runs if r["final_loss"] is not None]
    best_lr, best = min(ok, key=lambda t: t[1]) if ok else (None, float("nan"))
    margin = STABLE_MARGIN * (l0 - best) if math.isfinite(best) else float("nan")
    by_lr: dict[float, list[dict[str, Any]]] = {}
    for r in runs:
        by_lr.setdefault(r["lr"], []).append(r)
    stable = [lr for lr, rs in by_lr.items()
              if all(not r["diverged"] and r["final_loss"] is not None and r["final_loss"] <= best + margin
                     for r in rs)]
    return {"key": key, "lr_sensitivity": sens, "lr_sensitivity_common": sens_common,
            "largest_stable_lr": max(stable) if stable else None, "stable_lrs": sorted(stable),
            "best_lr": best_lr, "best_loss": best, "initial_loss": l0, "stable_margin": margin,
            "lrs": sorted(by_lr),
            "runs": [{k: r[k] for k in ("run", "lr", "final_loss", "final_loss_source", "diverged", "divergence_step",
                                        "divergence_reason", "signatures")} for r in runs]}


def _varying(rows: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(canonical settings that vary, raw config keys that vary and no canonical setting covers)."""
    keys = sorted({k for r in rows for k in r["config"]} - _DERIVED)
    varying = [k for k in keys if len({repr(r["config"].get(k)) for r in rows}) > 1]
    alias_tails = {a.rpartition(".")[2] for names in ALIASES.values() for a in names}
    alias_tails |= {"batch_size", "micro_batch_size", "per_device_train_batch_size", "betas", "adam_betas",
                    "bf16", "fp16", "warmup_ratio", "lr_warmup_fraction", "train_batch_size"}
    raw_keys = sorted({k for r in rows for k in r["raw_config"]})
    raw_vary = [k for k in raw_keys if k.rpartition(".")[2] not in alias_tails
                and len({repr(r["raw_config"].get(k)) for r in rows}) > 1]
    return varying, raw_vary


def _nesting(rows: list[dict[str, Any]], keys: list[str], value: Any) -> list[str]:
    """The varying settings ordered by the folder depth at which they first split the runs."""
    def depth(k: str) -> int:
        parts = [PurePosixPath(r["run"]).parts for r in rows]
        for i in range(max(len(p) for p in parts)):
            seen: dict[tuple[str, ...], set[str]] = {}
            for r, p in zip(rows, parts, strict=True):
                seen.setdefault(tuple(p[:i + 1]), set()).add(repr(value(r, k)))
            if all(len(v) == 1 for v in seen.values()):
                return i
        return 99
    return sorted(keys, key=lambda k: (depth(k), keys.index(k)))


def _tree(groups: list[dict[str, Any]], order: list[str]) -> list[dict[str, Any]]:
    """Nested grouping: ``[{"setting", "value", "children" | "group" (index into groups)}]``."""
    def build(idx: list[int], level: int) -> list[dict[str, Any]]:
        if level == len(order):
            return []
        k = order[level]
        vals: dict[str, list[int]] = {}
        for i in idx:
            vals.setdefault(repr(groups[i]["key"].get(k)), []).append(i)
        out = []
        for members in vals.values():
            node: dict[str, Any] = {"setting": k, "value": groups[members[0]]["key"].get(k)}
            if level == len(order) - 1:
                node["groups"] = members
            else:
                node["children"] = build(members, level + 1)
            out.append(node)
        return out
    return build(list(range(len(groups))), 0)


# ----------------------------------------------------------------------------------------------- size trends


def _fit(x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """Least-squares line y = a + b x with the residual standard error (None with two points)."""
    b, a = np.polyfit(x, y, 1)
    se = None
    if x.size >= 3:
        res = y - (a + b * x)
        se = float(math.sqrt(float(np.sum(res ** 2)) / (x.size - 2)))
    return {"a": float(a), "b": float(b), "se": se}


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
        a, b, c = 12 * layers, 2 * v, -float(target_params)
        return float((-b + math.sqrt(b * b - 4 * a * c)) / (2 * a))
    d = float(fixed.get("d_model") or 0)
    if d <= 0:
        return None
    return float((target_params - 2 * v * d) / (12 * d * d))


def predict_stable_lr(members: list[dict[str, Any]], size_key: str, target: float | None) -> dict[str, Any]:
    """Predict the largest stable lr at the target size from the measured sizes of one family.

    Two predictions: (a) ``direct``: a line through log(largest stable lr) against log(size), extrapolated and
    snapped to the lr grid; (b) ``signal``: for the trend signal whose log max best separates the stable from
    the unstable runs at the measured sizes (a threshold c between the largest value of a stable run and the
    smallest of an unstable one), the log max at each lr extrapolated to the target size (one line per lr),
    and the largest lr of the grid whose predicted value stays below c with every smaller lr below it too.
    (b) is used when a separating signal exists, else (a). The uncertainty: with three or more sizes the fits'
    residual standard error moves the prediction over the grid (the lr range it spans); with two sizes each
    line passes through both points and there is no error estimate (``too_few_sizes``), so the prediction is
    given with +- one lr grid step and the note says so.

    Returns:
        ``{"target_size", "predicted_largest_stable_lr", "method", "interval": [lo, hi], "direct", "signal",
        "grid", "too_few_sizes", "notes"}``.
    """
    members = sorted(members, key=lambda g: g["key"][size_key])
    sizes = np.array([float(g["key"][size_key]) for g in members])
    grid = sorted(set.intersection(*(set(g["lrs"]) for g in members)))
    notes: list[str] = []
    few = sizes.size < 3
    if few:
        notes.append(f"{sizes.size} sizes: each fit is a line through {sizes.size} points, with no error estimate; "
                     "the prediction is given +- one lr grid step; add a third size to estimate its uncertainty")
    out: dict[str, Any] = {"target_size": target, "size_key": size_key, "grid": grid, "too_few_sizes": few,
                           "measured": {str(int(s)): g["largest_stable_lr"]
                                        for s, g in zip(sizes, members, strict=True)},
                           "notes": notes, "direct": None, "signal": None, "predicted_largest_stable_lr": None,
                           "method": None, "interval": None}
    if target is None or not grid:
        if target is None:
            notes.append("no target size given (--target-width / --target-params): nothing extrapolated")
        return out
    lx, tx = np.log(sizes), math.log(target)

    def snap(lr: float) -> float:
        return min(grid, key=lambda g: abs(math.log(g) - math.log(lr)))

    def step_of(lr: float, k: int) -> float:
        i = grid.index(lr)
        return grid[min(len(grid) - 1, max(0, i + k))]

    stab = [g["largest_stable_lr"] for g in members]
    if all(s is not None for s in stab):
        f = _fit(lx, np.log(np.array(stab, dtype=float)))
        raw = math.exp(f["a"] + f["b"] * tx)
        out["direct"] = {"fit": f, "raw": raw, "snapped": snap(raw),
                         "exponent": f["b"], "why": f"largest stable lr ~ {size_key}^{f['b']:.3g}"}
    best = None
    for signal in TREND_SIGNALS:
        pts = []
        for s, g in zip(sizes, members, strict=True):
            for r in g["runs"]:
                v = r["signatures"].get(f"{signal}_max")
                if v is None or not (v > 0) or r["lr"] not in grid:
                    continue
                stable = r["lr"] in g["stable_lrs"]
                pts.append((s, r["lr"], math.log(v), stable))
        st = [p[2] for p in pts if p[3]]
        un = [p[2] for p in pts if not p[3]]
        if not st or not un or max(st) >= min(un):
            continue
        gap = min(un) - max(st)
        if best is None or gap > best[1]:
            best = (signal, gap, (max(st) + min(un)) / 2, pts)
    if best is not None:
        signal, gap, c, pts = best
        pred, ses = {}, []
        for lr in grid:
            xs = np.array([math.log(p[0]) for p in pts if p[1] == lr])
            ys = np.array([p[2] for p in pts if p[1] == lr])
            if xs.size < 2 or len(set(xs.tolist())) < 2:
                continue
            f = _fit(xs, ys)
            pred[lr] = f["a"] + f["b"] * tx
            if f["se"] is not None:
                ses.append(f["se"])

        def largest(shift: float) -> float | None:
            ok = None
            for lr in grid:
                if lr not in pred or pred[lr] + shift >= c:
                    break
                ok = lr
            return ok

        centre = largest(0.0)
        se = float(np.sqrt(np.mean(np.square(ses)))) if ses else None
        out["signal"] = {"signal": signal, "threshold_log": c, "threshold": math.exp(c), "separation": gap,
                         "predicted_log_max": {repr(k): v for k, v in pred.items()},
                         "predicted_largest_stable_lr": centre, "residual_se": se,
                         "why": (f"stable runs at the measured sizes keep max {signal} below {math.exp(c):.4g} "
                                 f"(separation {gap:.3g} nats); at {size_key} {target:g} the extrapolated max "
                                 f"{signal} stays below it up to lr {centre}")}
        if gap < WEAK_SEPARATION:
            notes.append(f"max {signal} separates the stable from the unstable runs by only {gap:.3g} nats: a weak "
                         "threshold, read the prediction with the direct one beside it")
        if centre is not None:
            out["predicted_largest_stable_lr"], out["method"] = centre, f"signal ({signal})"
            if se is not None:
                lo, hi = largest(2 * se), largest(-2 * se)
                out["interval"] = [lo if lo is not None else grid[0], hi if hi is not None else centre]
            else:
                out["interval"] = [step_of(centre, -1), step_of(centre, 1)]
    if out["predicted_largest_stable_lr"] is None and out["direct"] is not None:
        d = out["direct"]
        out["predicted_largest_stable_lr"], out["method"] = d["snapped"], "direct"
        se = d["fit"]["se"]
        if se is not None:
            out["interval"] = [snap(math.exp(math.log(d["raw"]) - 2 * se)), snap(math.exp(math.log(d["raw"]) + 2 * se))]
        else:
            out["interval"] = [step_of(d["snapped"], -1), step_of(d["snapped"], 1)]
    if out["predicted_largest_stable_lr"] is None:
        notes.append("no prediction: no signal separates stable from unstable runs and some size has no stable lr")
    elif target > sizes.max() * 4:
        notes.append(f"extrapolating {target / sizes.max():.3g}x beyond the largest measured size: the power law "
                     "is an assumption, not a measurement")
    return out


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
            lrs = sorted(set.intersection(*({r["lr"] for r in g["runs"]} for g in members)))
            for lr in lrs:
                for signal in TREND_SIGNALS:
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
                        continue
                    f = _fit(np.log([p[0] for p in pts]), np.log([p[1] for p in pts]))
                    pred = float(math.exp(f["a"] + f["b"] * math.log(target))) if target else None
                    trends.append({"family": fid, "key": rest, "size_key": size_key, "lr": lr, "signal": signal,
                                   "points": pts, "growth": growth, "slope": f["b"], "residual_se": f["se"],
                                   "target_size": target, "target_d_model": target if size_key == "d_model" else None,
                                   "predicted": pred})
            p = predict_stable_lr(members, size_key, target)
            preds.append({"family": fid, "key": rest, **p})
    return trends, preds


def _fixed_sizes(members: list[dict[str, Any]], size_key: str) -> dict[str, Any]:
    """The other size setting of a family, read from its runs' configs when the key does not vary."""
    other = "n_layers" if size_key == "d_model" else "d_model"
    vals = {g.get("_sizes", {}).get(other) for g in members}
    return {other: next(iter(vals))} if len(vals) == 1 and None not in vals else {}


# ----------------------------------------------------------------------------------------------- sweep


def find_runs(root: Path) -> tuple[list[tuple[str, RunData]], list[dict[str, str]]]:
    """Load every run folder under ``root`` (:func:`forensics.layout.find_runs`), named by its relative path."""
    from forensics.api import load
    from forensics.layout import find_runs as layout_find_runs

    runs, skipped = [], []
    for sub in layout_find_runs(root):
        name = sub.relative_to(root).as_posix() if sub != root else sub.name
        try:
            runs.append((name, load(sub)))
        except InputError as exc:
            skipped.append({"what": name, "reason": exc.message})
    return runs, skipped


def sweep(root: str | Path, target_d_model: int | None = None, *, target_width: float | None = None,
          target_params: float | None = None) -> dict[str, Any]:
    """Analyse the lr sweeps under a root (DESIGN.md section 7, ``sweep``).

    Args:
        root: Folder that holds the runs, at any depth.
        target_d_model: Old name of ``target_width``.
        target_width: Width to extrapolate the size trends to.
        target_params: Parameter count to extrapolate to (converted to width or depth).

    Returns:
        ``schema_version``, ``root``, ``groups`` (each: ``key``, ``lr_sensitivity``, ``largest_stable_lr``,
        ``best_lr``, ``runs``), plus ``varying``, ``nesting``, ``tree``, ``size_trends``, ``size_predictions``,
        ``skipped`` and ``notes``.

    Raises:
        InputError: ``root`` is not a folder, or no run below it has a loss and a peak lr.
    """
    path = Path(root).expanduser()
    if not path.is_dir():
        raise InputError(root, "no such folder" if not path.exists() else "not a folder (give the sweep root)")
    target_width = target_width or target_d_model
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
    varying, raw_vary = _varying(rows)
    notes: list[str] = []

    def value(r: dict[str, Any], k: str) -> Any:
        return r["config"].get(k) if k in varying else r["raw_config"].get(k)

    keys = varying + raw_vary
    # two sweeps with equal settings in different folders: the folder is the key (names only as a fallback)
    parents = {str(PurePosixPath(r["run"]).parent) for r in rows}
    if len(parents) > 1:
        probe: dict[tuple[str, float], list[tuple[str, Any]]] = {}
        for r in rows:
            probe.setdefault((repr([value(r, k) for k in keys]), r["lr"]), []).append(
                (str(PurePosixPath(r["run"]).parent), r["seed"]))
        # equal settings and lr in several folders, and not told apart by their seeds: the folder is the key
        if any(len({p for p, _ in v}) > 1 and (None in {sd for _, sd in v} or len({sd for _, sd in v}) < len(v))
               for v in probe.values()):
            keys.append("sweep_folder")
            for r in rows:
                r["raw_config"]["sweep_folder"] = str(PurePosixPath(r["run"]).parent)
            notes.append("runs with equal recorded settings and lr sit in different folders: grouped by folder "
                         "(repeats, or a setting no configuration records)")
    named = sorted({k for r in rows for k in r["from_name"] if k in keys})
    if named:
        notes.append("read from folder names (no configuration records them): " + ", ".join(named))
    order = _nesting(rows, keys, value) if keys else []
    grouped: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {}
    for r in rows:
        key = {k: value(r, k) for k in order}
        grouped.setdefault(repr(sorted(key.items(), key=str)), (key, []))[1].append(r)
    grids = [sorted({r["lr"] for r in rs}) for _k, rs in grouped.values()]
    common = sorted(set.intersection(*(set(g) for g in grids))) if grids else []
    groups = []
    for k, rs in grouped.values():
        g = group_summary(k, rs, common)
        g["_sizes"] = {s: rs[0]["config"].get(s) for s in SIZE_KEYS}
        groups.append(g)
    groups.sort(key=lambda g: [repr(g["key"].get(k)) for k in order])
    if len({tuple(g) for g in grids}) > 1:
        notes.append("the groups swept different lr grids: compare them by lr_sensitivity_common (over the "
                     f"{len(common)} lrs every group swept)")
    if any(len(g["lrs"]) < 2 for g in groups):
        notes.append("some groups hold a single lr: their LR sensitivity is 0 by definition")
    size_varies = [k for k in SIZE_KEYS if k in order]
    if size_varies and target_width is None and target_params is None:
        notes.append(f"several {'/'.join(size_varies)}: give --target-width or --target-params to extrapolate "
                     "the size trends and predict the largest stable lr there")
    vocab = next((r["n_params_hint"]["vocab_size"] for r in rows if r["n_params_hint"].get("vocab_size")), None)
    trends, preds = size_trends(groups, target_width, target_params, int(vocab) if vocab else None)
    for g in groups:
        g.pop("_sizes", None)
    return {"schema_version": SCHEMA_VERSION, "root": str(root), "groups": groups, "varying": order,
            "nesting": order, "tree": _tree(groups, order), "size_trends": trends, "size_predictions": preds,
            "target": {"width": target_width, "params": target_params}, "skipped": skipped, "notes": notes}
