"""The engine: runs the detectors, picks the onset and the cause, asks for a recovery plan.

Detectors report; the engine decides (STYLE.md item 5). Decision rules, in order:

1. *Cause findings* (a cause family with confidence >= ``min_cause_conf``) are grouped per
   family; a family's score is the noisy-OR of its findings' confidences, lowered by evidence
   against it (a precursor before a "bad batch", an explicit override for an lr change).
2. Lead-lag decides between families whose findings coexist: the family whose earliest
   finding comes first explains the later ones, except that fp16 evidence (loss-scale
   collapse, skipped steps) makes it ``overflow`` when update growth is all there is
   before it (tiny-runs.md: the fp16 evidence is what distinguishes it).
3. The onset is the earliest step over ALL the findings on the causal path of the chosen
   cause: its own findings and the departures (grad norm, loss, divergence) that start at or
   after the cause's first finding minus a window (DESIGN.md section 4).
4. Verdict: ``anomaly`` when a cause is chosen or the run failed (NaN, divergence, unrecovered
   spike: cause ``unknown`` when nothing explains it); ``transient`` when every departure
   recovered by itself and nothing else fired; ``healthy`` otherwise.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass

from forensics.detectors import DETECTORS, Detector
from forensics.model import Finding, Hypothesis, RunData, Skip

MIN_CAUSE_CONF = 0.5
"""A finding argues for its cause only at or above this confidence."""
PATH_WINDOW = 128
"""Departures this many steps before a cause's first finding still count as its onset."""

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


MAX_ATTEMPTS = 6
"""Rolled-back attempts analysed on their own (the earliest ones)."""


