"""Verifying a muP claim made by both runs of a comparison (Yang et al. 2022, arXiv 2203.03466, table 3, Adam)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from forensics.config_diff._read import _first, _num
from forensics.model import RunData

# ----------------------------------------------------------------------------------------------- muP

MUP_CLAIM = re.compile(r"(?:^|\.)(?:mup|use_mup|mup_enabled|mutransfer|base_shapes|mup_base_shapes|"
                       r"mup_base_width|mup_base_hidden_size|mup_width_multiplier|mup_width_scale|width_mult)$")
"""Config keys by which a run claims muP: the ``mup`` package's users (``base_shapes``, ``width_mult``,
``output_mult``), GPT-NeoX / Cerebras muTransfer (``use_mup``, ``mup_base_hidden_size``, ``mup_width_scale``,
``mup_output_multiplier``/``output_logits_alpha``), and the common ``mup``/``mup_base_width`` flags."""
_WIDTH_MULT = ("width_mult", "mup_width_multiplier", "mup_width_scale", "mup_width_mult")
_BASE_WIDTH = ("mup_base_width", "mup_base_hidden_size", "base_width", "base_hidden_size", "mup_base_d_model")
_OUTPUT_MULT = ("output_mult", "mup_output_multiplier", "mup_output_mult", "output_logits_alpha",
                "output_logits_scale", "mup_output_temp", "readout_mult")
_HIDDEN_LR = ("lr_hidden", "hidden_lr", "matrix_lr", "lr_matrix")


def claims_mup(flat: Mapping[str, Any]) -> bool:
    """True when a key of :data:`MUP_CLAIM` is set (a flag must be true; a base width or multiplier counts)."""
    for k, v in flat.items():
        if MUP_CLAIM.search(k) and v is not None and v is not False and str(v).strip().lower() not in (
                "false", "0", "no", "none", "off", ""):
            return True
    return False


def _group_lrs(flat: Mapping[str, Any]) -> dict[str, float]:
    """Per-group lrs from ``param_groups``/``optimizer.param_groups`` lists or ``lr_hidden``-style keys."""
    out: dict[str, float] = {}
    for k, v in flat.items():
        if (k.endswith("param_groups") or k.endswith("optimizer_groups")) and isinstance(v, list | tuple):
            for i, g in enumerate(v):
                if isinstance(g, Mapping) and _num(g.get("lr")) is not None:
                    out[str(g.get("name", i))] = _num(g["lr"])  # type: ignore[assignment]
    hit = _first(flat, _HIDDEN_LR)
    if hit is not None and _num(hit) is not None:
        out.setdefault("hidden", _num(hit))  # type: ignore[arg-type]
    return out


def mup_check(pf: Mapping[str, Any], tf: Mapping[str, Any], pc: Mapping[str, Any], tc: Mapping[str, Any],
              proxy: RunData | None = None, target: RunData | None = None) -> dict[str, Any] | None:
    """Verify a muP claim made by both runs, from their configurations and logs (Yang et al. 2022, table 3, Adam).

    Checks: (1) width multipliers: each run's ``width_mult`` equals d_model / base width when all three are
    recorded, and target/proxy multipliers equal the width ratio; (2) per-group lrs: the hidden (matrix)
    lr scales as 1 / width multiplier relative to the base lr (config ``param_groups``/``lr_hidden``, or the
    logged ``lr/hidden`` series), vector-like groups keep the base lr; (3) the output multiplier: an
    effective multiplier scales as 1 / width multiplier (a constant ``output_mult`` of the ``mup`` package,
    which divides by ``width_mult`` itself, is equal on both sides); from the logs, the output logits of the
    two runs over the first 10% of training within 2x of each other (they stay O(1) in width under muP).

    Returns:
        ``None`` unless both runs claim muP (:func:`claims_mup`), else ``{"claimed": True, "checks": [{"what",
        "status": "ok" | "mismatch" | "not_verifiable", "detail"}], "not_verifiable": [what...], "verdict"}``.
    """
    if not (claims_mup(pf) and claims_mup(tf)):
        return None
    checks, (mp, mt) = _width_checks(pf, tf, pc, tc)
    checks += _group_lr_checks(pf, tf, pc, tc, mp, mt, proxy, target)
    checks += _output_mult_checks(pf, tf, mp, mt)
    if proxy is not None and target is not None:
        checks += _output_logit_checks(proxy, target)
    bad = [c for c in checks if c["status"] == "mismatch"]
    nv = [c["what"] for c in checks if c["status"] == "not_verifiable"]
    verdict = ("muP claim contradicted: " + "; ".join(c["what"] for c in bad)) if bad else (
        "consistent with muP where verifiable" + (f"; not verifiable: {', '.join(nv)}" if nv else ""))
    return {"claimed": True, "checks": checks, "not_verifiable": nv, "verdict": verdict,
            "also_not_verifiable": ["attention scale 1/d_head vs 1/sqrt(d_head) (not in the logs)",
                                    "initialisation variances per parameter group (need checkpoints at step 0)"]}


MULT_TOL = 0.02
"""Relative tolerance on width multipliers (configs round d_model / base width to a few digits)."""
LR_TOL = 0.05
"""Relative tolerance on per-group lr and output-multiplier ratios (lrs are written with 2-3 digits)."""
SAME_TOL = 1e-6
"""Two output multipliers this close are the same constant."""
LOGIT_BAND = 2.0
"""Output logits of the two runs within this factor of each other early on (O(1) in width under muP)."""
EARLY_SHARE = 10
"""The early window is the first 1/EARLY_SHARE of the logged points (at least :data:`EARLY_MIN` points)."""
EARLY_MIN = 3
"""Fewest points of the early window, however short the log (our choice: three points give a median one outlier
cannot move)."""
LOGIT_MIN_POINTS = 10
"""Fewest logged output-logit points for the log check."""
NAMES_SHOWN = 4
"""Setting names quoted in a "not recorded" message before "..." (display; our choice)."""


def _check(what: str, status: str, detail: str) -> dict[str, Any]:
    return {"what": what, "status": status, "detail": detail}


def _width_checks(pf: Mapping[str, Any], tf: Mapping[str, Any], pc: Mapping[str, Any], tc: Mapping[str, Any]
                  ) -> tuple[list[dict[str, Any]], tuple[float | None, float | None]]:
    """Check (1): each run's width multiplier against d_model / base width, and their ratio against the widths."""
    checks: list[dict[str, Any]] = []
    mults = []
    for side, f, c in (("proxy", pf, pc), ("target", tf, tc)):
        m, base, d = _num(_first(f, _WIDTH_MULT)), _num(_first(f, _BASE_WIDTH)), _num(c.get("d_model"))
        if m is None and base and d:
            m = d / base
        elif m is not None and base and d and not math.isclose(m, d / base, rel_tol=MULT_TOL):
            checks.append(_check(f"width multiplier ({side})", "mismatch", f"width_mult {m:g} but d_model / base "
                                 f"width = {d:g} / {base:g} = {d / base:g}"))
        mults.append(m)
    mp, mt = mults
    dp, dt = _num(pc.get("d_model")), _num(tc.get("d_model"))
    if mp and mt and dp and dt:
        ok = math.isclose(mt / mp, dt / dp, rel_tol=MULT_TOL)
        checks.append(_check("width multipliers", "ok" if ok else "mismatch",
                             f"target/proxy multiplier {mt / mp:.4g} vs width ratio {dt / dp:.4g} (d_model {dp:g} -> "
                             f"{dt:g})"))
    else:
        checks.append(_check("width multipliers", "not_verifiable",
                             "needs each run's width multiplier (or base width) and d_model; recorded: "
                             f"multipliers {mp}, {mt}; d_model {dp}, {dt}"))
    return checks, (mp, mt)


