"""The engine: runs the detectors, picks the onset and the cause, asks for a recovery plan.

Detectors report; the engine decides (STYLE.md item 5). The rules, each one function:

1. ``_family_hypotheses``: cause findings are grouped per family; a family's score is the
   noisy-OR of its findings' confidences, lowered by evidence against it (a precursor before a
   "bad batch", a spike that recovered by itself).
2. ``_apply_notes``: remedies the run folder's notes say already failed halve the cause they address.
3. ``_slow_divergence``: a loss that turns and keeps rising with no other explanation is update
   growth (docs/detectors.md#dv01).
4. ``_choose``: lead-lag between strong families (the earliest explains the later ones), with
   the symptom/cause corrections of DESIGN.md section 4: fp16 evidence makes growth an
   ``overflow``; a loss-scale collapse that follows a grad-norm departure is update growth; a
   deliberate lr change is no fault; growth after an lr reset is its consequence; "lr too high"
   is dropped when the notes say lower lrs failed.
5. ``_onset``: the earliest step over all findings on the causal path of the chosen cause (its
   own findings, growth before an overflow, fp16 back-offs that lead to the collapse without the scale
   growing back, a grad-norm departure just before; for causes at a resume, the resume itself).
   ``_off_chain``: a family whose departures all recovered long before the failure is not on its chain.
   ``_chain`` reports the chain as an ENG01 finding (step, signal, size).

Recurring recovered spikes (``RECURRING_SPIKES``) are an anomaly, not ``transient``. The confidence of
the chosen answer is calibrated by :mod:`forensics.calibration` (fitted offline on the tuning part of the
varied corpus).

Verdict: ``anomaly`` when a cause is chosen or the run failed (NaN for good, divergence,
unrecovered spike, no progress: cause ``unknown`` when nothing explains it); ``transient`` when
every departure recovered by itself; ``healthy`` otherwise. :func:`decide` also analyses the
attempts a restart rolled back.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass

import numpy as np

from forensics.detectors import DETECTORS, Detector
from forensics.detectors.spike_shape import confined_to_batch
from forensics.model import Finding, Hypothesis, RunData, Skip

MIN_CAUSE_CONF = 0.5
"""A finding argues for its cause only at or above this confidence."""
PATH_WINDOW = 128
"""Departures this many steps before a cause's first finding still count as its onset."""

AT_RESUME = ("lr_schedule_reset", "state_not_restored")
"""Causes located at a resume: their onset is the resumed process's first step, not an earlier wobble."""

_PRECURSORS = ("GN01", "SP01", "DV01", "NF01", "ST01")


@dataclass(frozen=True)
class Decision:
    """What the engine concluded (the Analysis without sources and recovery)."""

    verdict: str
    cause: str | None
    mechanism: str | None
    confidence: float
    onset: dict[str, int] | None
    hypotheses: tuple[Hypothesis, ...]
    findings: tuple[Finding, ...]
    skipped: tuple[Skip, ...]
    failure_step: int | None
    coverage: dict[str, object] | None = None  # forensics.calibration.coverage: share evaluated, cap, note


def run_detectors(run: RunData, detectors: tuple[Detector, ...] = DETECTORS) -> tuple[list[Finding], list[Skip]]:
    """Run every detector; a missing metric or a crashing detector becomes a Skip, never an error."""
    findings: list[Finding] = []
    skipped: list[Skip] = []
    for det in detectors:
        reason = det.missing(run)
        if reason:
            skipped.append(Skip(f"{det.code} {det.name}", f"not evaluated: {reason}"))
            continue
        try:
            findings.extend(det.detect(run))
        except Exception as exc:  # noqa: BLE001 - a crashing detector is a skip (STYLE.md item 7)
            where = traceback.extract_tb(exc.__traceback__)[-1]
            skipped.append(Skip(f"{det.code} {det.name}",
                                f"detector failed: {type(exc).__name__}: {exc} ({where.filename}:{where.lineno})"))
    return findings, skipped


def _addresses(sentence: str, cause: str) -> bool:
    from forensics.detectors.notes import ADDRESSES

    return any(k.replace("_", " ") in sentence and v == cause for k, v in ADDRESSES.items())