def decide(run: RunData, detectors: tuple[Detector, ...] = DETECTORS) -> Decision:
    """Decide on the whole run, including attempts that a restart rolled back.

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
    bad = [(k, d) for k, d in views if d.verdict == "anomaly" and d.onset is not None]
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


def decide_timeline(run: RunData, detectors: tuple[Detector, ...] = DETECTORS) -> Decision:
    """Run the detectors on the effective timeline of ``run`` and decide verdict, cause, onset."""
    findings, skipped = run_detectors(run, detectors)
    findings.sort(key=lambda f: (f.step if f.step is not None else 1 << 62, f.code))
    by_code: dict[str, list[Finding]] = {}
    for f in findings:
        by_code.setdefault(f.code, []).append(f)

    nf = [f for f in by_code.get("NF01", []) if not f.evidence.get("recovered")]
    dv = by_code.get("DV01", [])
    stall = by_code.get("ST01", [])
    spikes = by_code.get("SP01", [])
    unrecovered = [f for f in spikes if f.evidence.get("recovered_step") is None]
    failure_step = None
    marks = [f.step for f in nf + dv + unrecovered if f.step is not None]
    if marks:
        failure_step = min(marks)
    failed = bool(nf or dv or unrecovered or stall)

    cause_f = [f for f in findings if f.cause and f.cause != "unknown"]
    families: dict[str, list[Finding]] = {}
    for f in cause_f:
        families.setdefault(f.cause, []).append(f)  # type: ignore[arg-type]

    hyps: list[Hypothesis] = []
    for fam, fs in families.items():
        strong = [f for f in fs if f.confidence >= MIN_CAUSE_CONF]
        score = _noisy_or([f.confidence for f in fs])
        against = [a for f in fs for a in f.against]
        support = [f"{f.code} step {f.step}: {f.message}" for f in fs]
        mech = max(fs, key=lambda f: f.confidence).mechanism
        first = min((f.step for f in fs if f.step is not None), default=None)
        # a bad batch with data that kept training fine is transient, not a fault
        if fam == "data_batch" and all(f.evidence.get("recovered_step") is not None for f in fs) and not failed:
            score *= 0.6
            against.append("every spike recovered by itself")
        if fam == "data_batch":
            earlier = [f for f in cause_f + dv if (f.cause in ("update_scale_growth", "overflow") or f.code == "DV01")
                       and f.confidence >= MIN_CAUSE_CONF and f.step is not None and first is not None
                       and f.step < first]
            if earlier:
                score *= 0.4
                what = earlier[0].cause or earlier[0].name
                against.append(f"{earlier[0].code} ({what}) departs earlier, at step {earlier[0].step}: "
                               "the spike has a precursor")
        if not strong:
            score = min(score, MIN_CAUSE_CONF - 0.01)
        hyps.append(Hypothesis(fam, mech, score, tuple(support[:6]), tuple(dict.fromkeys(against))))
        del first

    # remedies the notes say were tried and failed argue against the cause they address
    for nf_ in by_code.get("NT01", []):
        bad = set(nf_.evidence.get("argues_against", []))
        hyps = [Hypothesis(h.cause, h.mechanism, h.confidence * 0.5, h.support,
                           h.against + tuple(a for a in nf_.against if _addresses(a, h.cause)))
                if h.cause in bad else h for h in hyps]

    # a slow divergence that no other family explains: updates too large for the model (D13)
    if dv and not any(h.confidence >= MIN_CAUSE_CONF for h in hyps):
        cfg = repr(run.meta.get("config_files", {})).lower()
        adapter = "adapter_config" in cfg or "lora" in cfg
        hyps = [h for h in hyps if h.cause != "update_scale_growth"]
        hyps.append(Hypothesis(
            "update_scale_growth", "adapter_scale" if adapter else "lr_too_high", 0.55,
            (f"{dv[0].code} step {dv[0].step}: {dv[0].message}",
             "the loss turns and keeps rising without a spike: the slow-divergence signature of updates too "
             "large for the model (detectors.md D13; BigScience 104B 'non-spike diverging')")
            + (("a LoRA adapter is trained: its effective step scales with alpha/rank",) if adapter else ()),
            ("no grad-norm, update-ratio or attention-logit series confirms the growth",),
        ))
        families.setdefault("update_scale_growth", []).append(
            Finding(dv[0].code, dv[0].name, "update_scale_growth", None, dv[0].step, dv[0].segment, 0.55,
                    dv[0].severity, dv[0].message, dv[0].evidence))

    # lead-lag: earliest strong family explains later ones; fp16 evidence makes growth an overflow
    def first_step(fam: str) -> int:
        return min((f.step for f in families.get(fam, []) if f.step is not None and f.confidence >= MIN_CAUSE_CONF),
                   default=1 << 62)

    strong_fams = [h for h in hyps if h.confidence >= MIN_CAUSE_CONF]
    chosen: Hypothesis | None = None
    if strong_fams:
        ordered = sorted(strong_fams, key=lambda h: (first_step(h.cause), -h.confidence))
        chosen = ordered[0]
        fams = {h.cause for h in strong_fams}
        if "overflow" in fams and chosen.cause == "update_scale_growth":
            chosen = next(h for h in strong_fams if h.cause == "overflow")
        # a loss-scale collapse after a grad-norm departure is a symptom of growing updates
        if chosen.cause == "overflow" and chosen.mechanism == "loss_scale_collapse":
            ov_step = first_step("overflow")
            pre = [f for f in findings if f.code in ("GN01", "UP01", "AT01") and f.step is not None
                   and f.step < ov_step and f.confidence >= MIN_CAUSE_CONF]
            if pre:
                g = pre[0]
                growth = Hypothesis(
                    "update_scale_growth", "lr_too_high", 0.7,
                    (f"{g.code} step {g.step}: {g.message}",
                     f"the loss scale collapses only later, from step {ov_step}"),
                    (),
                )
                demoted = Hypothesis(chosen.cause, chosen.mechanism, min(chosen.confidence, 0.45), chosen.support,
                                     chosen.against + (f"the collapse follows a {g.name} departure at step {g.step}: "
                                                       "overflow is the symptom, growing updates the cause",))
                hyps = [demoted if h is chosen else h for h in hyps if h.cause != "update_scale_growth"] + [growth]
                families.setdefault("update_scale_growth", []).append(g)
                chosen = growth
                strong_fams = [h for h in hyps if h.confidence >= MIN_CAUSE_CONF]
                ordered = [growth]
        # lr changes that were deliberate are never the chosen fault
        if chosen.cause == "lr_schedule_reset" and chosen.mechanism == "intentional_change":
            rest = [h for h in ordered if h is not chosen]
            chosen = rest[0] if rest else None
        if chosen is not None and chosen.cause == "data_batch" and len(ordered) > 1:
            growth = [h for h in ordered if h.cause in ("update_scale_growth", "overflow")
                      and first_step(h.cause) < first_step("data_batch")]
            if growth:
                chosen = growth[0]

    # growth that starts after an lr reset is its consequence, not a second cause
    if chosen is not None and chosen.cause == "lr_schedule_reset":
        lr_step = first_step("lr_schedule_reset")
        hyps = [Hypothesis(h.cause, h.mechanism, min(h.confidence, 0.4), h.support,
                           h.against + (f"starts after the lr discontinuity at step {lr_step}: a consequence of "
                                        "the larger lr",))
                if h.cause == "update_scale_growth" and first_step(h.cause) > lr_step else h for h in hyps]
        chosen = next(h for h in hyps if h.cause == "lr_schedule_reset")

    # lower learning rates already tried and failed (notes): "lr too high" is not an explanation
    failed_lr = any("lower_lr" in f.evidence.get("failed_remedies", {}) for f in by_code.get("NT01", []))
    if chosen is not None and chosen.cause == "update_scale_growth" and chosen.mechanism == "lr_too_high" and failed_lr:
        ideas = {k for f in by_code.get("NT01", []) for k in f.evidence.get("ideas", {})}
        demoted = Hypothesis(chosen.cause, chosen.mechanism, min(chosen.confidence, 0.45), chosen.support,
                             chosen.against + ("the notes record lower learning rates that failed the same way",))
        unknown = Hypothesis("unknown", "init_scale" if "init_std" in ideas else None, 0.5,
                             ("the run diverges like an update-scale problem, yet lower lrs did not fix it",)
                             + (("the notes point to the initialisation scale as the open lead",)
                                if "init_std" in ideas else ()), ())
        hyps = [demoted if h is chosen else h for h in hyps] + [unknown]
        families.setdefault("unknown", list(families.get("update_scale_growth", [])))
        chosen = unknown

    # rank hypotheses: chosen first, then by score
    hyps.sort(key=lambda h: (h is not chosen, -h.confidence))

    verdict = "healthy"
    cause = mechanism = None
    confidence = 1.0
    onset_step: int | None = None
    if chosen is not None:
        verdict, cause, mechanism, confidence = "anomaly", chosen.cause, chosen.mechanism, chosen.confidence
        own = [f.step for f in families.get(chosen.cause, []) if f.step is not None and f.confidence >= MIN_CAUSE_CONF]
        onset_step = min(own) if own else failure_step
        # overflow caused by growing updates: the growth is on the causal path, its onset counts
        if cause == "overflow":
            growth = [f.step for f in families.get("update_scale_growth", [])
                      if f.step is not None and f.confidence >= MIN_CAUSE_CONF and onset_step is not None
                      and f.step < onset_step]
            if growth:
                onset_step = min(growth)
        # departures on the causal path just before the cause's first finding
        for f in findings:
            if f.code in _PRECURSORS[:1] and f.step is not None and onset_step is not None:
                if onset_step - PATH_WINDOW <= f.step < onset_step and (failure_step is None or f.step <= failure_step):
                    onset_step = f.step
        if cause == "data_batch" and not failed and all(
            f.evidence.get("recovered_step") is not None for f in families["data_batch"]
        ):
            verdict = "transient"
    elif failed:
        verdict, cause, mechanism = "anomaly", "unknown", None
        onset_step = min(f.step for f in findings if f.code in _PRECURSORS and f.step is not None)
        confidence = 0.3
        hyps.insert(0, Hypothesis("unknown", None, 0.3,
                                  ("the run failed (non-finite or diverging loss) but no detector names a cause",),
                                  ()))
    elif spikes:
        verdict, cause = "transient", "unknown"
        onset_step = min(f.step for f in spikes if f.step is not None)
        confidence = 0.4
    if verdict == "healthy":
        confidence = 1.0 - max((h.confidence for h in hyps), default=0.0)
        cause = mechanism = None
    onset = None
    if onset_step is not None:
        seg = next((f.segment for f in findings if f.step == onset_step and f.segment is not None), None)
        if seg is None:
            s = run.series("loss") or run.series("lr")
            seg = 0
            if s is not None and len(s):
                import numpy as np

                k = min(int(np.searchsorted(s.steps, onset_step)), len(s) - 1)
                seg = int(s.segments[k])
        onset = {"step": int(onset_step), "segment": int(seg)}
    return Decision(verdict, cause, mechanism, float(confidence), onset, tuple(hyps), tuple(findings),
                    tuple(skipped), failure_step)