def _group_lr_checks(pf: Mapping[str, Any], tf: Mapping[str, Any], pc: Mapping[str, Any], tc: Mapping[str, Any],
                     mp: float | None, mt: float | None, proxy: RunData | None, target: RunData | None
                     ) -> list[dict[str, Any]]:
    """Check (2): the hidden-matrix lr scales as 1 / width multiplier, vector-like groups keep the base lr."""
    gp, gt = _group_lrs(pf), _group_lrs(tf)
    lp, lt = _num(pc.get("peak_lr")), _num(tc.get("peak_lr"))
    src = "config"
    if "hidden" not in gp or "hidden" not in gt:
        for run, g in ((proxy, gp), (target, gt)):
            s = run.series("lr/hidden") if run is not None else None
            if s is not None and len(s) and np.isfinite(s.values).any():
                g.setdefault("hidden", float(np.nanmax(s.values)))
                src = "logs (lr/hidden, peak)"
    if not ("hidden" in gp and "hidden" in gt and mp and mt and lp and lt):
        return [_check("per-group lrs", "not_verifiable", "needs the hidden-matrix lr of both runs (config "
                       "param_groups / lr_hidden, or a logged lr/hidden series), both base lrs and both width "
                       "multipliers")]
    want = (lt / lp) * (mp / mt)
    got = gt["hidden"] / gp["hidden"]
    checks = [_check("per-group lrs", "ok" if math.isclose(got, want, rel_tol=LR_TOL) else "mismatch",
                     f"hidden-matrix lr target/proxy x{got:.4g}, muP (Adam) expects x{want:.4g} = base lr ratio "
                     f"x{lt / lp:.4g} / width multiplier ratio x{mt / mp:.4g} (from {src})")]
    for name in sorted((set(gp) & set(gt)) - {"hidden"}):
        r = gt[name] / gp[name]
        checks.append(_check(f"lr of group {name!r}", "ok" if math.isclose(r, lt / lp, rel_tol=LR_TOL) else "mismatch",
                             f"x{r:.4g} vs base lr ratio x{lt / lp:.4g} (vector-like groups keep the base lr under "
                             "muP)"))
    return checks


