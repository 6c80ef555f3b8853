"""Plain words for every renderer: glossary, headline, paste-ready blocks, consistency pass.

The glossary, the one-sentence headline, paste-ready launch blocks, and the consistency pass over
hypotheses and success criteria.

The engine and the planner speak in cause/mechanism codes (``update_scale_growth /
attention_logit_growth``) and in sentences written one finding at a time. A person paged about a run
needs one sentence first, the jargon second, and no sentence that contradicts another. This module
turns an :class:`~forensics.model.Analysis` into that view; it never changes the analysis itself (the
JSON keeps what the engine and the planner said). The consistency pass is :mod:`reports._consistent`.
"""

from __future__ import annotations

__all__ = [
    "CAUSE_WORDS", "Block", "Consistent", "Removed", "certainty", "consistent", "explain", "failure_step",
    "finding_metrics", "glossary", "headline", "launch_blocks", "proof", "split_restore",
]

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from forensics.model import Cause, Mechanism, Verdict
from reports._common import fmt_num
from reports._consistent import Consistent, Removed, consistent, finding_metrics, proof, split_restore

if TYPE_CHECKING:
    from forensics.model import Analysis, Hypothesis, RunData

# ----------------------------------------------------------------------------------- glossary

CAUSE_WORDS: dict[str, str] = {
    Cause.LR_SCHEDULE_RESET: "the learning-rate schedule jumped or restarted (usually when the job resumed)",
    Cause.OVERFLOW: "numbers grew past what the number format holds (fp16 tops out at 65504) and became inf/NaN",
    Cause.DATA_BATCH: "a bad, repeated or badly ordered batch of data, not the model itself",
    Cause.UPDATE_SCALE_GROWTH: "the weight updates grew too large for the model over many steps",
    Cause.GRAD_SCALING_BUG: "the gradients are scaled by a wrong constant factor (accumulation or adapter scaling)",
    Cause.STATE_NOT_RESTORED: "weights, optimizer or data-loader state was not restored when the job resumed",
    Cause.HARDWARE_OR_DISTRIBUTED: "a hardware or communication fault (a bad GPU, NCCL, one bad rank)",
    Cause.UNKNOWN: "the evidence does not decide between the candidate causes",
}
"""Cause family (DESIGN.md section 4) -> what it means, in one line."""

MECHANISM_WORDS: dict[str, str] = {
    "reset_to_initial": "the schedule started again from its beginning: its warm-up or its peak",
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
    Verdict.ANOMALY: "a fault that did not recover: act on it",
    Verdict.TRANSIENT: "an anomaly that recovered by itself: monitor, do not roll back",
    Verdict.HEALTHY: "nothing anomalous found, and the training objective was read",
    Verdict.INCONCLUSIVE: "the records needed to judge the run were not found",
}

_WHAT: dict[tuple[str, str | None], str] = {
    (Cause.LR_SCHEDULE_RESET, Mechanism.RESET_TO_INITIAL): "the learning-rate schedule restarted from the beginning",
    (Cause.LR_SCHEDULE_RESET, Mechanism.OFFSET): "the learning-rate schedule was shifted by a number of steps",
    (Cause.LR_SCHEDULE_RESET, Mechanism.HORIZON_CHANGE): "the learning-rate schedule changed its length",
    (Cause.LR_SCHEDULE_RESET, Mechanism.MISSING_WARMUP): "training ran at full learning rate without a warm-up",
    (Cause.LR_SCHEDULE_RESET, None): "the learning rate jumped off its schedule",
    (Cause.OVERFLOW, Mechanism.ACTIVATION_OVERFLOW):
        "a forward-pass value grew past the fp16 range and turned into inf/NaN",
    (Cause.OVERFLOW, Mechanism.LOSS_SCALE_COLLAPSE): "the fp16 loss scaler collapsed and optimizer steps were skipped",
    (Cause.OVERFLOW, Mechanism.NONFINITE_STATE): "inf/NaN values got into the weights or the optimizer state",
    (Cause.OVERFLOW, None): "values overflowed the number format",
    (Cause.DATA_BATCH, Mechanism.BAD_BATCH): "one bad batch of data spiked the loss",
    (Cause.DATA_BATCH, Mechanism.DATA_REPLAY): "already-seen data was replayed",
    (Cause.DATA_BATCH, None): "the data, not the model, disturbed the loss",
    (Cause.UPDATE_SCALE_GROWTH, Mechanism.ATTENTION_LOGIT_GROWTH): "the attention scores grew out of control",
    (Cause.UPDATE_SCALE_GROWTH, Mechanism.OUTPUT_LOGIT_DIVERGENCE): "the output logits drifted out of range",
    (Cause.UPDATE_SCALE_GROWTH, None): "the weight updates grew too large",
    (Cause.GRAD_SCALING_BUG, None): "the gradients were scaled by a wrong constant factor",
    (Cause.STATE_NOT_RESTORED, None): "training state was not restored on resume",
    (Cause.HARDWARE_OR_DISTRIBUTED, None): "a hardware or communication fault hit the run",
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

    Example: ``"The learning-rate schedule restarted from the beginning when the job resumed at step 301."``

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
    if a.verdict == Verdict.HEALTHY:
        return f"Nothing went wrong: every logged series stayed within the run's own normal range{span}."
    if a.verdict == Verdict.INCONCLUSIVE:  # the summary says what was found and how to map it: the useful part
        why = str(getattr(a, "summary", "") or "").removeprefix("inconclusive:").strip().rstrip(".")
        if why:
            return f"The run could not be judged: {why}."
        return "The run could not be judged: the training objective or the records needed were not found."
    step = a.onset["step"] if a.onset else None
    if a.verdict == Verdict.TRANSIENT:
        what = _WHAT.get((a.cause or "", a.mechanism)) or "the run departed from its normal behaviour"
        at = f" at step {step}" if step is not None else ""
        return f"{what[0].upper()}{what[1:]}{at} and the run recovered by itself."
    if a.cause in (None, Cause.UNKNOWN):
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
    if a.verdict == Verdict.HEALTHY:
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
