"""Labels from what was injected; runs whose fault did not show are :class:`Dropped`."""

from __future__ import annotations

import math
from typing import Any

from varied_spec import KINDS, Dropped, Spec
from varied_training import Run


def _mean20(vals: list[float]) -> list[float]:
    out = []
    for i in range(len(vals)):
        w = [v for v in vals[max(0, i - 19): i + 1] if math.isfinite(v)]
        out.append(sum(w) / len(w) if w else math.inf)
    return out


VISIBLE_METRICS = ("loss", "grad_norm", "update_ratio", "param_norm")
"""Logged signals the training state acts on (compared with a correct-resume twin)."""
TWIN_POINTS = 10
TWIN_MEAN_SIGMAS = 3.0
TWIN_MAX_SIGMAS = 8.0
"""A fault SHOWS when, over the first ``TWIN_POINTS`` logged points after the resume, a logged signal differs
from the correct-resume twin's by ``TWIN_MEAN_SIGMAS`` of its own point-to-point noise on average, or by
``TWIN_MAX_SIGMAS`` at one point (our choice; the same test for every run of the kind, whatever its split)."""


def _logged_view(recs: list[dict[str, Any]], logged: list[int], metric: str) -> dict[int, float]:
    """What the logs hold for ``metric`` at each logged step (the loss as the mean over the interval).

    ``recs`` are one process's records; its first interval starts at its first record.
    """
    out: dict[int, float] = {}
    by = {r["step"]: r for r in recs}
    prev = recs[0]["step"] - 1 if recs else None
    for st in logged:
        if st not in by:
            continue
        if metric == "loss":
            window = [by[k]["loss"] for k in range(prev + 1 if prev is not None else st, st + 1) if k in by]
            out[st] = sum(window) / len(window)
        elif by[st].get(metric) is not None:
            out[st] = float(by[st][metric])
        prev = st
    return out


