"""Where a recovery trial resumes, and how long its arms run.

Resume from the newest checkpoint at least :data:`ROLLBACK_MIN` steps before the onset (PaLM, arXiv
2204.02311 section 5.1); only checkpoints known complete (and, when their tensors were read, finite) qualify.
With no checkpoint in the folder the plan says so and names the last step to resume at or before; a log that
starts mid-run (the run was itself resumed) never sends the trial back to step 0.
"""

from __future__ import annotations

from collections.abc import Mapping

from forensics.facts import Checkpoint, RunFacts, tensor_checkpoints
from forensics.model import Cause, Mechanism, RunData

ROLLBACK_MIN = 100
"""Steps before the onset the resume point must be at least (PaLM section 5.1)."""
ROLLBACK_EPOCHS = 1
"""The same margin for a run numbered by epoch: one epoch."""
TRIAL_MAX = 2000
"""Longest short trial, in steps (our choice: a trial is a probe, not a training run)."""
MARGIN_MIN = 200
"""Steps an arm runs past the onset at least (our choice: past the PaLM skip window of 200 batches)."""
MARGIN_FRACTION = 0.1
"""...or this fraction of the resume-to-onset span when that is longer."""
EPOCH_MARGIN_MIN = 2
"""Epochs an arm runs past the onset at least, for a run numbered by epoch..."""
EPOCH_MARGIN_FRACTION = 0.5
"""...or this fraction of the resume-to-onset span."""
PASSED_OVER_LISTED = 4
"""Checkpoints passed over (non-finite, incomplete) named in the resume sentence."""

AT_RESUME = (Cause.LR_SCHEDULE_RESET, Cause.STATE_NOT_RESTORED)
"""Causes whose fault is in the resume itself: the checkpoint the resume loaded is fine."""


def finite_checkpoints(run: RunData, onset: int, facts: RunFacts | None = None) -> tuple[list[tuple[int, str]], str]:
    """Checkpoints whose tensors were read and are all finite and complete, and a sentence on the rest.

    Returns:
        ``(qualifying, note)``: (step, path) in step order, and why the others before the onset were passed over.
    """
    read = facts.read_checkpoints if facts is not None else tensor_checkpoints(run)
    ok = [c for c in read if c.finite and c.complete]
    passed = [c for c in read if not (c.finite and c.complete)]
    if any(c.step < onset for c in ok):
        note = "its tensors (weights and optimizer state) were read: all finite"
    elif read and min(c.step for c in read) >= onset:  # nothing was saved before the onset, finite or not
        note = (f"the earliest checkpoint read is from step {min(c.step for c in read)}, not before the onset: none "
                "holds the state from before it")
    else:
        note = "no checkpoint read before the onset has only finite, complete tensors"
    skipped = [_passed_over(c) for c in passed if c.step < onset]
    if skipped:
        note += "; passed over: " + ", ".join(skipped[:PASSED_OVER_LISTED])
    return [(c.step, c.path) for c in ok], note


def _passed_over(c: Checkpoint) -> str:
    if not c.finite:
        return f"step {c.step} has {c.nonfinite} of {c.tensors} tensors non-finite"
    return f"step {c.step} is incomplete (missing or unreadable files)"


def _candidates(run: RunData, facts: RunFacts, onset: int) -> tuple[list[tuple[int, str]], str | None]:
    """Checkpoints that qualify (step, path), and the sentence on their tensors when they were read."""
    if run.tensors.height:  # checkpoints were read: only finite, complete ones qualify
        return finite_checkpoints(run, onset, facts)
    # none could be read: still never one known to be cut or incomplete
    return [(c.step, c.path) for c in facts.listed_checkpoints if c.complete], None


def resume_point(run: RunData, facts: RunFacts, cause: str, mechanism: str | None, onset: int, *,
                 inside_process: bool = False) -> dict[str, object]:
    """``{"checkpoint", "step", "why"}``: where the trial starts, and why there.

    ``inside_process``: the fault came inside one process (no resume): the checkpoint before it, not one a resume
    loaded.
    """
    ckpts, verified = _candidates(run, facts, onset)
    unit = facts.step_unit
    rollback = ROLLBACK_EPOCHS if unit == "epoch" else ROLLBACK_MIN
    target = onset - rollback
    at_resume = (cause in AT_RESUME and not inside_process) or (
        mechanism == Mechanism.NONFINITE_STATE and verified is not None)  # finiteness verified: no margin needed
    hw = cause == Cause.HARDWARE_OR_DISTRIBUTED
    short_margin = False
    if mechanism == Mechanism.BAD_RANK:  # the rank's gradients entered the average from the onset on
        before = [c for c in ckpts if c[0] < onset]
    elif at_resume or hw:  # the fault is in the resume (or the machine), not in the weights: the checkpoint is fine
        before = [c for c in ckpts if c[0] <= onset]
    else:
        before = [c for c in ckpts if c[0] <= target]
        if not before:
            before = [c for c in ckpts if c[0] < onset]
            short_margin = bool(before)
    if cause == Cause.GRAD_SCALING_BUG:
        return _from_the_start(facts, "the scaling is wrong from the first logged step: fix it and rerun")
    if before:
        step, path = before[-1]
        loaded = at_resume and onset - step <= max(1, facts.log_interval)  # the resume started right after it
        why = _why_checkpoint(onset, step, unit, rollback, short_margin=short_margin, at_resume=at_resume, hw=hw,
                              nonfinite=mechanism == Mechanism.NONFINITE_STATE, loaded=loaded)
        return {"checkpoint": path, "step": step, "why": why + (f"; {verified}" if verified is not None else "")}
    return _no_checkpoint(facts, onset, target, rollback, verified)


