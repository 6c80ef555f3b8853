"""Plain words for every renderer: glossary, headline, paste-ready blocks, consistency pass.

The glossary, the one-sentence headline, paste-ready launch blocks, and the consistency pass over
hypotheses and success criteria.

The engine and the planner speak in cause/mechanism codes (``update_scale_growth /
attention_logit_growth``) and in sentences written one finding at a time. A person paged about a run
needs one sentence first, the jargon second, and no sentence that contradicts another. This module
turns an :class:`~forensics.model.Analysis` into that view; it never changes the analysis itself (the
JSON keeps what the engine and the planner said).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from reports._common import fmt_num

if TYPE_CHECKING:
    from forensics.model import Analysis, Finding, Hypothesis, RunData

# ----------------------------------------------------------------------------------- glossary

CAUSE_WORDS: dict[str, str] = {
    "lr_schedule_reset": "the learning-rate schedule jumped or restarted (usually when the job resumed)",
    "overflow": "numbers grew past what the number format holds (fp16 tops out at 65504) and became inf/NaN",
    "data_batch": "a bad, repeated or badly ordered batch of data, not the model itself",
    "update_scale_growth": "the weight updates grew too large for the model over many steps",
    "grad_scaling_bug": "the gradients are scaled by a wrong constant factor (accumulation or adapter scaling)",
    "state_not_restored": "weights, optimizer or data-loader state was not restored when the job resumed",
    "hardware_or_distributed": "a hardware or communication fault (a bad GPU, NCCL, one bad rank)",
    "unknown": "the evidence does not decide between the candidate causes",
}
"""Cause family (DESIGN.md section 4) -> what it means, in one line."""

MECHANISM_WORDS: dict[str, str] = {
    "reset_to_initial": "the schedule started again from its warm-up",
    "offset": "the schedule runs a number of steps behind or ahead of where it should be",
    "horizon_change": "the total number of steps changed on resume, so the decay changed",
    "missing_warmup": "training started at full learning rate without a warm-up",
    "intentional_change": "the learning rate was changed on purpose (not a fault)",
    "activation_overflow": "a forward-pass value (attention scores, activations) went past the fp16 range",
    "loss_scale_collapse": "the fp16 loss scaler kept halving and optimizer steps were skipped",
    "nonfinite_state": "inf/NaN values sit inside the weights or the optimizer state",
    "bad_batch": "one corrupt, empty or fully masked batch",
    "data_replay": "data already trained on was replayed after a resume (the loss looks too good)",
    "ordering": "correlated batches arrive together",
    "lr_too_high": "the learning rate is too high for the model at that point of training",
    "attention_logit_growth": "attention scores (q.k) kept growing until the softmax saturated",
    "output_logit_divergence": "the output logits drifted (log Z moved away from 0)",
    "adam_epsilon": "Adam's epsilon is too small for the second-moment estimates",
    "init_scale": "the initial weights are too large",
    "adapter_scale": "the adapter's alpha/rank scaling makes its steps too large",
}
"""Mechanism (DESIGN.md section 4) -> what it means, in one line."""

VERDICT_WORDS: dict[str, str] = {
    "anomaly": "a fault that did not recover: act on it",
    "transient": "an anomaly that recovered by itself: monitor, do not roll back",
    "healthy": "nothing anomalous found, and the training objective was read",
    "inconclusive": "the records needed to judge the run were not found",
}

_WHAT: dict[tuple[str, str | None], str] = {
    ("lr_schedule_reset", "reset_to_initial"): "the learning-rate schedule restarted from its warm-up",
    ("lr_schedule_reset", "offset"): "the learning-rate schedule was shifted by a number of steps",
    ("lr_schedule_reset", "horizon_change"): "the learning-rate schedule changed its length",
    ("lr_schedule_reset", "missing_warmup"): "training ran at full learning rate without a warm-up",
    ("lr_schedule_reset", None): "the learning rate jumped off its schedule",
    ("overflow", "activation_overflow"): "a forward-pass value grew past the fp16 range and turned into inf/NaN",
    ("overflow", "loss_scale_collapse"): "the fp16 loss scaler collapsed and optimizer steps were skipped",
    ("overflow", "nonfinite_state"): "inf/NaN values got into the weights or the optimizer state",
    ("overflow", None): "values overflowed the number format",
    ("data_batch", "bad_batch"): "one bad batch of data spiked the loss",
    ("data_batch", "data_replay"): "already-seen data was replayed",
    ("data_batch", None): "the data, not the model, disturbed the loss",
    ("update_scale_growth", "attention_logit_growth"): "the attention scores grew out of control",
    ("update_scale_growth", "output_logit_divergence"): "the output logits drifted out of range",
    ("update_scale_growth", None): "the weight updates grew too large",
    ("grad_scaling_bug", None): "the gradients were scaled by a wrong constant factor",
    ("state_not_restored", None): "training state was not restored on resume",
    ("hardware_or_distributed", None): "a hardware or communication fault hit the run",
}


def explain(code: str | None) -> str:
    """One line of plain words for a cause, mechanism or verdict code ('' when unknown)."""
    if not code:
        return ""
    return CAUSE_WORDS.get(code) or MECHANISM_WORDS.get(code) or VERDICT_WORDS.get(code, "")


def glossary(codes: Iterable[str | None]) -> list[tuple[str, str]]:
    """``(code, plain words)`` for each known code in ``codes``, first mention first, no repeats."""
    out: dict[str, str] = {}
    for c in codes:
        if c and c not in out and explain(c):
            out[c] = explain(c)
    return list(out.items())


# ----------------------------------------------------------------------------------- headline


def failure_step(analysis: Analysis) -> int | None:
    """The step where the failure became visible (first non-finite value after the onset), or ``None``."""
    onset = analysis.onset["step"] if analysis.onset else None
    steps = [f.step for f in analysis.findings if f.name.startswith("nonfinite") and f.step is not None]
    steps = [s for s in steps if onset is None or s > onset]
    return min(steps) if steps else None


def _resumed_at(analysis: Analysis, run: RunData | None) -> bool:
    """True when the onset is the first step of a resumed segment."""
    if not analysis.onset or not analysis.onset.get("segment"):
        return False
    step = analysis.onset["step"]
    if any(f.name == "integrity.segments" and f.step == step for f in analysis.findings):
        return True
    if run is not None and run.metrics.height:
        return run.segment_starts().get(int(analysis.onset["segment"])) == step
    return False


def headline(analysis: Analysis, run: RunData | None = None) -> str:
    """One plain sentence: what happened and when.

    Example: ``"The learning-rate schedule restarted from its warm-up when the job resumed at step 301."``

    Args:
        analysis: The engine's result.
        run: The run's data (segment starts, step range), or ``None``.

    Returns:
        One sentence ending with a full stop.
    """
    a = analysis
    span = ""
    if run is not None and run.metrics.height:
        steps = run.metrics.get_column("step")
        span = f" over steps {fmt_num(int(steps.min()))} to {fmt_num(int(steps.max()))}"  # type: ignore[arg-type]
    if a.verdict == "healthy":
        return f"Nothing went wrong: every logged series stayed within the run's own normal range{span}."
    if a.verdict == "inconclusive":
        return "The run could not be judged: the training objective or the records needed were not found."
    step = a.onset["step"] if a.onset else None
    if a.verdict == "transient":
        what = _WHAT.get((a.cause or "", a.mechanism)) or "the run departed from its normal behaviour"
        at = f" at step {step}" if step is not None else ""
        return f"{what[0].upper()}{what[1:]}{at} and the run recovered by itself."
    if a.cause in (None, "unknown"):
        at = f" at step {step}" if step is not None else ""
        return f"The run departed from its normal behaviour{at}, but the evidence does not decide why."
    what = _WHAT.get((a.cause, a.mechanism)) or _WHAT.get((a.cause, None)) or "the run failed"
    what = what[0].upper() + what[1:]
    fail = failure_step(a)
    tail = f"; the failure became visible at step {fail}" if fail is not None and step is not None else ""
    if step is None:
        return f"{what}{tail}."
    if _resumed_at(a, run):
        return f"{what} when the job resumed at step {step}{tail}."
    return f"{what}: the run first left its normal range at step {step}{tail}."


def certainty(analysis: Analysis, hypotheses: Sequence[Hypothesis] | None = None) -> str:
    """How sure and why, in one or two sentences (confidence word, the strongest support, the runner-up)."""
    a = analysis
    word = "high" if a.confidence >= 0.85 else "moderate" if a.confidence >= 0.6 else "low"
    text = f"Confidence {a.confidence:.2f} ({word})"
    hyps = list(hypotheses if hypotheses is not None else a.hypotheses)
    if a.verdict == "healthy":
        n = len(a.skipped)
        return text + (f": no detector fired; {n} check(s) could not run (see Not evaluated)." if n
                       else ": no detector fired and every check ran.")
    chosen = next((h for h in hyps if h.cause == a.cause), None)
    why = [s for s in (chosen.support if chosen else ()) if s][:1]
    if not why:
        top = sorted((f for f in a.findings if f.cause == a.cause), key=lambda f: -f.confidence)[:1]
        why = [f"{f.code} step {f.step}: {f.message}" for f in top]
    if why:
        text += " because " + _lower_first(why[0].rstrip("."))
    others = [h for h in hyps if h.cause != a.cause]
    if others:
        o = others[0]
        text += f". Runner-up: {o.cause}{' / ' + o.mechanism if o.mechanism else ''} ({o.confidence:.2f})"
    return text + "."


def _lower_first(s: str) -> str:
    return s[:1].lower() + s[1:] if s[:2] != s[:2].upper() else s


# ----------------------------------------------------------------------------------- paste-ready blocks


@dataclass(frozen=True)
class Block:
    """One paste-ready block: ``lang`` for the fence (``python``, ``bash``, ``json``), a label, the text."""

    lang: str
    label: str
    text: str


def launch_blocks(settings: Mapping[str, Any], resume: Mapping[str, Any] | None = None) -> list[Block]:
    """Paste-ready blocks for a trial's settings.

    ``TrainingArguments`` keys, a Megatron/DeepSpeed command line, or the machine-readable knobs as
    JSON when no framework was recognised.

    Args:
        settings: A trial's ``settings`` (``hf_training_arguments``, ``megatron_flags``, knobs).
        resume: The plan's ``resume_from`` (checkpoint path for the command line), or ``None``.

    Returns:
        One to three blocks, untruncated.
    """
    out: list[Block] = []
    hf = settings.get("hf_training_arguments")
    if isinstance(hf, Mapping) and hf:
        body = "".join(f"    {k}={_py(v)},\n" for k, v in hf.items())
        out.append(Block("python", "Hugging Face TrainingArguments (only the keys that change)",
                         f"TrainingArguments(\n    ...,  # your other arguments, unchanged\n{body})"))
    flags = settings.get("megatron_flags")
    if isinstance(flags, list | tuple) and flags:
        lines = ['"${LAUNCH[@]}"']
        ckpt = (resume or {}).get("checkpoint")
        if ckpt:
            lines.append(f"--load {_shell(str(ckpt).split(' (')[0])}")
        lines += [str(f) for f in flags]
        head = "# LAUNCH=(your usual launch command and arguments, unchanged), e.g. (torchrun pretrain_gpt.py ...)\n"
        out.append(Block("bash", "Megatron-LM / DeepSpeed command line (appended flags)",
                         head + " \\\n  ".join(lines)))
    knobs = {k: v for k, v in settings.items() if k not in ("hf_training_arguments", "megatron_flags")}
    if knobs and not out:
        out.append(Block("json", "settings (map these to your trainer)", json.dumps(_jsonable(knobs), indent=2)))
    return out


def _py(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return repr(v)
    if isinstance(v, int | float | str):
        return repr(v)
    return repr(_jsonable(v))


def _shell(s: str) -> str:
    return s if re.fullmatch(r"[\w./:=@%+-]+", s) else "'" + s.replace("'", "'\\''") + "'"


def _jsonable(v: Any) -> Any:
    from reports._common import plain

    return plain(v)


# ----------------------------------------------------------------------------------- consistency


@dataclass(frozen=True)
class Removed:
    """A sentence the consistency pass left out, and why."""

    where: str
    text: str
    why: str


@dataclass(frozen=True)
class Consistent:
    """The analysis as the renderers show it: hypotheses and criteria without contradictions."""

    hypotheses: tuple[Hypothesis, ...]
    success_criteria: tuple[str, ...]
    removed: tuple[Removed, ...] = field(default_factory=tuple)


_TERMS = {
    "grad-norm": "grad_norm", "grad norm": "grad_norm", "gradient norm": "grad_norm",
    "update-ratio": "update_ratio", "update ratio": "update_ratio", "update-norm": "update_ratio",
    "attention-logit": "attn_logit_max", "attention logit": "attn_logit_max", "loss-scale": "loss_scale",
    "loss scale": "loss_scale", "step-time": "step_time", "step time": "step_time", "lr": "lr", "loss": "loss",
}


def finding_metrics(f: Finding, available: Iterable[str] = ()) -> set[str]:
    """The metric names a finding used.

    Its evidence ``metric``/``series`` values and the metric names in its dotted detector name
    (``grad_norm.departure`` -> ``grad_norm``); restricted to ``available`` when given.
    """
    names: set[str] = set()
    for key in ("metric", "series"):
        v = f.evidence.get(key) if isinstance(f.evidence, Mapping) else None
        if isinstance(v, str):
            names.update(p.strip() for p in re.split(r"[,;]| vs ", v) if p.strip())
        elif isinstance(v, list | tuple):
            names.update(str(x) for x in v)
    avail = set(available)
    for m in avail:
        if re.search(rf"(?:^|[._]){re.escape(m)}(?:$|[._])", f.name):
            names.add(m)
    head = f.name.split(".")[0]
    names.add({"update": "update_ratio", "attention": "attn_logit_max"}.get(head, head))
    return {n for n in names if not avail or n in avail} if avail else names


def _claimed_absent(text: str) -> set[str]:
    """Metrics a sentence says are absent or unconfirmed (``no grad-norm or update-ratio series confirms``)."""
    t = text.lower()
    out: set[str] = set()
    for m in re.finditer(r"\bno ([a-z_\- ,]+?) (?:series|finding|evidence)\b", t):
        for part in re.split(r",| or | and ", m.group(1)):
            p = part.strip()
            if p in _TERMS:
                out.add(_TERMS[p])
            elif p.replace(" ", "_") in _TERMS.values():
                out.add(p.replace(" ", "_"))
    return out


def _contradiction(text: str, findings: Sequence[Finding]) -> str | None:
    """Why ``text`` contradicts a finding, or ``None``."""
    t = text.lower()
    if re.search(r"\bwithout (?:a |any )?spikes?\b|\bno (?:loss )?spikes?\b", t):
        spikes = [f for f in findings if "spike" in f.name and f.step is not None]
        if spikes:
            f = spikes[0]
            z = f.evidence.get("z") if isinstance(f.evidence, Mapping) else None
            zs = f" (z={fmt_num(z, 3)})" if isinstance(z, int | float) and np.isfinite(z) else ""
            return f"contradicted by {f.code} {f.name} at step {f.step}{zs}"
    m = re.search(r"\bno precursor\b", t)
    if m:
        at = re.search(r"\bat step (\d+)", t)
        win = re.search(r"previous (\d+) steps", t)
        if at:
            s, w = int(at.group(1)), int(win.group(1)) if win else 100
            lead = [f for f in findings if f.step is not None and s - w <= f.step < s
                    and not f.name.startswith(("nonfinite", "integrity", "notes"))]
            if lead:
                f = lead[0]
                return f"contradicted by {f.code} {f.name} at step {f.step}, {s - f.step} step(s) before step {s}"
    for metric in sorted(_claimed_absent(text)):
        hits = [f for f in findings if metric in finding_metrics(f) and f.step is not None]
        if hits:
            f = hits[0]
            return f"contradicted by {f.code} {f.name} on {metric} at step {f.step}"
    return None


def consistent(analysis: Analysis, run: RunData | None = None) -> Consistent:
    """The consistency pass: no sentence contradicts a finding, no criterion is already met.

    A hypothesis sentence is left out when it claims something absent that a finding shows (``without a
    spike`` beside a spike finding; ``no grad-norm series confirms`` beside a grad-norm finding). A
    success criterion is left out when the failed run itself met it over the trial window after the
    onset (so it cannot tell a fixed run from the failed one); this needs ``run`` and the criteria the
    planner words with their numbers (``... (2.219 +- 0.2735)``, ``pre-onset median (0.7632)``).

    Args:
        analysis: The engine's result (unchanged).
        run: The run's data, or ``None`` (criteria then stay as they are).

    Returns:
        The filtered hypotheses and criteria, and every left-out sentence with its reason.
    """
    removed: list[Removed] = []
    findings = list(analysis.findings)
    hyps: list[Hypothesis] = []
    for h in analysis.hypotheses:
        keep_for, keep_against = [], []
        for s in h.support:
            why = _contradiction(s, findings)
            (removed.append(Removed(f"hypothesis {h.cause} (for)", s, why)) if why else keep_for.append(s))
        for s in h.against:
            why = _contradiction(s, findings)
            (removed.append(Removed(f"hypothesis {h.cause} (against)", s, why)) if why else keep_against.append(s))
        hyps.append(type(h)(h.cause, h.mechanism, h.confidence, tuple(keep_for), tuple(keep_against)))
    crit: list[str] = []
    rec = analysis.recovery
    for c in (rec.success_criteria if rec is not None else ()):
        why = _already_met(c, analysis, run)
        (removed.append(Removed("success criterion", c, why)) if why else crit.append(c))
    return Consistent(tuple(hyps), tuple(crit), tuple(removed))


def split_restore(restore: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(steps before resuming, checks)``: restore sentences that start with check/verify are proof, not steps."""
    checks = [r for r in restore if r.lower().startswith(("check", "verify"))]
    return [r for r in restore if r not in checks], checks