def _noisy_or(confs: list[float]) -> float:
    p = 1.0
    for c in confs:
        p *= 1.0 - max(0.0, min(1.0, c))
    return 1.0 - p


RECURRING_SPIKES = 3
"""Recovered loss spikes from which a run is no longer ``transient``: recurring spikes are a fault. Our choice."""

ATTEMPT_MIN_CONF = 0.65
"""A rolled-back attempt that did not fail outranks the whole run only with at least this (raw) confidence."""

MAX_ATTEMPTS = 6
"""Rolled-back attempts analysed on their own (the earliest ones)."""


def decide(run: RunData, detectors: tuple[Detector, ...] = DETECTORS) -> Decision:
    """Decide on the whole run (:func:`decide_attempts`), with the confidence calibrated.

    The raw score of the chosen answer is mapped by :func:`forensics.calibration.calibrate` (a fit on the
    tuning part of the varied corpus, stored in ``forensics/calibration.json``) and capped by the coverage
    (``Decision.coverage``: the share of log detectors evaluated, skipped inputs, the cap).
    """
    import dataclasses

    from forensics.calibration import calibrate_decision

    d = decide_attempts(run, detectors)
    conf, cov = calibrate_decision(d.confidence, d.verdict, d.cause, d.skipped, [x.code for x in detectors],
                                   len(run.skipped))
    return dataclasses.replace(d, confidence=conf, coverage=cov)


def decide_attempts(run: RunData, detectors: tuple[Detector, ...] = DETECTORS) -> Decision:
    """Decide on the whole run, including attempts that a restart rolled back (raw confidence).

    The effective timeline hides a failed attempt once a restart re-logs its steps, so every
    rolled-back segment is also analysed as the run stood when it ended; the earliest anomalous
    attempt wins when the final timeline does not show an earlier onset. Failures that recur
    across attempts at different steps argue against a single bad batch.
    """
    full = decide_timeline(run, detectors)
    attempts = run.rolled_back_segments()[:MAX_ATTEMPTS]
    if not attempts:
        return full
    views = [(k, decide_timeline(run.view(k), detectors)) for k in attempts]
    # an attempt the effective timeline hides matters when it FAILED (a restart after a crash or a planned
    # stop is not a failure; a weak drift in it does not outrank the run as a whole)
    bad = [(k, d) for k, d in views if d.verdict == "anomaly" and d.onset is not None
           and (d.failure_step is not None or d.confidence >= ATTEMPT_MIN_CONF)]
    if not bad:
        return full
    k0, best = min(bad, key=lambda kd: kd[1].onset["step"])  # type: ignore[index]
    if full.verdict == "anomaly" and full.onset is not None and full.onset["step"] <= best.onset["step"]:  # type: ignore[index]
        return full
    fail_steps = sorted({d.failure_step if d.failure_step is not None
                         else max((f.step for f in d.findings if f.step is not None), default=0) for _, d in bad})
    note = Finding(
        code="INT02", name="integrity.failed_attempts", cause=None, mechanism=None, step=best.onset["step"],  # type: ignore[index]
        segment=k0, confidence=1.0, severity="info",
        message=f"{len(bad)} attempt(s) rolled back by a restart ended anomalously (segments "
        f"{', '.join(str(k) for k, _ in bad)}); the diagnosis is that of the earliest one, segment {k0}"
        + (f"; failures became visible at steps {', '.join(map(str, fail_steps))}" if fail_steps else "") + ".",
        evidence={"attempts": [{"segment": k, "verdict": d.verdict, "cause": d.cause,
                                "onset": d.onset, "failure_step": d.failure_step} for k, d in views]},
    )
    hyps = list(best.hypotheses)
    if len(fail_steps) >= 2:
        hyps = [Hypothesis(h.cause, h.mechanism, h.confidence * 0.4, h.support,
                           h.against + (f"failures recur at different steps ({', '.join(map(str, fail_steps))}) "
                                        "after restarts from the same point: not one bad batch",))
                if h.cause == "data_batch" else h for h in hyps]
    return Decision(best.verdict, best.cause, best.mechanism, best.confidence, best.onset, tuple(hyps),
                    (note, *best.findings), tuple(dict.fromkeys(best.skipped + full.skipped)), best.failure_step)


