"""One run of a sweep: its lr, final loss, divergence and instability signatures; settings read from folder names."""

from __future__ import annotations

import math
import re
from pathlib import PurePosixPath
from typing import Any

import numpy as np

from forensics.config_diff import extract_config, flat_config
from forensics.model import RunData

TAIL = 0.05
"""Share of the last logged points averaged into the final training loss (at least one point)."""
TREND_SIGNALS = ("attn_logit_max", "output_logit_max", "update_ratio", "grad_norm")
"""Signals whose growth with size is fitted and extrapolated (Wortsman et al. 2023 s3.1: attention and output
logits; update ratios and gradient norms as the optimizer-side view)."""
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
    cfg = {k: v for k, v in extract_config(run).items() if k != "_found"}
    from_name = settings_from_name(name)
    named = {k: v for k, v in from_name.items() if k not in cfg and k != "seed"}
    cfg.update(named)
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
    steps, why = _divergence(run, loss, final, initial)
    sig = signatures(run)
    flat = flat_config(run)
    raw = {k: v for k, v in flat.items() if isinstance(v, str | int | float | bool) and not _IGNORED_RAW.search(k)}
    return {"run": name, "lr": float(lr), "final_loss": final if math.isfinite(final) else None,
            "final_loss_source": final_src, "initial_loss": initial, "diverged": bool(steps),
            "divergence_step": min(steps) if steps else None, "divergence_reason": why, "signatures": sig,
            "config": cfg, "raw_config": raw, "from_name": named, "seed": flat.get("seed", from_name.get("seed")),
            "n_params_hint": {"vocab_size": flat.get("vocab_size")}}




def _divergence(run: RunData, loss: Any, final: float, initial: float) -> tuple[list[int], list[str]]:
    """(steps, reasons) of each sign of divergence.

    The signs: a non-finite loss, a final loss above the initial one, the engine's failure step
    (:func:`forensics.engine.decide`).
    """
    from forensics.engine import decide

    vals = loss.values
    finite = np.isfinite(vals)
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
    return steps, why


def signatures(run: RunData) -> dict[str, Any]:
    """Instability signatures of one run.

    Per :data:`TREND_SIGNALS` series its end (mean of the last 5%), max and growth (log of max over first
    value, nats), and the drift of log Z (end minus start).
    """
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
    return sig
