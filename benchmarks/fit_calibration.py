"""Fit the confidence calibration on the TUNING part of the varied corpus; write forensics/calibration.json.

Input: dumps written by ``benchmarks/accuracy.py --varied-only --dump FILE`` with
``FORENSICS_RAW_CONFIDENCE=1`` (raw engine scores). Two maps are fitted on the tuning items only:

* ``logistic``: scikit-learn ``LogisticRegression`` on [logit(raw), the coverage share (share of the log
  detectors evaluated), one indicator per answer kind] (:func:`forensics.calibration.features`), L2 C=1;
* ``isotonic``: scikit-learn ``IsotonicRegression`` of right/wrong on the raw score, per answer kind with at
  least 20 tuning items, else one map over all.

Both are scored as the product applies them: the map, then the coverage cap for a fault or a transient, then,
for a healthy verdict, api.py's coverage factor (a raw dump's healthy score already carries that factor; it
is divided out before fitting). Each is scored by its expected calibration error (10 equal bins) on the
tuning part and, when a validation dump is given, on the validation part; the one with the lower validation
ECE is stored (the validation part only picks between the two finished fits; no rule or parameter is tuned
on it). The stored file records the method, parameters, the corpus, the seeds and both ECEs.

Usage::

    FORENSICS_RAW_CONFIDENCE=1 python benchmarks/accuracy.py --varied-only --jobs 2 --dump /tmp/raw.json
    python benchmarks/fit_calibration.py /tmp/raw.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from forensics.calibration import GROUPS, PARAMS_PATH, features, group  # noqa: E402


def _ece(p: np.ndarray, y: np.ndarray, bins: int = 10) -> float:
    total = 0.0
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        m = (p >= lo) & ((p < hi) | ((b == bins - 1) & (p <= 1.0)))
        if m.any():
            total += m.mean() * abs(y[m].mean() - p[m].mean())
    return float(total)


def _cap_now(cov: dict, share: float) -> float:
    """The coverage cap as :mod:`forensics.calibration`'s constants give it now (a dump may predate them).

    The skipped-inputs term is recovered from the dump's own cap (written with ``cap_floor`` then, 0.5 when
    the dump does not say).
    """
    from forensics import calibration as cal  # noqa: PLC0415

    floor_then = float(cov.get("cap_floor", 0.5))
    inputs_term = max(0.0, floor_then + (1 - floor_then) * share - float(cov["cap"]))
    return min(0.98, cal.CAP_FLOOR + (1 - cal.CAP_FLOOR) * share - inputs_term)


def _rows(items: list[dict]) -> dict[str, np.ndarray | list[str]]:
    """Per item: the engine's raw score, right/wrong, answer kind, features, coverage share, cap and factor."""
    ok = [i for i in items if "error" not in i["found"]]
    out: dict[str, list] = {k: [] for k in ("raw", "y", "groups", "x", "cap", "factor")}
    for i in ok:
        f = i["found"]
        cov = f.get("coverage") or {}
        factor = float(cov.get("factor", 1.0)) if f["verdict"] == "healthy" else 1.0
        raw = float(f["confidence"]) / (factor or 1.0)
        share = float(cov.get("share_evaluated", 1.0))
        nocap = f["verdict"] in ("healthy", "inconclusive") or "cap" not in cov
        out["raw"].append(raw)
        out["y"].append(1.0 if i["right"] else 0.0)
        out["groups"].append(group(f["verdict"], f["cause"]))
        out["x"].append(features(raw, f["verdict"], f["cause"], share))
        out["cap"].append(1.0 if nocap else _cap_now(cov, share))
        out["factor"].append(factor)
    return {k: (v if k == "groups" else np.array(v)) for k, v in out.items()}