@dataclass
class _Evidence:
    """The findings of one timeline, indexed the way the rules need them."""

    run: RunData
    findings: list[Finding]
    by_code: dict[str, list[Finding]]
    families: dict[str, list[Finding]]
    failed: bool
    failure_step: int | None

    @classmethod
    def build(cls, run: RunData, findings: list[Finding]) -> _Evidence:
        findings.sort(key=lambda f: (f.step if f.step is not None else 1 << 62, f.code))
        by_code: dict[str, list[Finding]] = {}
        for f in findings:
            by_code.setdefault(f.code, []).append(f)
        nf = [f for f in by_code.get("NF01", []) if not f.evidence.get("recovered")]
        unrecovered = [f for f in by_code.get("SP01", []) if f.evidence.get("recovered_step") is None]
        marks = [f.step for f in nf + by_code.get("DV01", []) + unrecovered if f.step is not None]
        families: dict[str, list[Finding]] = {}
        for f in findings:
            if f.cause and f.cause != "unknown":
                families.setdefault(f.cause, []).append(f)
        failed = bool(nf or by_code.get("DV01") or unrecovered or by_code.get("ST01"))
        return cls(run, findings, by_code, families, failed, min(marks) if marks else None)

    def get(self, code: str) -> list[Finding]:
        return self.by_code.get(code, [])

    def first_step(self, family: str) -> int:
        """Earliest step of a family's strong findings (a large number when it has none)."""
        return min((f.step for f in self.families.get(family, [])
                    if f.step is not None and f.confidence >= MIN_CAUSE_CONF), default=1 << 62)


def _family_hypotheses(ev: _Evidence) -> list[Hypothesis]:
    """Rule 1: one hypothesis per cause family, noisy-OR of its findings, minus evidence against it."""
    hyps: list[Hypothesis] = []
    cause_f = [f for fs in ev.families.values() for f in fs]
    for fam, fs in ev.families.items():
        score = _noisy_or([f.confidence for f in fs])
        against = [a for f in fs for a in f.against]
        first = min((f.step for f in fs if f.step is not None), default=None)
        if fam == "data_batch":
            if all(f.evidence.get("recovered_step") is not None for f in fs) and not ev.failed:
                # a spike that recovered by itself: the verdict is transient, the cause still named (DESIGN.md)
                # when the grad norm rules out a precursor; without it the cause stays open
                # (or when the loss is back within a few steps: high on its batch only, spike_shape.py)
                if any(f.evidence.get("grad_norm_logged") is False for f in fs) and not all(
                        confined_to_batch(f) for f in fs):
                    score *= 0.6
                against.append("every spike recovered by itself")
            earlier = [f for f in cause_f + ev.get("DV01")
                       if (f.cause in ("update_scale_growth", "overflow") or f.code == "DV01")
                       and f.confidence >= MIN_CAUSE_CONF and f.step is not None and first is not None
                       and f.step < first
                       # a departure that recovered long before the spike is not its precursor
                       and not (f.evidence.get("recovered_step") is not None and first - f.step > PATH_WINDOW)]
            if earlier:
                score *= 0.4
                what = earlier[0].cause or earlier[0].name
                against.append(f"{earlier[0].code} ({what}) departs earlier, at step {earlier[0].step}: "
                               "the spike has a precursor")
        if not any(f.confidence >= MIN_CAUSE_CONF for f in fs):
            score = min(score, MIN_CAUSE_CONF - 0.01)
        mech = max(fs, key=lambda f: f.confidence).mechanism
        support = tuple(f"{f.code} step {f.step}: {f.message}" for f in fs)[:6]
        hyps.append(Hypothesis(fam, mech, score, support, tuple(dict.fromkeys(against))))
    return hyps