def _output_mult_checks(pf: Mapping[str, Any], tf: Mapping[str, Any], mp: float | None, mt: float | None
                        ) -> list[dict[str, Any]]:
    """Check (3): an effective output multiplier scales as 1 / width multiplier (the mup package's is constant)."""
    op, ot = _num(_first(pf, _OUTPUT_MULT)), _num(_first(tf, _OUTPUT_MULT))
    if not (op and ot and mp and mt):
        return [_check("output multiplier", "not_verifiable", "no output multiplier recorded in both configurations "
                       f"({', '.join(_OUTPUT_MULT[:NAMES_SHOWN])}, ...)")]
    if math.isclose(ot / op, mp / mt, rel_tol=LR_TOL):
        return [_check("output multiplier", "ok", f"x{ot / op:.4g} = 1 / width multiplier ratio (an effective "
                       "multiplier)")]
    if math.isclose(ot, op, rel_tol=SAME_TOL):
        return [_check("output multiplier", "ok", f"{op:g} on both: the mup package's constant (MuReadout divides by "
                       "width_mult itself); wrong if the code applies it as the effective multiplier")]
    return [_check("output multiplier", "mismatch", f"target/proxy x{ot / op:.4g}; muP expects x{mp / mt:.4g} "
                   "(effective) or x1 (mup package constant)")]


def _output_logit_checks(proxy: RunData, target: RunData) -> list[dict[str, Any]]:
    """From the logs: the two runs' output logits over the first 10% of training within 2x of each other."""
    a, b = proxy.series("output_logit_max"), target.series("output_logit_max")
    if not (a is not None and b is not None and len(a) >= LOGIT_MIN_POINTS and len(b) >= LOGIT_MIN_POINTS):
        return [_check("output logits in the logs", "not_verifiable", "no output_logit_max series in both runs")]
    ea = float(np.nanmedian(a.values[: max(EARLY_MIN, len(a) // EARLY_SHARE)]))
    eb = float(np.nanmedian(b.values[: max(EARLY_MIN, len(b) // EARLY_SHARE)]))
    if not (ea > 0 and eb > 0):
        return []
    r = eb / ea
    return [_check("output logits in the logs", "ok" if 1 / LOGIT_BAND <= r <= LOGIT_BAND else "mismatch",
                   f"median output_logit_max over the first 10% of steps: target/proxy x{r:.3g} (muP keeps output "
                   "logits O(1) in width: within 2x expected)")]
