"""The onset on the causal chain of the chosen cause, and the chain itself (DESIGN.md section 4).

:func:`onset`: the earliest step over all findings on the causal path of the chosen cause (its own findings,
growth before an overflow, a growth series departing before it (:mod:`forensics.growth_precursor`), fp16
back-offs that lead to the collapse without the scale growing back, a grad-norm departure just before; for
causes at a resume, the resume itself). :func:`chain` reports the chain as an ENG01 finding (step, signal,
size).
"""

from __future__ import annotations

import numpy as np

from forensics.engine import codes, keys
from forensics.engine.chain import AT_RESUME
from forensics.engine.evidence import Evidence, recovered
from forensics.engine.weights import WEIGHTS
from forensics.growth_precursor import growth_before
from forensics.model import Cause, Finding, RunData, Severity

W = WEIGHTS


def onset(ev: Evidence, cause: str, fallback: int | None) -> int | None:
    """The earliest step on the causal path of ``cause`` (``fallback`` when it has no strong finding)."""
    own = [f.step for f in ev.family(cause) if f.step is not None and f.confidence >= W.min_cause_conf]
    step = min(own) if own else fallback
    if step is None:
        return None
    if cause == Cause.OVERFLOW:  # overflow caused by growing updates: the growth's onset counts
        growth = [f.step for f in ev.family(Cause.UPDATE_SCALE_GROWTH)
                  if f.step is not None and f.confidence >= W.min_cause_conf and f.step < step]
        if growth:
            step = min(growth)
        # activations growing into the limit, before the overflow's first finding or the failure's first sign
        probes = {step} | ({ev.failure_step} if ev.failure_step is not None and ev.failure_step < step else set())
        grown = [g.onset_step for p in probes if (g := growth_before(ev.run, p, W.path_window, W.growth_lead))]
        if grown:
            step = min(step, *grown)
        step = skip_chain(ev.run, step)
    if cause in AT_RESUME:  # the fault is in the resume: nothing the earlier process did is on its chain
        return step
    for f in ev.get(codes.GRAD_NORM):  # a grad-norm departure just before leads the cause's first finding
        if f.step is not None and step - W.path_window <= f.step < step and (
                ev.failure_step is None or f.step <= ev.failure_step):
            step = f.step
    return step


def _scaler_steps(run: RunData, before: int) -> list[int]:
    """Steps of fp16 skips before ``before``, latest first.

    The skipped steps are read from what names them directly: ``skipped_step`` > 0 and non-finite grad norms
    (an overflowing step's unscaled gradients are inf or NaN). Only when neither shows a skip are they read
    from the loss-scale back-offs, at the step that logs the smaller scale: Megatron-LM, DeepSpeed ("Grad
    overflow on iteration N ... Reducing dynamic loss scale") and a ``GradScaler.get_scale()`` logged after
    ``update()`` all report the halving at the step that overflowed (a scale logged before ``update()`` shows
    it one step later, which the direct signals above correct when they are logged).
    """
    steps: list[int] = []
    sk = run.series("skipped_step")
    if sk is not None and len(sk):
        steps += sk.steps[np.nan_to_num(sk.values, nan=0.0) > 0].tolist()
    gn = run.series("grad_norm")
    if gn is not None and len(gn):
        steps += gn.steps[~np.isfinite(gn.values)].tolist()
    ls = run.series("loss_scale")
    if not steps and ls is not None and len(ls) > 1:
        v = ls.values
        down = np.flatnonzero((v[1:] < v[:-1]) & np.isfinite(v[1:]) & np.isfinite(v[:-1]))
        steps += ls.steps[down + 1].tolist()
    return sorted({int(x) for x in steps if x < before}, reverse=True)


def skip_chain(run: RunData, start: int, gap: int | None = None) -> int:
    """Walk an overflow's onset back over the fp16 skips that lead to it, each within ``gap`` steps of the next.

    A scaler back-off (or skipped step) shortly before a collapse is its first sign when the scale never grew
    back in between; growth probes the scaler recovered from, or hundreds of steps apart, are not chained.
    ``gap`` defaults to half the path window.
    """
    gap = W.path_window // 2 if gap is None else gap
    ls = run.series("loss_scale")
    cur = start
    for st in _scaler_steps(run, start):
        if cur - st > gap:
            break
        if ls is not None and len(ls) > 1:  # the scale grew back in between: a probe the scaler recovered from
            seg = ls.values[(ls.steps >= st) & (ls.steps <= cur)]
            seg = seg[np.isfinite(seg)]
            if seg.size > 1 and bool(np.any(np.diff(seg) > 0)):
                break
        cur = st
    return cur


def _size(f: Finding) -> str:
    for key, fmt_ in keys.SIZE_FORMATS:
        v = f.evidence.get(key)
        if isinstance(v, (int, float)) and np.isfinite(v):
            obs, exp = f.evidence.get("observed_lr"), f.evidence.get("expected_lr")
            if key == "relative_difference" and v >= keys.RATIO_AS_LRS and isinstance(obs, (int, float)) and \
                    isinstance(exp, (int, float)):  # against a schedule decayed to ~0 a percentage means nothing
                return f"lr {obs:.3g} where the schedule gives {exp:.3g}"
            return fmt_.format(v)
    return ""


def _on_chain(f: Finding, cause: str, start: int) -> bool:
    """A link: the cause's own strong finding, or a departure that did not recover (or is the onset itself).

    A non-finite value stays on the chain even when the series is finite again afterwards.
    """
    own = f.cause == cause and f.confidence >= W.min_cause_conf
    follow = f.code in codes.CHAIN_FOLLOWERS and (
        f.code == codes.NONFINITE or not recovered(f) or f.step == start)
    return own or follow


def chain(ev: Evidence, cause: str, start: int) -> Finding | None:
    """The causal chain from the onset to the failure: the chosen cause's findings and the departures after it.

    Each link is (step, signal, size). Departures that recovered before the next link are left out: the
    chain connects the onset to the failure without a recovery in between (DESIGN.md section 4).
    """
    end = ev.failure_step if ev.failure_step is not None else max(
        (f.step for f in ev.findings if f.step is not None), default=start)
    links = [{"step": int(f.step), "signal": codes.SIGNAL.get(f.code, f.name), "size": _size(f), "code": f.code}
             for f in ev.findings
             if f.step is not None and start <= f.step <= max(end, start) and f.code not in codes.NOT_ON_CHAIN
             and _on_chain(f, cause, start)]
    if not links:
        return None
    links = list({(x["step"], x["code"]): x for x in links}.values())[:W.chain_links]
    text = " -> ".join(f"step {x['step']} {x['signal']}" + (f" ({x['size']})" if x["size"] else "") for x in links)
    return Finding(code=codes.CAUSAL_CHAIN, name=codes.ENGINE_FINDINGS[codes.CAUSAL_CHAIN], cause=None,
                   mechanism=None, step=start, segment=None, confidence=1.0, severity=Severity.INFO,
                   message=f"causal chain of {cause}: {text}.",
                   evidence={"chain": links, "failure_step": ev.failure_step})


def segment_of(ev: Evidence, step: int) -> int:
    """The segment of ``step``: a finding's at that step, else the loss (or lr) point's at or after it."""
    seg = next((f.segment for f in ev.findings if f.step == step and f.segment is not None), None)
    if seg is not None:
        return int(seg)
    s = ev.run.series("loss") or ev.run.series("lr")
    if s is None or not len(s):
        return 0
    k = min(int(np.searchsorted(s.steps, step)), len(s) - 1)
    return int(s.segments[k])