def _apply_notes(ev: _Evidence, hyps: list[Hypothesis]) -> list[Hypothesis]:
    """Rule 2: remedies the run's notes say were tried and failed argue against the cause they address."""
    for note in ev.get("NT01"):
        bad = set(note.evidence.get("argues_against", []))
        hyps = [Hypothesis(h.cause, h.mechanism, h.confidence * 0.5, h.support,
                           h.against + tuple(a for a in note.against if _addresses(a, h.cause)))
                if h.cause in bad else h for h in hyps]
    return hyps


EARLY_STEPS = 30
"""A run that fails within this many steps of its first logged step diverged at the start. Our choice."""


def _early_divergence(ev: _Evidence, hyps: list[Hypothesis]) -> list[Hypothesis]:
    """A run that blows up within its first steps, the loss rising before it turns non-finite, took steps too large.

    Applies only when no family explains the failure: the finite loss rises above its first logged value
    before the failure (not an abrupt NaN from a normal loss, which a bad batch gives), within
    :data:`EARLY_STEPS` steps of the start.
    """
    if not ev.failed or ev.failure_step is None or any(h.confidence >= MIN_CAUSE_CONF for h in hyps):
        return hyps
    s = ev.run.series("loss")
    if s is None or len(s) < 2:
        return hyps
    first = int(s.steps[0])
    if ev.failure_step - first > EARLY_STEPS:
        return hyps
    fin = np.isfinite(s.values) & (s.steps <= ev.failure_step)
    v = s.values[fin]
    if v.size < 2 or float(np.max(v[1:])) <= float(v[0]):
        return hyps
    k = int(np.flatnonzero(fin)[int(np.argmax(v[1:])) + 1])
    rise_from = int(s.steps[max(0, int(np.flatnonzero(fin)[int(np.argmin(v[:max(1, k)]))]))])
    onset = min(ev.failure_step, rise_from + 1)
    f = Finding("DV02", "loss.early_divergence", "update_scale_growth", "lr_too_high", onset, 0, 0.55, "high",
                f"the loss rises from {v[0]:.4g} to {float(np.max(v[1:])):.4g} and the run fails at step "
                f"{ev.failure_step}, {ev.failure_step - first} steps after its first logged step: updates too large "
                "for the model from the start (peak lr)", {"failure_step": ev.failure_step, "first_step": first,
                                                          "onset_step": onset})
    ev.families.setdefault("update_scale_growth", []).append(f)
    ev.findings.append(f)
    return hyps + [Hypothesis("update_scale_growth", "lr_too_high", 0.55, (f"{f.code} step {onset}: {f.message}",),
                              ("no grad-norm or update series confirms it",))]


def _slow_divergence(ev: _Evidence, hyps: list[Hypothesis]) -> list[Hypothesis]:
    """Rule 3: a divergence no family explains is updates too large for the model (docs/detectors.md#dv01)."""
    dv = ev.get("DV01")
    if not dv or any(h.confidence >= MIN_CAUSE_CONF for h in hyps):
        return hyps
    cfg = repr(ev.run.meta.get("config_files", {})).lower()
    adapter = "adapter_config" in cfg or "lora" in cfg
    d = dv[0]
    ev.families.setdefault("update_scale_growth", []).append(
        Finding(d.code, d.name, "update_scale_growth", None, d.step, d.segment, 0.55, d.severity, d.message,
                d.evidence))
    return [h for h in hyps if h.cause != "update_scale_growth"] + [Hypothesis(
        "update_scale_growth", "adapter_scale" if adapter else "lr_too_high", 0.55,
        (f"{d.code} step {d.step}: {d.message}",
         "the loss turns and keeps rising without a spike: the slow-divergence signature of updates too "
         "large for the model (docs/detectors.md#dv01; BigScience 104B 'non-spike diverging')")
        + (("a LoRA adapter is trained: its effective step scales with alpha/rank",) if adapter else ()),
        ("no grad-norm, update-ratio or attention-logit series confirms the growth",),
    )]


def _demoted(h: Hypothesis, why: str) -> Hypothesis:
    """``h`` lowered just below :data:`MIN_CAUSE_CONF` (it no longer names the cause), ``why`` added against it."""
    return Hypothesis(h.cause, h.mechanism, min(h.confidence, MIN_CAUSE_CONF - 0.05), h.support, h.against + (why,))


