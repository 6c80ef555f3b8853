"""The engine: runs the detectors, picks verdict, cause and onset (STYLE.md item 5: detectors report, it decides).

The rules, each one function, in order (:func:`decide_timeline`):

1. :mod:`forensics.engine.rules`: per-family hypotheses, the notes, a slow or an early divergence.
2. :mod:`forensics.engine.chain`: families off the failure's causal chain are demoted.
3. :mod:`forensics.engine.choose`: lead-lag between strong families and the symptom/cause corrections.
4. :mod:`forensics.engine.onset`: the onset on the chosen cause's chain, and the chain (ENG01).
5. :func:`verdict`: ``anomaly`` when a cause is chosen or the run failed (cause ``unknown`` when nothing
   explains it); ``transient`` when every departure recovered by itself (recurring spikes are an anomaly);
   ``healthy`` otherwise.

Every number is a field of :class:`forensics.engine.weights.Weights`. :func:`decide` also analyses the attempts a
restart rolled back and calibrates the confidence (:mod:`forensics.calibration`).
"""

from __future__ import annotations

import dataclasses
import os
import traceback
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from forensics.coverage import rivals_checked
from forensics.detectors import DETECTORS, Detector
from forensics.engine import chain as chain_rules
from forensics.engine import codes, episodes, keys, onset, rules
from forensics.engine.choose import choose
from forensics.engine.evidence import Evidence, recovered
from forensics.engine.weights import WEIGHTS
from forensics.facts import RunFacts, run_facts
from forensics.model import Cause, Finding, Hypothesis, RunData, Severity, Skip, Verdict

W = WEIGHTS
RULES = (episodes.earlier_episodes, episodes.stall_not_led, rules.apply_notes, rules.slow_divergence,
         rules.early_divergence, episodes.no_learning, episodes.nonfinite_from_start,
         chain_rules.recovered_before, chain_rules.before_resume, chain_rules.off_chain)
"""The rules applied after :func:`forensics.engine.rules.family_hypotheses`, in order, before the choice."""


@dataclass(frozen=True)
class Decision:
    """What the engine concluded (the Analysis without sources and recovery).

    ``main_evidence``: the evidence of the chosen cause's most confident finding, plus
    ``growth_precursor`` when update growth precedes another cause (what the planner reads).
    ``facts``: the facts of the whole run (what the planner reads too).
    """

    verdict: Verdict
    cause: str | None
    mechanism: str | None
    confidence: float
    onset: dict[str, int] | None
    hypotheses: tuple[Hypothesis, ...]
    findings: tuple[Finding, ...]
    skipped: tuple[Skip, ...]
    failure_step: int | None
    main_evidence: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))
    facts: RunFacts | None = None
    coverage: dict[str, object] | None = None  # forensics.calibration.coverage: share evaluated, cap, note


POOL_ROWS = 1 << 21
"""Metric rows (2M) from which the facts and the detectors run on a thread pool (our choice). Most of their time
at that size is in numpy and polars calls on whole series, which release the GIL: at 1M steps x 50 metrics, about
3 s of one core. Smaller runs stay on the calling thread (a pool's hand-offs would cost more than they save)."""
POOL_THREADS = 2
"""Threads of that pool, at most (and at most the CPUs this process may use): the machine the goal is set on has 2."""


def run_detectors(run: RunData, detectors: tuple[Detector, ...] = DETECTORS,
                  facts: RunFacts | None = None) -> tuple[list[Finding], list[Skip]]:
    """Run every detector; a missing metric or a crashing detector becomes a Skip, never an error.

    ``facts`` (computed here when None) go to the detectors that declare ``uses_facts``. Findings and skips
    are in detector order, also when the detectors ran on a pool (:data:`POOL_ROWS`).
    """
    return detect_all(run, detectors, facts)[1:]  # type: ignore[return-value]


