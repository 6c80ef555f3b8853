"""Calibrated confidence: the engine's raw score mapped to how often such a diagnosis is right.

The map is FITTED OFFLINE on the tuning part of the varied corpus (``sample_logs/make_varied_corpus.py``,
split by seed and held-out axis values) by ``benchmarks/fit_calibration.py`` and stored, with its
provenance, in ``forensics/calibration.json``; it is never fitted at run time on user data. The inputs are
the raw confidence of the chosen answer and what the answer is (healthy, transient, a named cause, unknown):
the raw scores of different rules do not mean the same thing, so each kind of answer gets its own slope.

Coverage. A verdict over part of the evidence is weaker than over all of it, and the tuning corpus holds only
the causes its generator injects: with the loss alone, a NaN is "data_batch" on every tuning run, yet on a user's
run it may be an lr blow-up or an fp16 overflow that no lr or loss-scale series was logged to show. So the
calibrated confidence of a fault or a transient is CAPPED by the coverage (:func:`coverage`):
``cap = CAP_FLOOR + (1 - CAP_FLOOR) x share_evaluated - 0.03 x skipped inputs`` (at most 0.15 off),
where ``share_evaluated`` is the share of the diagnosis's RIVAL causes that a logged signal could check
(:func:`forensics.coverage.rivals_checked`, docs/detectors.md#coverage: a loss-only NaN leaves an lr blow-up,
a growth and an fp16 overflow unchecked, share 0, cap 0.5). Until stop 22 the share was that of the log
detectors that ran, which lowered every run that logs few metrics alike, whether or not the missing metrics
could have changed its answer (validation ECE 0.110, the capped runs right 95 % at 0.73). The shape of the
cap is our rule; its floor is chosen on the TUNING part only by the rule fixed at stop 22 (the lowest floor
that keeps the tuning ECE under 0.1: with the rival share every floor 0.5..1.0 gives 0.035-0.045, so 0.5),
and both maps in ``benchmarks/fit_calibration.py`` also take ``share_evaluated`` as a feature. A healthy
verdict is lowered by the coverage factor of :func:`forensics.api._coverage` instead. The Decision carries
the numbers (``Decision.coverage``) and the JSON shows them under ``meta.coverage``.

Set ``FORENSICS_RAW_CONFIDENCE=1`` to get the raw scores, uncapped (used only to refit the map).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any

from forensics.model import Verdict

PARAMS_PATH = Path(__file__).with_name("calibration.json")

GROUPS = ("healthy", "transient", "lr_schedule_reset", "overflow", "data_batch", "update_scale_growth",
          "grad_scaling_bug", "state_not_restored", "hardware_or_distributed", "unknown")
"""Answer kinds with their own calibration offset (the verdict for healthy/transient, else the cause)."""


ARTEFACT_PREFIXES = ("CK", "NT")
"""Codes of detectors that read files beside the logs (checkpoints, notes): not counted in the coverage."""
CAP_FLOOR = 0.5
"""The cap when no rival of the diagnosis could be checked (chosen on the tuning part, see the module
docstring; 0.7 at stop 22, when the share was that of the detectors evaluated)."""
CAP_PER_INPUT = 0.03
"""Each skipped or damaged input lowers the cap by 0.03 (as :func:`forensics.api._coverage`; our choice)."""
CAP_INPUTS_MAX = 0.15
"""The skipped or damaged inputs lower the cap by at most 0.15 in all (as :func:`forensics.api._coverage`)."""
CONFIDENCE_MIN = 0.02
"""Lowest calibrated confidence: the corpus the map is fitted on cannot support certainty either way (our choice)."""
CONFIDENCE_MAX = 0.98
"""Highest calibrated confidence, and the highest cap (the same reason as :data:`CONFIDENCE_MIN`)."""
LOGIT_CLIP = 1e-3
"""The raw score is clipped to [0.001, 0.999] before its logit is taken (keeps the feature finite; our choice)."""
CAPPED_TOL = 1e-9
"""The cap counts as having lowered a confidence only by more than this (float noise; not a threshold)."""


def coverage(skipped: Iterable[Any], codes: Iterable[str], skipped_inputs: int = 0,
             rivals: tuple[float, list[str], list[str]] | None = None) -> dict[str, Any]:
    """How much of the evidence the verdict rests on, and the confidence cap that follows.

    Args:
        skipped: The decision's skips (``Skip.what`` starts with the detector code for a detector skip).
        codes: The codes of every detector that was asked to run.
        skipped_inputs: Input files (or parts) that were skipped or damaged.
        rivals: :func:`forensics.coverage.rivals_checked` of the diagnosis: ``(share, checked, unchecked)``;
            None: the share of log detectors evaluated stands in for it.

    Returns:
        ``share_evaluated`` (0..1: the share of the diagnosis's rivals a logged signal could check, the cap's
        input), ``rivals_checked`` / ``rivals_unchecked``, ``detector_share``, ``detectors_evaluated``,
        ``detectors_total`` (log detectors only), ``not_evaluated`` (codes), ``skipped_inputs``, ``cap`` (up to
        0.98, see the module docstring) and ``cap_floor``.
    """
    logs = sorted({c for c in codes if not c.startswith(ARTEFACT_PREFIXES)})
    not_run = sorted({str(getattr(s, "what", s)).split(" ")[0] for s in skipped} & set(logs))
    detector_share = (len(logs) - len(not_run)) / len(logs) if logs else 1.0
    share, checked, unchecked = rivals if rivals is not None else (detector_share, [], [])
    cap = CAP_FLOOR + (1 - CAP_FLOOR) * share - min(CAP_INPUTS_MAX, CAP_PER_INPUT * skipped_inputs)
    return {"share_evaluated": round(share, 3), "rivals_checked": list(checked), "rivals_unchecked": list(unchecked),
            "detector_share": round(detector_share, 3), "detectors_evaluated": len(logs) - len(not_run),
            "detectors_total": len(logs), "not_evaluated": not_run, "skipped_inputs": int(skipped_inputs),
            "cap": round(min(CONFIDENCE_MAX, cap), 3), "cap_floor": CAP_FLOOR}


def group(verdict: str, cause: str | None) -> str:
    """The answer kind a confidence belongs to."""
    if verdict == "healthy":
        return "healthy"
    if verdict == "transient":
        return "transient"
    if verdict == "inconclusive":
        return "unknown"
    return cause if cause in GROUPS else "unknown"


def features(raw: float, verdict: str, cause: str | None, share: float = 1.0) -> list[float]:
    """Feature vector of one answer: logit of the raw score, the coverage share, one indicator per group."""
    p = min(max(float(raw), LOGIT_CLIP), 1 - LOGIT_CLIP)
    g = group(verdict, cause)
    return [math.log(p / (1 - p)), float(share)] + [1.0 if g == k else 0.0 for k in GROUPS]


@lru_cache(maxsize=1)
def _params() -> dict[str, Any] | None:
    if not PARAMS_PATH.is_file():
        return None
    return json.loads(PARAMS_PATH.read_text())


def calibrate(raw: float, verdict: str, cause: str | None, cov: dict[str, Any] | None = None) -> float:
    """Calibrated confidence in [0.02, 0.98] of an answer with raw score ``raw``, capped by the coverage.

    Args:
        raw: The engine's raw confidence (0..1) of the chosen answer.
        verdict: ``healthy``, ``anomaly``, ``transient`` or ``inconclusive``.
        cause: The chosen cause (None when healthy).
        cov: :func:`coverage` of the decision (None: full coverage, no cap).

    Returns:
        The probability that such an answer is right, from the stored fit, at most ``cov["cap"]`` for a fault or
        a transient; ``raw`` unchanged when no fit is stored or ``FORENSICS_RAW_CONFIDENCE`` is set.
    """
    prm = _params()
    if prm is None or os.environ.get("FORENSICS_RAW_CONFIDENCE"):
        return float(raw)
    p = mapped(prm, raw, verdict, cause, 1.0 if cov is None else float(cov["share_evaluated"]))
    if cov is not None and verdict not in (Verdict.HEALTHY, Verdict.INCONCLUSIVE):
        p = min(p, float(cov["cap"]))
    return float(min(max(p, CONFIDENCE_MIN), CONFIDENCE_MAX))


def mapped(prm: dict[str, Any], raw: float, verdict: str, cause: str | None, share: float = 1.0) -> float:
    """The stored map (logistic or isotonic) at ``raw``, uncapped and unclipped."""
    if prm["method"] == "logistic":
        x = features(raw, verdict, cause, share)
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
    return float(p)


def calibrate_decision(raw: float, verdict: str, cause: str | None, skipped: Iterable[Any], codes: Iterable[str],
                       skipped_inputs: int = 0,
                       rivals: tuple[float, list[str], list[str]] | None = None) -> tuple[float, dict[str, Any]]:
    """The calibrated, coverage-capped confidence of a decision, and its coverage (what the engine stores).

    Returns:
        (confidence, coverage): :func:`coverage` plus ``capped`` (the cap lowered the confidence) and ``note``
        (one line for a report's header, e.g. "confidence capped at 0.76: not checked: overflow (log loss_scale
        or skipped_step)").
    """
    cov = coverage(skipped, codes, skipped_inputs, rivals)
    conf = calibrate(raw, verdict, cause, cov)
    uncapped = calibrate(raw, verdict, cause, {**cov, "cap": 1.0})  # the same map and share, no cap
    cov["capped"] = bool(conf < uncapped - CAPPED_TOL)
    n_off = cov["detectors_total"] - cov["detectors_evaluated"]
    why = [f"rival causes not checked: {'; '.join(cov['rivals_unchecked'])}"] if cov["rivals_unchecked"] else []
    if skipped_inputs:
        why.append(f"{skipped_inputs} input(s) skipped or damaged")
    if n_off and not cov["capped"]:
        why.append(f"{n_off} of {cov['detectors_total']} log detectors not evaluated")
    cov["note"] = (f"confidence capped at {cov['cap']:.2f}: " + "; ".join(why) if cov["capped"]
                   else "; ".join(why) or "every log detector was evaluated")
    return conf, cov