def _off_chain(ev: _Evidence, hyps: list[Hypothesis]) -> list[Hypothesis]:
    """A family whose every departure recovered long before the failure is not on the failure's causal chain.

    When the run failed at step F and another strong family has a finding within :data:`PATH_WINDOW` steps
    before F, a family whose findings all carry a ``recovered_step`` and lie more than PATH_WINDOW steps before
    F is demoted below :data:`MIN_CAUSE_CONF`, with that as evidence against it.
    """
    hyps = _recovered_before(ev, hyps)
    hyps = _before_resume(ev, hyps)
    fail = ev.failure_step
    if not ev.failed or fail is None:
        return hyps
    near = {c for c, fs in ev.families.items()
            if any(f.step is not None and fail - PATH_WINDOW <= f.step <= fail and f.confidence >= MIN_CAUSE_CONF
                   for f in fs)}
    out = []
    for h in hyps:
        fs = ev.families.get(h.cause, [])
        done = [f.evidence.get("recovered_step") for f in fs]
        if (near - {h.cause} and fs and all(r is not None and r < fail for r in done)
                and all(f.step is not None and f.step < fail - PATH_WINDOW for f in fs)):
            h = _demoted(h, f"its departure recovered by step {max(done)}, long before the failure at "
                                        f"step {fail}: not on the failure's causal chain")
        out.append(h)
    return out


def _before_resume(ev: _Evidence, hyps: list[Hypothesis]) -> list[Hypothesis]:
    """A fault at a resume (state or schedule not restored) is not led by a drift of the earlier process.

    When a strong :data:`AT_RESUME` family's first finding is at the first step of a resumed process, and the
    run did not fail before it, families whose findings all lie before that resume are demoted: the earlier
    process ended without failing, so its drift did not cause what the resume broke.
    """
    res = [(ev.first_step(h.cause), h.cause) for h in hyps
           if h.cause in AT_RESUME and h.confidence >= MIN_CAUSE_CONF and h.mechanism != "intentional_change"]
    res = [(s, c) for s, c in res if s < 1 << 62 and any(
        f.code in ("RS01", "LR01") and f.step == s and (f.segment or 0) > 0 for f in ev.families.get(c, []))]
    if not res:
        return hyps
    s, c = min(res)
    if ev.failure_step is not None and ev.failure_step < s:
        return hyps
    out = []
    for h in hyps:
        fs = [f for f in ev.families.get(h.cause, []) if f.step is not None]
        if h.cause not in AT_RESUME and fs and all(f.step < s for f in fs) and h.confidence >= MIN_CAUSE_CONF:
            h = _demoted(h, f"it lies in the process before the resume at step {s}, which ended without "
                                        f"failing: it does not lead the {c} at that resume")
        out.append(h)
    return out


def _recovered_before(ev: _Evidence, hyps: list[Hypothesis]) -> list[Hypothesis]:
    """A family whose departures all recovered before another strong family's first finding does not lead it.

    Lead-lag (the earliest explains the later ones) holds along a chain; a blip the run recovered from is
    not the cause of what starts after the recovery (e.g. a warm-up spike before an lr reset at a resume).
    """
    strong = {h.cause: ev.first_step(h.cause) for h in hyps if h.confidence >= MIN_CAUSE_CONF}
    out = []
    for h in hyps:
        fs = [f for f in ev.families.get(h.cause, []) if f.confidence >= MIN_CAUSE_CONF]
        rec = [f.evidence.get("recovered_step") for f in fs]
        if fs and h.confidence >= MIN_CAUSE_CONF and all(r is not None for r in rec):
            later = [(s, c) for c, s in strong.items() if c != h.cause and s > max(rec)]
            if later:
                s, c = min(later)
                h = _demoted(h, f"its departure recovered by step {max(rec)}, before the {c} finding at "
                                            f"step {s}: it does not lead it")
        out.append(h)
    return out