def detect_all(run: RunData, detectors: tuple[Detector, ...] = DETECTORS, facts: RunFacts | None = None,
               like: RunFacts | None = None) -> tuple[RunFacts, list[Finding], list[Skip]]:
    """(facts, findings, skips): :func:`forensics.facts.run_facts` (``like``) unless given, then every detector.

    From :data:`POOL_ROWS` rows on, on a pool of :data:`POOL_THREADS`: the facts first, the detectors that do not
    use them meanwhile; the run's cache builds each series once (:meth:`RunData.cached`).
    """
    workers = min(POOL_THREADS, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
    if run.metrics.height < POOL_ROWS or workers < 2:
        facts = facts or run_facts(run, like)
        outcomes = [_detect_one(det, run, facts) for det in detectors]
    else:
        with ThreadPoolExecutor(workers, thread_name_prefix="detectors") as pool:
            known: Future[RunFacts] = pool.submit(run_facts, run, like) if facts is None else Future()
            if facts is not None:
                known.set_result(facts)
            jobs = [pool.submit(_detect_one, det, run, known) for det in detectors]
            facts = known.result()
            outcomes = [j.result() for j in jobs]
    findings = [f for fs, _ in outcomes for f in fs]
    return facts, findings, [skip for _, skip in outcomes if skip is not None]


def _detect_one(det: Detector, run: RunData, facts: RunFacts | Future[RunFacts]) -> tuple[list[Finding], Skip | None]:
    """One detector's findings and its skip (``facts``: waited for only by a detector that uses them)."""
    args = (run, facts.result() if isinstance(facts, Future) else facts) if det.uses_facts else (run,)
    reason = det.missing(*args)
    if reason:
        return [], Skip(f"{det.code} {det.name}", f"not evaluated: {reason}")
    found: list[Finding] = []
    try:
        found.extend(det.detect(*args))  # type: ignore[call-arg]
    except Exception as exc:  # noqa: BLE001 - a crashing detector is a skip (STYLE.md item 7)
        where = traceback.extract_tb(exc.__traceback__)[-1]
        return found, Skip(f"{det.code} {det.name}",
                           f"detector failed: {type(exc).__name__}: {exc} ({where.filename}:{where.lineno})")
    return found, None


def main_evidence(cause: str | None, findings: tuple[Finding, ...]) -> Mapping[str, object]:
    """The evidence of the chosen cause's most confident finding, plus the growth that precedes it."""
    out: dict[str, object] = {}
    if not cause:
        return MappingProxyType(out)
    fs = [f for f in findings if f.cause == cause]
    if cause == Cause.UNKNOWN:  # only the engine's own unknown findings (NF02) carry evidence for the planner
        return MappingProxyType(dict(max(fs, key=lambda f: f.confidence).evidence) if fs else out)
    if fs:
        out = dict(max(fs, key=lambda f: f.confidence).evidence)
    growth = [f for f in findings if f.cause == Cause.UPDATE_SCALE_GROWTH and f.confidence >= W.min_cause_conf]
    if cause != Cause.UPDATE_SCALE_GROWTH and growth:
        out[keys.GROWTH_PRECURSOR] = {"code": growth[0].code, "mechanism": growth[0].mechanism,
                                      "step": growth[0].step}
    return MappingProxyType(out)


def decide(run: RunData, detectors: tuple[Detector, ...] = DETECTORS) -> Decision:
    """Decide on the whole run (:func:`decide_attempts`), with the confidence calibrated.

    The raw score of the chosen answer is mapped by :func:`forensics.calibration.calibrate` (a fit on the
    tuning part of the varied corpus, stored in ``forensics/calibration.json``) and capped by the coverage
    (``Decision.coverage``: the share of the diagnosis's rival causes a logged signal could check,
    :func:`forensics.coverage.rivals_checked`; skipped inputs; the cap).
    """
    from forensics.calibration import calibrate_decision  # noqa: PLC0415 - reads its JSON on first use

    d = decide_attempts(run, detectors)
    nonfinite = any(f.code == codes.NONFINITE for f in d.findings)
    rivals = rivals_checked(d.cause, run.has, nonfinite, d.facts.fp16 if d.facts is not None else None)
    from parsers.walk import OWN_OUTPUT  # noqa: PLC0415 - our own reports left out hold no training data

    lost = sum(1 for s in run.skipped if s.reason != OWN_OUTPUT)
    conf, cov = calibrate_decision(d.confidence, d.verdict, d.cause, d.skipped, [x.code for x in detectors],
                                   lost, rivals)
    return dataclasses.replace(d, confidence=conf, coverage=cov, main_evidence=main_evidence(d.cause, d.findings))


def _failed_attempts(views: list[tuple[int, Decision]]) -> list[tuple[int, Decision]]:
    """Rolled-back attempts that FAILED (or are strongly anomalous): a restart after a crash is no failure."""
    return [(k, d) for k, d in views if d.verdict == Verdict.ANOMALY and d.onset is not None
            and (d.failure_step is not None or d.confidence >= W.attempt_min_conf)]


def _attempts_note(views: list[tuple[int, Decision]], bad: list[tuple[int, Decision]], k0: int, best: Decision,
                   fail_steps: list[int]) -> Finding:
    return Finding(
        code=codes.FAILED_ATTEMPTS, name=codes.ENGINE_FINDINGS[codes.FAILED_ATTEMPTS], cause=None, mechanism=None,
        step=best.onset["step"], segment=k0, confidence=1.0, severity=Severity.INFO,  # type: ignore[index]
        message=f"{len(bad)} attempt(s) rolled back by a restart ended anomalously (segments "
        f"{', '.join(str(k) for k, _ in bad)}); the diagnosis is that of the earliest one, segment {k0}"
        + (f"; failures became visible at steps {', '.join(map(str, fail_steps))}" if fail_steps else "") + ".",
        evidence={"attempts": [{"segment": k, "verdict": d.verdict, "cause": d.cause,
                                "onset": d.onset, "failure_step": d.failure_step} for k, d in views]},
    )


def decide_attempts(run: RunData, detectors: tuple[Detector, ...] = DETECTORS) -> Decision:
    """Decide on the whole run, including attempts that a restart rolled back (raw confidence).

    The effective timeline hides a failed attempt once a restart re-logs its steps, so every
    rolled-back segment is also analysed as the run stood when it ended; the earliest anomalous
    attempt wins when the final timeline does not show an earlier onset. Failures that recur
    across attempts at different steps argue against a single bad batch.
    """
    full = decide_timeline(run, detectors)
    attempts = run.rolled_back_segments()[:W.max_attempts]
    if not attempts:
        return full
    views = [(k, decide_timeline(run.view(k), detectors, like=full.facts)) for k in attempts]
    bad = _failed_attempts(views)
    if not bad:
        return full
    k0, best = min(bad, key=lambda kd: kd[1].onset["step"])  # type: ignore[index]
    if full.verdict == Verdict.ANOMALY and full.onset is not None and full.onset["step"] <= best.onset["step"]:  # type: ignore[index]
        return full
    fail_steps = sorted({d.failure_step if d.failure_step is not None
                         else max((f.step for f in d.findings if f.step is not None), default=0) for _, d in bad})
    hyps = list(best.hypotheses)
    if len(fail_steps) >= 2:
        why = (f"failures recur at different steps ({', '.join(map(str, fail_steps))}) "
               "after restarts from the same point: not one bad batch")
        hyps = [Hypothesis(h.cause, h.mechanism, h.confidence * W.recurring_failure, h.support, h.against + (why,))
                if h.cause == Cause.DATA_BATCH else h for h in hyps]
    note = _attempts_note(views, bad, k0, best, fail_steps)
    return Decision(best.verdict, best.cause, best.mechanism, best.confidence, best.onset, tuple(hyps),
                    (note, *best.findings), tuple(dict.fromkeys(best.skipped + full.skipped)), best.failure_step,
                    facts=full.facts)


@dataclass(frozen=True)
class _Answer:
    verdict: Verdict
    cause: str | None
    mechanism: str | None
    confidence: float
    onset: int | None
    hyps: tuple[Hypothesis, ...]


def _transient_or_recurring(ev: Evidence, start: int | None) -> tuple[Verdict, int | None]:
    """A recovered "bad batch" is ``transient``; spikes that keep coming back (every few dozen steps) are a fault.

    A few spikes hundreds of steps apart in a long healthy run stay transient.
    """
    if ev.failed or not all(recovered(f) for f in ev.family(Cause.DATA_BATCH)):
        return Verdict.ANOMALY, start
    back = [f for f in ev.get(codes.LOSS_SPIKE) if recovered(f)]
    gaps = np.diff(sorted(f.step for f in back if f.step is not None))
    if len(back) >= W.recurring_spikes and gaps.size and float(np.median(gaps)) <= W.path_window:
        return Verdict.ANOMALY, min([start] + [f.step for f in back if f.step is not None])  # type: ignore[type-var]
    return Verdict.TRANSIENT, start


def verdict(ev: Evidence, chosen: Hypothesis | None, hyps: list[Hypothesis]) -> _Answer:
    """Rule 5: verdict, cause, mechanism, raw confidence and onset step from the chosen hypothesis."""
    spikes = ev.get(codes.LOSS_SPIKE)
    if chosen is not None:
        start = onset.onset(ev, chosen.cause, ev.failure_step)
        v = Verdict.ANOMALY
        if chosen.cause == Cause.DATA_BATCH:
            v, start = _transient_or_recurring(ev, start)
        return _Answer(v, chosen.cause, chosen.mechanism, chosen.confidence, start, tuple(hyps))
    if ev.failed:
        start = min((f.step for f in ev.findings if f.code in codes.FAILURE_PRECURSORS and f.step is not None
                     and not episodes.episode(ev, f)), default=ev.failure_step)
        why = Hypothesis(Cause.UNKNOWN, None, W.unexplained_failure,
                         ("the run failed (non-finite or diverging loss) but no detector names a cause",), ())
        return _Answer(Verdict.ANOMALY, Cause.UNKNOWN, None, W.unexplained_failure, start, (why, *hyps))
    if spikes:
        start = min(f.step for f in spikes if f.step is not None)
        return _Answer(Verdict.TRANSIENT, Cause.UNKNOWN, None, W.unexplained_spike, start, tuple(hyps))
    return _Answer(Verdict.HEALTHY, None, None, 1.0 - max((h.confidence for h in hyps), default=0.0), None,
                   tuple(hyps))


def decide_timeline(run: RunData, detectors: tuple[Detector, ...] = DETECTORS,
                    like: RunFacts | None = None) -> Decision:
    """Run the detectors on the effective timeline of ``run`` and decide verdict, cause, onset.

    ``like``: the facts of the whole run when ``run`` is a view of one attempt.
    """
    facts, findings, skipped = detect_all(run, detectors, like=like)
    ev = Evidence.build(run, facts, findings)
    hyps = rules.family_hypotheses(ev)
    for rule in RULES:
        ev, hyps = rule(ev, hyps)
    ev, chosen, hyps = choose(ev, hyps)
    hyps.sort(key=lambda h: (h is not chosen, -h.confidence))
    a = verdict(ev, chosen, hyps)
    if a.onset is not None and a.cause is not None:
        link = onset.chain(ev, a.cause, int(a.onset))
        if link is not None:
            ev = ev.with_findings(link)
    at = {"step": int(a.onset), "segment": onset.segment_of(ev, a.onset)} if a.onset is not None else None
    return Decision(a.verdict, a.cause, a.mechanism, float(a.confidence), at, a.hyps, ev.findings,
                    tuple(skipped), ev.failure_step, facts=facts)