def proof(analysis: Analysis, cons: Consistent) -> list[str]:
    """What would prove the first trial worked: the planner's checks, then the criteria left by the pass."""
    rec = analysis.recovery
    checks = split_restore(rec.restore)[1] if rec is not None else []
    return [*checks, *cons.success_criteria]


_NUM = r"([-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?)"


def _post_onset(run: RunData, metric: str, onset: int, length: int) -> np.ndarray | None:
    s = run.series(metric)
    if s is None or len(s) == 0:
        return None
    m = (s.steps >= onset) & (s.steps <= onset + max(length, 1))
    return s.values[m] if m.any() else None


def _already_met(criterion: str, analysis: Analysis, run: RunData | None) -> str | None:
    """Why the failed run already meets ``criterion`` after its onset, or ``None`` (keep it)."""
    if run is None or not analysis.onset or analysis.verdict != "anomaly" or analysis.recovery is None:
        return None
    onset = int(analysis.onset["step"])
    trials = analysis.recovery.trials
    length = max((t.steps for t in trials), default=0) or 100
    c = criterion.lower()
    m = re.search(r"loss stays within .*?\(" + _NUM + r" \+- " + _NUM + r"\)", c)
    if m:
        v = _post_onset(run, "loss", onset, length)
        hi = float(m.group(1)) + float(m.group(2))
        if v is not None and np.isfinite(v).all() and float(v.max()) <= hi:
            return (f"already met by the failed run: its loss stayed at or below {fmt_num(hi)} from step {onset} "
                    f"over {length} steps")
        return None
    m = re.search(r"grad norm's rolling median stays within 2x of its pre-onset median \(" + _NUM + r"\)", c)
    if m:
        v = _post_onset(run, "grad_norm", onset, length)
        g = float(m.group(1))
        if v is None or not np.isfinite(v).all() or g <= 0:
            return None
        k = max(1, min(32, v.size))
        med = np.array([np.median(v[max(0, i - k + 1): i + 1]) for i in range(v.size)])
        spiky = any(f.name.startswith("grad_norm") and (f.step or -1) >= onset for f in analysis.findings)
        if not spiky and (med <= 2 * g).all() and (med >= g / 2).all():
            return (f"already met by the failed run: its grad-norm rolling median stayed within 2x of {fmt_num(g)} "
                    f"from step {onset}")
        return None
    if re.search(r"no loss spike beyond", c):
        v = _post_onset(run, "loss", onset, length)
        spikes = [f for f in analysis.findings if "spike" in f.name and (f.step or -1) >= onset]
        if v is not None and np.isfinite(v).all() and not spikes:
            return f"already met by the failed run: no loss spike was found after step {onset}"
    return None