def fit_logistic(x: np.ndarray, y: np.ndarray) -> dict:
    """Logistic regression of right/wrong on the features."""
    from sklearn.linear_model import LogisticRegression

    m = LogisticRegression(C=1.0, max_iter=2000).fit(x, y)
    return {"method": "logistic", "coef": [float(c) for c in m.coef_[0]], "intercept": float(m.intercept_[0]),
            "features": ["logit(raw)", "share_evaluated"] + [f"group={g}" for g in GROUPS]}


def fit_isotonic(raw: np.ndarray, y: np.ndarray, groups: list[str], min_items: int = 20) -> dict:
    """Isotonic regression of right/wrong on the raw score, per answer kind with enough items."""
    from sklearn.isotonic import IsotonicRegression

    tables = {}
    for g in ["all", *GROUPS]:
        m = np.ones_like(y, bool) if g == "all" else np.array([k == g for k in groups])
        if m.sum() < (1 if g == "all" else min_items):
            continue
        iso = IsotonicRegression(y_min=0.02, y_max=0.98, out_of_bounds="clip").fit(raw[m], y[m])
        tables[g] = {"x": [float(v) for v in iso.X_thresholds_], "y": [float(v) for v in iso.y_thresholds_],
                     "n": int(m.sum())}
    return {"method": "isotonic", "tables": tables}


def apply(params: dict | None, r: dict) -> np.ndarray:
    """Final confidences of a fit as the product computes them (map, clip, cap, healthy factor); None: raw."""
    if params is None:
        p = np.clip(r["raw"], 0.0, 1.0)
    else:
        p = np.minimum(np.clip(_mapped_all(params, r), 0.02, 0.98), r["cap"])
    return p * r["factor"]


def _mapped_all(params: dict, r: dict) -> np.ndarray:
    """The map of a fit at every item (as forensics.calibration.mapped computes it)."""
    if params["method"] == "logistic":
        t = params["intercept"] + r["x"] @ np.array(params["coef"])
        return 1 / (1 + np.exp(-t))
    out = []
    for raw, g in zip(r["raw"], r["groups"], strict=True):
        tab = params["tables"].get(g) or params["tables"]["all"]
        out.append(float(np.interp(raw, tab["x"], tab["y"])))
    return np.array(out)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dump", type=Path, help="accuracy.py --dump file (raw confidences), both splits")
    ap.add_argument("--out", type=Path, default=PARAMS_PATH)
    ap.add_argument("--corpus", default="/work/corpus15 (make_varied_corpus.py --n 360 --first-seed 1)")
    a = ap.parse_args(argv)
    items = json.loads(a.dump.read_text())
    tun = [i for i in items if i["split"] == "tuning"]
    val = [i for i in items if i["split"] == "validation"]
    rt = _rows(tun)
    rv = _rows(val) if val else None
    fits = [fit_logistic(rt["x"], rt["y"]), fit_isotonic(rt["raw"], rt["y"], rt["groups"])]
    report = []
    for f in fits:
        e_t = _ece(apply(f, rt), rt["y"])
        e_v = None if rv is None else _ece(apply(f, rv), rv["y"])
        f["ece_tuning"], f["ece_validation"] = round(e_t, 4), None if e_v is None else round(e_v, 4)
        report.append(f"{f['method']:<10} ECE tuning {e_t:.3f}  validation {'-' if e_v is None else f'{e_v:.3f}'}")
    raw_t = _ece(apply(None, rt), rt["y"])
    report.append(f"{'raw':<10} ECE tuning {raw_t:.3f}")
    best = min(fits, key=lambda f: (f["ece_validation"] if f["ece_validation"] is not None else f["ece_tuning"]))
    best["provenance"] = {"script": "benchmarks/fit_calibration.py", "corpus": a.corpus,
                          "fitted_on": f"tuning part, {len(tun)} runs (split by seed mod 4 and held-out axis values)",
                          "validation_runs": len(val), "alternatives": report}
    a.out.write_text(json.dumps(best, indent=1) + "\n")
    print("\n".join(report))
    print(f"kept {best['method']} -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