def _choose(ev: _Evidence, hyps: list[Hypothesis]) -> tuple[Hypothesis | None, list[Hypothesis]]:
    """Rule 4: lead-lag between strong families, with the symptom/cause corrections of DESIGN.md section 4."""
    hyps = _off_chain(ev, hyps)
    strong = sorted((h for h in hyps if h.confidence >= MIN_CAUSE_CONF),
                    key=lambda h: (ev.first_step(h.cause), -h.confidence))
    if not strong:
        return None, hyps
    chosen: Hypothesis | None = strong[0]
    fams = {h.cause for h in strong}
    # fp16 evidence distinguishes an overflow from plain update growth (docs/tiny-runs.md#overflow)
    if "overflow" in fams and chosen.cause == "update_scale_growth":
        chosen = next(h for h in strong if h.cause == "overflow")
    # a loss-scale collapse after a grad-norm departure is a symptom of growing updates
    if chosen.cause == "overflow" and chosen.mechanism == "loss_scale_collapse":
        ov_step = ev.first_step("overflow")
        pre = [f for f in ev.findings if f.code in ("GN01", "UP01", "AT01") and f.step is not None
               and f.step < ov_step and f.confidence >= MIN_CAUSE_CONF
               and not f.evidence.get("nonfinite")]  # an inf grad norm on a skipped step is the overflow
        if pre:
            g = pre[0]
            growth = Hypothesis("update_scale_growth", "lr_too_high", 0.7,
                                (f"{g.code} step {g.step}: {g.message}",
                                 f"the loss scale collapses only later, from step {ov_step}"), ())
            demoted = Hypothesis(chosen.cause, chosen.mechanism, min(chosen.confidence, 0.45), chosen.support,
                                 chosen.against + (f"the collapse follows a {g.name} departure at step {g.step}: "
                                                   "overflow is the symptom, growing updates the cause",))
            hyps = [demoted if h is chosen else h for h in hyps if h.cause != "update_scale_growth"] + [growth]
            ev.families.setdefault("update_scale_growth", []).append(g)
            chosen, strong = growth, [growth]
    # a deliberate lr change is never the chosen fault
    if chosen.cause == "lr_schedule_reset" and chosen.mechanism == "intentional_change":
        rest = [h for h in strong if h is not chosen]
        chosen = rest[0] if rest else None
    # a "bad batch" that growth precedes is the growth's spike
    if chosen is not None and chosen.cause == "data_batch" and len(strong) > 1:
        growth_h = [h for h in strong if h.cause in ("update_scale_growth", "overflow")
                    and ev.first_step(h.cause) < ev.first_step("data_batch")]
        if growth_h:
            chosen = growth_h[0]
    # growth that starts after an lr reset is its consequence, not a second cause
    if chosen is not None and chosen.cause == "lr_schedule_reset":
        lr_step = ev.first_step("lr_schedule_reset")
        hyps = [Hypothesis(h.cause, h.mechanism, min(h.confidence, 0.4), h.support,
                           h.against + (f"starts after the lr discontinuity at step {lr_step}: a consequence of "
                                        "the larger lr",))
                if h.cause == "update_scale_growth" and ev.first_step(h.cause) > lr_step else h for h in hyps]
        chosen = next(h for h in hyps if h.cause == "lr_schedule_reset")
    # lower learning rates already tried and failed (notes): "lr too high" is not an explanation
    failed_lr = any("lower_lr" in f.evidence.get("failed_remedies", {}) for f in ev.get("NT01"))
    if chosen is not None and chosen.cause == "update_scale_growth" and chosen.mechanism == "lr_too_high" \
            and failed_lr:
        ideas = {k for f in ev.get("NT01") for k in f.evidence.get("ideas", {})}
        demoted = Hypothesis(chosen.cause, chosen.mechanism, min(chosen.confidence, 0.45), chosen.support,
                             chosen.against + ("the notes record lower learning rates that failed the same way",))
        unknown = Hypothesis("unknown", "init_scale" if "init_std" in ideas else None, 0.5,
                             ("the run diverges like an update-scale problem, yet lower lrs did not fix it",)
                             + (("the notes point to the initialisation scale as the open lead",)
                                if "init_std" in ideas else ()), ())
        hyps = [demoted if h is chosen else h for h in hyps] + [unknown]
        ev.families.setdefault("unknown", list(ev.families.get("update_scale_growth", [])))
        chosen = unknown
    return chosen, hyps