def _noise(vals: list[float]) -> float:
    """Robust point-to-point noise of log values (1.4826 MAD of first differences / sqrt 2), at least 1e-3."""
    lv = [math.log(v) for v in vals if v > 0 and math.isfinite(v)]
    d = [b - a for a, b in zip(lv, lv[1:], strict=False)]
    if len(d) < 5:
        return math.inf
    med = sorted(d)[len(d) // 2]
    mad = sorted(abs(x - med) for x in d)[len(d) // 2]
    return max(1.4826 * mad / math.sqrt(2), 1e-3)


def fault_vs_twin(spec: Spec, run: Run) -> dict[str, dict[str, float]]:
    """Per signal its writer logs: how far the run departs from a correct-resume twin after the resume.

    Returns ``{metric: {"mean_sigmas", "max_sigmas", "noise_log"}}``; the departure is |log(run / twin)| over the
    first ``TWIN_POINTS`` logged points of the resumed process, in units of the metric's point-to-point noise over
    the 30 logged points before the checkpoint.
    """
    from varied_writers import logged_keys

    c = run.events["checkpoint"]
    post_logged = [st for st in run.logged[run.logged_index:] if st > c][:TWIN_POINTS]
    if not post_logged:
        return {}
    twin = run.twin_after_resume(c, post_logged[-1])
    pre_logged = run.logged[:run.logged_index]
    out = {}
    for m in VISIBLE_METRICS:
        if m not in logged_keys(spec):
            continue
        pre = _logged_view(run.records[:run.resume_index], pre_logged, m)
        sig = _noise([v for k, v in sorted(pre.items()) if k <= c][-30:])
        a = _logged_view(run.records[run.resume_index:], post_logged, m)
        b = _logged_view(twin, post_logged, m)
        d = [abs(math.log(a[k] / b[k])) / sig for k in a if k in b and a[k] > 0 and b[k] > 0
             and math.isfinite(a[k] / b[k])]
        if d and math.isfinite(sig):
            out[m] = {"mean_sigmas": round(sum(d) / len(d), 2), "max_sigmas": round(max(d), 2),
                      "noise_log": round(sig, 4)}
    return out


def _window_resume(spec: Spec, run: Run, ev: dict[str, Any]) -> list[int]:
    """A resume fault: ``[c+1, first logged step after it]``; optimizer faults must show against a twin."""
    c = ev["checkpoint"]
    if spec.kind == "optimizer_not_restored":
        dep = fault_vs_twin(spec, run)
        ev["departure_from_twin"] = dep
        if not any(v["mean_sigmas"] >= TWIN_MEAN_SIGMAS or v["max_sigmas"] >= TWIN_MAX_SIGMAS for v in dep.values()):
            raise Dropped("optimizer fault did not show: no logged signal departs from the correct-resume twin "
                          "beyond its noise")
    return [c + 1, _logged_at(run, c + 1)]


def _logged_at(run: Run, step: int) -> int:
    """The first logged step at or after ``step`` (what a reader can see)."""
    return next((x for x in run.logged if x >= step), step)


def _window_spikes(spec: Spec, run: Run, ev: dict[str, Any]) -> list[int]:
    recs = run.records
    if spec.kind == "bad_batch_nan":
        nan = next((r["step"] for r in recs if not math.isfinite(r["loss"])), None)
        if nan is None:
            raise Dropped("no NaN loss")
        return [nan, nan]
    window = [spec.fault_step, _logged_at(run, spec.fault_step)]
    if spec.kind == "bad_batch_spike":
        pre = [r["loss"] for r in recs if spec.fault_step - 20 <= r["step"] < spec.fault_step]
        peak = max(r["loss"] for r in recs if spec.fault_step <= r["step"] < spec.fault_step + spec.fault_len)
        if not pre or peak < sum(pre) / len(pre) + 1.0:
            raise Dropped("spike too small")
        if ev.get("job_died"):
            raise Dropped("job died")
    else:  # recurring_spikes
        ev["spike_steps"] = [r["step"] for r in recs if r["bad"]]
        if len(ev["spike_steps"]) < 3:
            raise Dropped("fewer than 3 spikes")
    return window


def _window_lr_too_high(spec: Spec, run: Run, corpus, ev: dict[str, Any]) -> list[int]:
    twin = Run(spec, corpus, None, lr_mult=1.0 / spec.factor)
    twin.train()
    a = _mean20([r["loss"] for r in run.records])
    b = _mean20([r["loss"] for r in twin.records])
    n = min(len(a), len(b))
    good = None
    for i in range(n - 1, -1, -1):
        if not a[i] > b[i] + 0.1:
            break
        good = i + 1
    if good is None or (good > n - 10 and len(a) >= len(b)):
        raise Dropped("no lasting departure from the healthy twin")
    ev["loss_above_twin_for_good"] = good
    return [1, _logged_at(run, good)]


def _window_overflow(run: Run, ev: dict[str, Any]) -> list[int]:
    recs = run.records
    calib = 0
    for r in recs:  # calibration = the halvings of the first steps before a first good step
        if r.get("skipped_step"):
            calib = r["step"]
        else:
            break
    skip = next((r["step"] for r in recs if r.get("skipped_step") and r["step"] > calib), None)
    if skip is None:
        raise Dropped("no overflow")
    ev["first_skipped_step"] = skip
    if not ev.get("job_died") and math.isfinite(recs[-1]["loss"]) and recs[-1]["loss_scale"] > 1:
        raise Dropped("overflow skips but the run went on training")
    return [1, _logged_at(run, skip)]


def _check_healthy(run: Run, ev: dict[str, Any]) -> None:
    recs = run.records
    if ev.get("job_died") or not all(math.isfinite(r["loss"]) for r in recs):
        raise Dropped("healthy run did not train")
    ev["skipped_steps"] = sum(int(r.get("skipped_step", 0)) for r in recs)
    if recs[-1]["loss"] > recs[0]["loss"] - 0.5:
        raise Dropped("healthy run did not learn")


RESUME_KINDS = ("lr_reset", "weights_not_restored", "optimizer_not_restored", "sampler_replay", "grad_scaling_bug")


def label(spec: Spec, run: Run, corpus) -> dict[str, Any]:
    """The label of a finished run, from what was injected (and, for growth, a healthy twin).

    Raises:
        Dropped: the injected fault did not show (the run is not labelled).
    """
    verdict, cause, mech, alts, _ = KINDS[spec.kind]
    ev = dict(run.events)
    window = None
    if spec.kind in RESUME_KINDS:
        window = _window_resume(spec, run, ev)
    elif spec.kind in ("bad_batch_nan", "bad_batch_spike", "recurring_spikes"):
        window = _window_spikes(spec, run, ev)
    elif spec.kind == "lr_too_high":
        window = _window_lr_too_high(spec, run, corpus, ev)
    elif spec.kind == "fp16_overflow":
        window = _window_overflow(run, ev)
    elif spec.kind == "healthy":
        _check_healthy(run, ev)
    ev.pop("bad", None)
    return {"run": spec.name, "verdict": verdict, "cause": cause, "mechanism": mech, "acceptable_mechanisms": alts,
            "onset_window": window, "events": ev, "kind": spec.kind, "split": spec.split,
            "axes": {k: v for k, v in spec.__dict__.items() if k not in ("name",)}}
