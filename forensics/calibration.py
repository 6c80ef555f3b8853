"""Calibrated confidence: the engine's raw score mapped to how often such a diagnosis is right.

The map is FITTED OFFLINE on the tuning part of the varied corpus (``sample_logs/make_varied_corpus.py``,
split by seed and held-out axis values) by ``benchmarks/fit_calibration.py`` and stored, with its
provenance, in ``forensics/calibration.json``; it is never fitted at run time on user data. The inputs are
the raw confidence of the chosen answer and what the answer is (healthy, transient, a named cause, unknown):
the raw scores of different rules do not mean the same thing, so each kind of answer gets its own slope.

Set ``FORENSICS_RAW_CONFIDENCE=1`` to get the raw scores (used only to refit the map).
"""

from __future__ import annotations

import json
import math
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

PARAMS_PATH = Path(__file__).with_name("calibration.json")

GROUPS = ("healthy", "transient", "lr_schedule_reset", "overflow", "data_batch", "update_scale_growth",
          "grad_scaling_bug", "state_not_restored", "hardware_or_distributed", "unknown")
"""Answer kinds with their own calibration offset (the verdict for healthy/transient, else the cause)."""


def group(verdict: str, cause: str | None) -> str:
    """The answer kind a confidence belongs to."""
    if verdict == "healthy":
        return "healthy"
    if verdict == "transient":
        return "transient"
    if verdict == "inconclusive":
        return "unknown"
    return cause if cause in GROUPS else "unknown"


def features(raw: float, verdict: str, cause: str | None) -> list[float]:
    """Feature vector of one answer: logit of the raw score, then one indicator per group."""
    p = min(max(float(raw), 1e-3), 1 - 1e-3)
    g = group(verdict, cause)
    return [math.log(p / (1 - p))] + [1.0 if g == k else 0.0 for k in GROUPS]


@lru_cache(maxsize=1)
def _params() -> dict[str, Any] | None:
    if not PARAMS_PATH.is_file():
        return None
    return json.loads(PARAMS_PATH.read_text())


def calibrate(raw: float, verdict: str, cause: str | None) -> float:
    """Calibrated confidence in [0.02, 0.98] of an answer with raw score ``raw``.

    Args:
        raw: The engine's raw confidence (0..1) of the chosen answer.
        verdict: ``healthy``, ``anomaly``, ``transient`` or ``inconclusive``.
        cause: The chosen cause (None when healthy).

    Returns:
        The probability that such an answer is right, from the stored fit; ``raw`` unchanged when no fit is
        stored or ``FORENSICS_RAW_CONFIDENCE`` is set.
    """
    prm = _params()
    if prm is None or os.environ.get("FORENSICS_RAW_CONFIDENCE"):
        return float(raw)
    if prm["method"] == "logistic":
        x = features(raw, verdict, cause)
        t = prm["intercept"] + sum(c * v for c, v in zip(prm["coef"], x, strict=True))
        p = 1.0 / (1.0 + math.exp(-t))
    else:  # isotonic: piecewise-linear through the fitted thresholds of the answer's group (or "all")
        tab = prm["tables"].get(group(verdict, cause)) or prm["tables"]["all"]
        xs, ys = tab["x"], tab["y"]
        r = float(raw)
        if r <= xs[0]:
            p = ys[0]
        elif r >= xs[-1]:
            p = ys[-1]
        else:
            k = next(i for i in range(1, len(xs)) if xs[i] >= r)
            f = (r - xs[k - 1]) / ((xs[k] - xs[k - 1]) or 1.0)
            p = ys[k - 1] + f * (ys[k] - ys[k - 1])
    return float(min(max(p, 0.02), 0.98))