def _onset(ev: _Evidence, cause: str, fallback: int | None) -> int | None:
    """Rule 5: the earliest step on the causal path of the chosen cause."""
    own = [f.step for f in ev.families.get(cause, []) if f.step is not None and f.confidence >= MIN_CAUSE_CONF]
    onset = min(own) if own else fallback
    if onset is None:
        return None
    if cause == "overflow":  # overflow caused by growing updates: the growth's onset counts
        growth = [f.step for f in ev.families.get("update_scale_growth", [])
                  if f.step is not None and f.confidence >= MIN_CAUSE_CONF and f.step < onset]
        if growth:
            onset = min(growth)
        onset = _skip_chain(ev.run, onset)
    if cause in AT_RESUME:  # the fault is in the resume: nothing the earlier process did is on its chain
        return onset
    for f in ev.get("GN01"):  # a grad-norm departure just before leads the cause's first finding
        if f.step is not None and onset - PATH_WINDOW <= f.step < onset and (
                ev.failure_step is None or f.step <= ev.failure_step):
            onset = f.step
    return onset


_SIGNAL = {"GN01": "grad_norm", "SP01": "loss", "NF01": "non-finite value", "DV01": "loss", "DB01": "loss",
           "WU01": "loss", "LR01": "lr", "RS01": "loss at the resume", "OV01": "loss_scale", "OV02": "activation",
           "UP01": "update_ratio", "PR01": "precursor", "AT01": "attn_logit_max", "HW01": "throughput",
           "DO01": "loss level", "GS01": "loss / eval_loss"}


def _size(f: Finding) -> str:
    e = f.evidence
    for key, fmt_ in (("z", "z={:.1f}"), ("relative_difference", "{:+.0%} vs schedule"),
                      ("relative_change", "{:+.1%}"), ("train_over_eval_loss", "x{:.2f}"), ("shift", "+{:.3g}"),
                      ("halvings", "{:.0f} halvings"), ("value", "{:.4g}"), ("loss_after", "{:.4g}")):
        v = e.get(key)
        if isinstance(v, (int, float)) and np.isfinite(v):
            return fmt_.format(v)
    return ""


def _chain(ev: _Evidence, cause: str, onset: int) -> Finding | None:
    """The causal chain from the onset to the failure: the chosen cause's findings and the departures after it.

    Each link is (step, signal, size). Departures that recovered before the next link are left out: the
    chain connects the onset to the failure without a recovery in between (DESIGN.md section 4).
    """
    end = ev.failure_step if ev.failure_step is not None else max(
        (f.step for f in ev.findings if f.step is not None), default=onset)
    links = []
    for f in ev.findings:
        if f.step is None or not onset <= f.step <= max(end, onset) or f.code in ("INT01", "INT02", "NT01"):
            continue
        own = f.cause == cause and f.confidence >= MIN_CAUSE_CONF
        follow = f.code in ("GN01", "SP01", "NF01", "DV01") and (
            f.evidence.get("recovered_step") is None or f.step == onset)
        if own or follow:
            links.append({"step": int(f.step), "signal": _SIGNAL.get(f.code, f.name), "size": _size(f),
                          "code": f.code})
    if not links:
        return None
    links = list({(x["step"], x["code"]): x for x in links}.values())[:8]
    text = " -> ".join(f"step {x['step']} {x['signal']}" + (f" ({x['size']})" if x["size"] else "") for x in links)
    return Finding(code="ENG01", name="engine.causal_chain", cause=None, mechanism=None, step=onset, segment=None,
                   confidence=1.0, severity="info", message=f"causal chain of {cause}: {text}.",
                   evidence={"chain": links, "failure_step": ev.failure_step})


