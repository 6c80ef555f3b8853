"""Success criteria of a recovery trial, from the run's own pre-onset statistics (robust, not absolute).

Each criterion is stated on a series of the chosen cause's causal chain and kept only when the failed run
itself did NOT meet it over the trial window after the onset (a criterion the failed run meets cannot tell a
fixed run from the failed one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from forensics.model import Cause, Finding, RunData
from forensics.stats import MAD_TO_SIGMA

STATS_WINDOW = 128
"""Pre-onset points the statistics are taken over (the detectors' trailing window)."""
MIN_POINTS = 5
"""Fewest finite pre-onset points for a statistic."""
SPIKE_SIGMAS = 6
"""A loss or grad-norm spike is beyond this many robust sigmas (docs/detectors.md#sp01)."""
LEVEL_SIGMAS = 3
"""The loss after the onset stays within this many robust sigmas of its pre-onset level."""
GRAD_NORM_BAND = 2.0
"""The grad norm's rolling median stays within this factor of its pre-onset median."""
ROLLING = 32
"""Points of the rolling median that judges the grad-norm band."""
HARDWARE_TOLERANCE = "3%"
"""Throughput (or step time) back to its pre-onset median within this (our choice: above timing noise)."""
LR_TOLERANCE = "1%"
"""The resumed lr matches the schedule within this (lrs are logged with 4+ significant digits)."""
FALLBACK_LENGTH = 100
"""Trial window judged when no trial states its length."""
HIGH_PERCENTILE = 95
"""The baseline's 95th percentile is stated beside its median and sigma (our choice: with :data:`LOW_PERCENTILE`
the usual two-sided 90% range, a band that assumes no normal law)."""
LOW_PERCENTILE = 5
"""The baseline's 5th percentile (see :data:`HIGH_PERCENTILE`)."""
CAUSAL_SERIES = {
    Cause.HARDWARE_OR_DISTRIBUTED: ("loss", "grad_norm", "throughput", "step_time"),
    Cause.LR_SCHEDULE_RESET: ("loss", "grad_norm", "lr"),
    Cause.OVERFLOW: ("loss", "grad_norm", "loss_scale"),
}
"""Series a cause's criteria may be stated on; every other cause: loss and grad norm."""
DEFAULT_SERIES = ("loss", "grad_norm")


@dataclass(frozen=True)
class Criterion:
    """One success criterion: the series it is stated on, its kind, the sentence, its numbers."""

    metric: str
    kind: str
    text: str
    level: float = float("nan")
    width: float = float("nan")


def _g(x: float) -> str:
    return f"{x:.4g}"


def pre_onset_stats(run: RunData, onset: int, window: int = STATS_WINDOW) -> dict[str, float]:
    """Median, robust sigma, p95, p05 before the onset (loss, grad norm, throughput, step time, loss scale); peak lr."""
    out: dict[str, float] = {}
    for m in ("loss", "grad_norm", "throughput", "step_time", "loss_scale"):
        s = run.series(m)
        if s is None:
            continue
        v = s.values[(s.steps < onset) & np.isfinite(s.values)][-window:]
        if v.size >= MIN_POINTS:
            med = float(np.median(v))
            out[f"{m}_median"] = med
            out[f"{m}_sigma"] = float(MAD_TO_SIGMA * np.median(np.abs(v - med)))
            out[f"{m}_p95"] = float(np.percentile(v, HIGH_PERCENTILE))
            out[f"{m}_p05"] = float(np.percentile(v, LOW_PERCENTILE))
    lr = run.series("lr")
    if lr is not None and len(lr):
        v = lr.values[np.isfinite(lr.values)]
        if v.size:
            out["peak_lr"] = float(v.max())
            i_peak = int(np.argmax(lr.values == v.max()))
            out["warmup_steps"] = float(lr.steps[i_peak] - lr.steps[0])
    return out


def criteria(stats: dict[str, float], length: int, unit: str = "step", cause: str | None = None,
             expected_lr: object = None, onset: int | None = None, resumed: bool = True) -> list[Criterion]:
    """Success criteria on the causal series of ``cause`` (all of them; :func:`fitting` drops the met ones)."""
    series = CAUSAL_SERIES.get(cause, DEFAULT_SERIES) if cause else DEFAULT_SERIES  # type: ignore[call-overload]
    out: list[Criterion] = []
    if "loss_median" in stats:
        med, sig = stats["loss_median"], stats["loss_sigma"]
        out.append(Criterion("loss", "no_spike", f"no loss spike beyond {SPIKE_SIGMAS} robust sigmas of the trailing "
                             f"{STATS_WINDOW} {unit}s through the {length}-{unit} trial (pre-onset loss median "
                             f"{_g(med)}, robust sigma {_g(sig)})"))
        out.append(Criterion("loss", "level", f"past the onset, the loss stays within {LEVEL_SIGMAS} robust sigmas of "
                             f"the pre-onset level ({_g(med)} +- {_g(LEVEL_SIGMAS * sig)}) or below it, and keeps "
                             "decreasing", med, LEVEL_SIGMAS * sig))
    if "grad_norm_median" in stats:
        g = stats["grad_norm_median"]
        out.append(Criterion("grad_norm", "band", f"the grad norm's rolling median stays within {GRAD_NORM_BAND:g}x of "
                             f"its pre-onset median ({_g(g)}) and no grad-norm spike beyond {SPIKE_SIGMAS} robust "
                             "sigmas appears", g))
    if "lr" in series and isinstance(expected_lr, (int, float)) and onset is not None:
        out.append(Criterion("lr", "schedule", f"the lr at {unit} {onset} is the schedule's {_g(float(expected_lr))} "
                             f"(within {LR_TOLERANCE}), not the value " + ("the faulty resume logged" if resumed else
                                                                           "the failed run logged there"),
                             float(expected_lr)))
    if "loss_scale" in series and "loss_scale_median" in stats:
        ls = stats["loss_scale_median"]
        out.append(Criterion("loss_scale", "scale_floor", f"the loss scale stays at or above its pre-onset median "
                             f"({_g(ls)}) through the trial: no back-off cascade (or no loss scaler at all, in bf16)",
                             ls))
    for m, better in (("throughput", "at or above"), ("step_time", "at or below")):
        if m in series and f"{m}_median" in stats:
            out.append(Criterion(m, "hardware", f"{m.replace('_', ' ')} back {better} its pre-onset median "
                                 f"({_g(stats[f'{m}_median'])}) within {HARDWARE_TOLERANCE} on the new hardware"))
    out.append(Criterion("", "analyze", "`forensics analyze` on the trial run reports it healthy"))
    return [c for c in out if not c.metric or c.metric in series]


def met_by_failed_run(c: Criterion, run: RunData, onset: int, length: int, findings: Sequence[Finding]) -> bool:
    """The failed run itself met ``c`` over ``length`` steps from the onset (so ``c`` cannot judge a trial)."""
    v = run.values_after(c.metric, onset, length) if c.metric else None
    if v is None or not np.isfinite(v).all():
        return False
    if c.kind == "level":
        return float(v.max()) <= c.level + c.width
    if c.kind == "scale_floor":
        return bool(float(np.min(v)) >= c.level)
    if c.kind == "no_spike":
        return not any("spike" in f.name and (f.step or -1) >= onset for f in findings)
    if c.kind == "band" and c.level > 0:
        k = max(1, min(ROLLING, v.size))
        med = np.array([np.median(v[max(0, i - k + 1): i + 1]) for i in range(v.size)])
        spiky = any(f.name.startswith("grad_norm") and (f.step or -1) >= onset for f in findings)
        return not spiky and bool((med <= GRAD_NORM_BAND * c.level).all() and (med >= c.level / GRAD_NORM_BAND).all())
    return False


def fitting(cs: list[Criterion], run: RunData, onset: int, length: int, findings: Sequence[Finding]) -> tuple[str, ...]:
    """The sentences of the criteria the failed run did not already meet after its onset."""
    return tuple(c.text for c in cs if not met_by_failed_run(c, run, onset, length or FALLBACK_LENGTH, findings))
