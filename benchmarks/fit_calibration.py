"""Fit the confidence calibration on the TUNING part of the varied corpus; write forensics/calibration.json.

Input: dumps written by ``benchmarks/accuracy.py --varied-only --dump FILE`` with
``FORENSICS_RAW_CONFIDENCE=1`` (raw engine scores). Two maps are fitted on the tuning items only:

* ``logistic``: scikit-learn ``LogisticRegression`` on [logit(raw), one indicator per answer kind]
  (:func:`forensics.calibration.features`), L2 C=1;
* ``isotonic``: scikit-learn ``IsotonicRegression`` of right/wrong on the raw score, per answer kind with at
  least 20 tuning items, else one map over all.

Each is scored by its expected calibration error (10 equal bins) on the tuning part and, when a validation
dump is given, on the validation part; the one with the lower validation ECE is stored (the validation part
only picks between the two finished fits; no rule or parameter is tuned on it). The stored file records the
method, parameters, the corpus, the seeds and both ECEs.

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


def _rows(items: list[dict]) -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray]:
    ok = [i for i in items if "error" not in i["found"]]
    raw = np.array([float(i["found"]["confidence"]) for i in ok])
    y = np.array([1.0 if i["right"] else 0.0 for i in ok])
    groups = [group(i["found"]["verdict"], i["found"]["cause"]) for i in ok]
    x = np.array([features(float(i["found"]["confidence"]), i["found"]["verdict"], i["found"]["cause"]) for i in ok])
    return raw, y, groups, x


def fit_logistic(x: np.ndarray, y: np.ndarray) -> dict:
    """Logistic regression of right/wrong on the features."""
    from sklearn.linear_model import LogisticRegression

    m = LogisticRegression(C=1.0, max_iter=2000).fit(x, y)
    return {"method": "logistic", "coef": [float(c) for c in m.coef_[0]], "intercept": float(m.intercept_[0]),
            "features": ["logit(raw)"] + [f"group={g}" for g in GROUPS]}


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


def apply(params: dict, raw: np.ndarray, groups: list[str], x: np.ndarray) -> np.ndarray:
    """Calibrated confidences of a fit (as forensics.calibration.calibrate computes them)."""
    if params["method"] == "logistic":
        t = params["intercept"] + x @ np.array(params["coef"])
        return np.clip(1 / (1 + np.exp(-t)), 0.02, 0.98)
    out = []
    for r, g in zip(raw, groups, strict=True):
        tab = params["tables"].get(g) or params["tables"]["all"]
        out.append(float(np.interp(r, tab["x"], tab["y"])))
    return np.clip(np.array(out), 0.02, 0.98)


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
    rt, yt, gt, xt = _rows(tun)
    fits = [fit_logistic(xt, yt), fit_isotonic(rt, yt, gt)]
    report = []
    for f in fits:
        e_t = _ece(apply(f, rt, gt, xt), yt)
        e_v = None
        if val:
            rv, yv, gv, xv = _rows(val)
            e_v = _ece(apply(f, rv, gv, xv), yv)
        f["ece_tuning"], f["ece_validation"] = round(e_t, 4), None if e_v is None else round(e_v, 4)
        report.append(f"{f['method']:<10} ECE tuning {e_t:.3f}  validation {'-' if e_v is None else f'{e_v:.3f}'}")
    raw_t = _ece(np.clip(rt, 0, 1), yt)
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