def _why_checkpoint(onset: int, step: int, unit: str, rollback: int, *, short_margin: bool, at_resume: bool,
                    hw: bool, nonfinite: bool, loaded: bool = True) -> str:
    if short_margin:
        return (f"the only checkpoint before the onset {onset} ({onset - step} {unit}s before it, less than "
                f"the {rollback}-{unit} margin PaLM used: keep the trial's first steps under watch)")
    if nonfinite:
        return f"newest checkpoint before the onset {onset} whose tensors are all finite"
    if at_resume and loaded:
        return f"the checkpoint the faulty resume loaded ({unit} {step}); its weights are fine, the resume was not"
    if at_resume:  # the resume began later than this checkpoint: the one it loaded is not listed
        return (f"newest listed checkpoint before the faulty resume at {unit} {onset} (the checkpoint that resume "
                f"loaded is not among the files read); the fault is in the resume, not in these weights")
    if hw:
        return f"newest checkpoint before the fault at {unit} {onset}"
    return f"newest checkpoint at least {rollback} {unit}s before the onset {onset}"


def _from_the_start(facts: RunFacts, why: str) -> dict[str, object]:
    """Rerun from the start, or, for a log that starts mid-run, from the checkpoint the run started from."""
    if facts.starts_mid_run:
        step = facts.first_step - 1
        return {"checkpoint": None, "step": step,
                "why": f"{why} from the checkpoint this run was itself resumed from (the logs start at "
                f"{facts.step_unit} {facts.first_step}: at or before {facts.step_unit} {step}), or from the base "
                "model; not from step 0, which these logs do not show"}
    return {"checkpoint": None, "step": 0, "why": f"{why} from the start (or from the base model)"}


def _no_checkpoint(facts: RunFacts, onset: int, target: int, rollback: int, verified: str | None) -> dict[str, object]:
    """No qualifying checkpoint: say so and name the last step to resume at or before."""
    unit, first = facts.step_unit, facts.first_step
    if target < first and facts.starts_mid_run:
        # the logs start late: this run was itself resumed from a checkpoint near its first logged step
        step = first - 1
        lead = f"no checkpoint before the onset {onset} qualifies: {verified}" if verified is not None else \
            "no checkpoint found in the folder"
        return {"checkpoint": None, "step": step,
                "why": f"{lead}; the logs start at {unit} {first}, so the run was itself resumed from a checkpoint "
                f"at or before {unit} {step}: resume from that one (the newest you have at or before {unit} "
                f"{min(step, onset)}), not from {unit} 0"}
    if verified is not None and target < first:
        return {"checkpoint": None, "step": 0, "why": f"no checkpoint before the onset {onset} qualifies: "
                f"{verified}; the onset is within {rollback} {unit}s of the start of the log: restart from the "
                "beginning"}
    if verified is not None:
        step = max(first, target)
        return {"checkpoint": None, "step": step, "why": f"no checkpoint before the onset {onset} qualifies: "
                f"{verified}; resume from an earlier copy at or before {unit} {step} or restart"}
    if target < first:
        return {"checkpoint": None, "step": 0,
                "why": f"no checkpoint found in the folder and the onset ({unit} {onset}) is within {rollback} "
                f"{unit}s of the start of the log: restart from the beginning"}
    return {"checkpoint": None, "step": target,
            "why": f"no checkpoint found in the folder; resume from the newest checkpoint at or before {unit} "
            f"{target} ({rollback} {unit}s before the onset {onset})"}


def trial_length(facts: RunFacts, onset: int, resume: Mapping[str, object]) -> tuple[int, dict[str, object]]:
    """Steps each arm runs (through the onset plus a margin, at most :data:`TRIAL_MAX`), and the resume, said so."""
    epochs = facts.step_unit == "epoch"
    span = max(onset - int(resume["step"]), 0)  # type: ignore[call-overload]
    margin = (max(EPOCH_MARGIN_MIN, int(EPOCH_MARGIN_FRACTION * max(span, 1))) if epochs
              else max(MARGIN_MIN, int(MARGIN_FRACTION * span)))
    length = span + margin
    out = dict(resume)
    if not epochs and length > TRIAL_MAX:
        # a short trial stays short: when the onset is far from the resume point, say so instead of
        # proposing a trial as long as a training run
        out["why"] = str(resume["why"]) + (f"; the onset is {span} {facts.step_unit}s after this point, so each "
                                           f"trial runs {TRIAL_MAX} {facts.step_unit}s and the arm that passes "
                                           "continues from there")
        length = TRIAL_MAX
    return length, out