def _skip_chain(run: RunData, onset: int, gap: int = PATH_WINDOW // 2) -> int:
    """Walk an overflow's onset back over the fp16 skips that lead to it, each within ``gap`` steps of the next.

    A scaler back-off (or skipped step) shortly before a collapse is its first sign when the scale never grew
    back in between; growth probes the scaler recovered from, or hundreds of steps apart, are not chained.
    """
    steps: list[int] = []
    sk = run.series("skipped_step")
    if sk is not None and len(sk):
        steps += sk.steps[np.nan_to_num(sk.values, nan=0.0) > 0].tolist()
    ls = run.series("loss_scale")
    if ls is not None and len(ls) > 1:
        v = ls.values
        down = np.flatnonzero((v[1:] < v[:-1]) & np.isfinite(v[1:]) & np.isfinite(v[:-1]))
        steps += ls.steps[down].tolist()  # the step before the smaller scale was the skipped one
    cur = onset
    for st in sorted({int(x) for x in steps if x < onset}, reverse=True):
        if cur - st > gap:
            break
        if ls is not None and len(ls) > 1:  # the scale grew back in between: a probe the scaler recovered from
            seg = ls.values[(ls.steps >= st) & (ls.steps <= cur)]
            seg = seg[np.isfinite(seg)]
            if seg.size > 1 and bool(np.any(np.diff(seg) > 0)):
                break
        cur = st
    return cur


def _segment_of(ev: _Evidence, step: int) -> int:
    seg = next((f.segment for f in ev.findings if f.step == step and f.segment is not None), None)
    if seg is not None:
        return int(seg)
    s = ev.run.series("loss") or ev.run.series("lr")
    if s is None or not len(s):
        return 0
    k = min(int(np.searchsorted(s.steps, step)), len(s) - 1)
    return int(s.segments[k])


def decide_timeline(run: RunData, detectors: tuple[Detector, ...] = DETECTORS) -> Decision:
    """Run the detectors on the effective timeline of ``run`` and decide verdict, cause, onset."""
    findings, skipped = run_detectors(run, detectors)
    ev = _Evidence.build(run, findings)
    hyps = _early_divergence(ev, _slow_divergence(ev, _apply_notes(ev, _family_hypotheses(ev))))
    chosen, hyps = _choose(ev, hyps)
    hyps.sort(key=lambda h: (h is not chosen, -h.confidence))

    verdict, cause, mechanism, confidence, onset_step = "healthy", None, None, 1.0, None
    spikes = ev.get("SP01")
    if chosen is not None:
        verdict, cause, mechanism, confidence = "anomaly", chosen.cause, chosen.mechanism, chosen.confidence
        onset_step = _onset(ev, chosen.cause, ev.failure_step)
        recovered = [f for f in spikes if f.evidence.get("recovered_step") is not None]
        if cause == "data_batch" and not ev.failed and all(
                f.evidence.get("recovered_step") is not None for f in ev.families["data_batch"]):
            verdict = "transient"
            gaps = np.diff(sorted(f.step for f in recovered if f.step is not None))
            if len(recovered) >= RECURRING_SPIKES and gaps.size and float(np.median(gaps)) <= PATH_WINDOW:
                # spikes that keep coming back (every few dozen steps) are a fault, not a blip; a few spikes
                # hundreds of steps apart in a long healthy run stay transient
                verdict = "anomaly"
                onset_step = min([onset_step] + [f.step for f in recovered if f.step is not None])  # type: ignore[list-item]
    elif ev.failed:
        verdict, cause, confidence = "anomaly", "unknown", 0.3
        onset_step = min(f.step for f in ev.findings if f.code in _PRECURSORS and f.step is not None)
        hyps.insert(0, Hypothesis("unknown", None, 0.3,
                                  ("the run failed (non-finite or diverging loss) but no detector names a cause",),
                                  ()))
    elif spikes:
        verdict, cause, confidence = "transient", "unknown", 0.4
        onset_step = min(f.step for f in spikes if f.step is not None)
    if verdict == "healthy":
        confidence = 1.0 - max((h.confidence for h in hyps), default=0.0)
    if onset_step is not None and cause is not None:
        chain = _chain(ev, cause, int(onset_step))
        if chain is not None:
            ev.findings.append(chain)
    onset = {"step": int(onset_step), "segment": _segment_of(ev, onset_step)} if onset_step is not None else None
    return Decision(verdict, cause, mechanism, float(confidence), onset, tuple(hyps), tuple(ev.findings),
                    tuple(skipped), ev.failure_step)
