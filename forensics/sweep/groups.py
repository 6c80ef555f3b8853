"""Groups of a sweep: runs that differ only in lr, their LR sensitivity and largest stable lr, and how they nest."""

from __future__ import annotations

import math
from pathlib import PurePosixPath
from typing import Any

import numpy as np

from forensics.config_diff import ALIASES
from forensics.sweep.runs import lr_sensitivity

STABLE_MARGIN = 0.05
"""A stable run's final loss is within this share of (L0 - best loss) of the best loss (our choice)."""
_DERIVED = {"peak_lr", "warmup_tokens"}
SAME_LR_REL = 1e-6
"""Two runs' lrs within this relative difference are the same grid value (float printing; not a threshold)."""


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
        keep = [i for i, lr in enumerate(lrs) if any(math.isclose(lr, c, rel_tol=SAME_LR_REL) for c in common)]
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


def varying_settings(rows: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
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


def nesting(rows: list[dict[str, Any]], keys: list[str], value: Any) -> list[str]:
    """The varying settings ordered by the folder depth at which they first split the runs."""
    def depth(k: str) -> int:
        parts = [PurePosixPath(r["run"]).parts for r in rows]
        deepest = max(len(p) for p in parts)
        for i in range(deepest):
            seen: dict[tuple[str, ...], set[str]] = {}
            for r, p in zip(rows, parts, strict=True):
                seen.setdefault(tuple(p[:i + 1]), set()).add(repr(value(r, k)))
            if all(len(v) == 1 for v in seen.values()):
                return i
        return deepest  # splits the runs at no folder level: after every setting that does
    return sorted(keys, key=lambda k: (depth(k), keys.index(k)))


def tree(groups: list[dict[str, Any]], order: list[str]) -> list[dict[str, Any]]:
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


