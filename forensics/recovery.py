"""The recovery planner: a controlled recovery trial for each cause (DESIGN.md section 5).

Literature behind the defaults (docs/detectors.md#recovery-trial):
resume from the newest checkpoint at least 100 steps before the onset (PaLM, arXiv
2204.02311 section 5.1); short arms run through the onset plus a margin: unchanged with the
onset's batches skipped (PaLM skipped 200-500 batches), peak lr x0.5 and x0.25 with a
re-warm-up, global-norm clipping 1.0 (OPT-175B logbook; Wortsman et al. 2023 defaults), bf16
instead of fp16; rebuilding lost Adam moments with lr=0 for 5/(1-beta2) steps (BigScience).
Success criteria come from the run's own pre-onset statistics.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from forensics.model import RecoveryPlan, RunData, Trial

_CKPT_PATH = re.compile(r"\S*(?:checkpoint|ckpt|global_step)\S*\d\S*", re.I)

CLIP_BITES = 5.0
"""Above this pre-onset median grad norm, clipping at 1.0 would rescale every step: not proposed."""

ROLLBACK_MIN = 100
"""Steps before the onset the resume point must be at least (PaLM section 5.1)."""

TRIAL_MAX = 2000
"""Longest short trial, in steps (our choice: a trial is a probe, not a training run)."""

LATE_START = 1
"""A log whose first step is above this starts mid-run (the run was itself resumed)."""


def _checkpoints(run: RunData) -> list[tuple[int, str]]:
    """(step, path) of checkpoints known from the folder (``checkpoint-N``, ``step_N``...) and log events."""
    found: dict[int, str] = {}
    root = Path(run.run)
    pat = re.compile(r"(?:checkpoint|ckpt|step|iter|global_step)[-_]?(\d+)", re.I)
    if root.is_dir():
        for p in sorted(root.rglob("*")):
            m = pat.search(p.name)
            if m and (p.is_dir() or p.suffix in (".pt", ".bin", ".safetensors", ".ckpt", ".pth")):
                found.setdefault(int(m.group(1)), str(p.relative_to(root)))
    if run.events.height:
        for row in run.events.iter_rows(named=True):
            if row["kind"] in ("checkpoint_saved", "checkpoint_loaded") and row["step"] is not None:
                m = _CKPT_PATH.search(str(row["message"] or ""))
                name = m.group(0).rstrip(".,;:)") if m else f"checkpoint {row['step']}"
                found.setdefault(int(row["step"]), f"{name} (global step {row['step']}, "
                                 f"{row['kind'].replace('_', ' ')} in {row['source']})")
    return sorted(found.items())


def _finite_checkpoints(run: RunData, onset: int) -> tuple[list[tuple[int, str]], str]:
    """Checkpoints whose tensors were read and are all finite and complete, and a sentence on the rest.

    Returns:
        ``(qualifying, note)``: (step, path) in step order, and why the others before the onset were passed over.
    """
    import polars as pl

    incomplete = {c.get("path") for c in run.meta.get("checkpoints") or [] if not c.get("complete", True)}
    per = (run.tensors.filter(pl.col("step").is_not_null()).group_by("step", "checkpoint")
           .agg(pl.len().alias("n"), ((pl.col("n_nan") + pl.col("n_inf")) > 0).sum().alias("bad"))
           .sort("step", "checkpoint"))
    ok, passed = [], []
    for step, path, n, bad in per.iter_rows():
        if bad:
            passed.append(f"step {step} has {bad} of {n} tensors non-finite")
        elif path in incomplete:
            passed.append(f"step {step} is incomplete (missing or unreadable files)")
        else:
            ok.append((int(step), str(path), int(n)))
    steps_read = [int(r[0]) for r in per.iter_rows()]
    if any(c[0] < onset for c in ok):
        note = "its tensors (weights and optimizer state) were read: all finite"
    elif steps_read and min(steps_read) >= onset:  # nothing was saved before the onset, finite or not
        note = (f"the earliest checkpoint read is from step {min(steps_read)}, not before the onset: none holds the "
                "state from before it")
    else:
        note = "no checkpoint read before the onset has only finite, complete tensors"
    skipped = [p for p in passed if int(p.split()[1]) < onset]
    if skipped:
        note += "; passed over: " + ", ".join(skipped[:4])
    return [(s, p) for s, p, _ in ok], note


def _step_unit(run: RunData) -> str:
    """``"epoch"`` when the logs are numbered by epoch (e.g. ImageNet scripts), else ``"step"``."""
    units = {str(v.get("step_unit")) for v in run.meta.get("by_source", {}).values() if isinstance(v, dict)}
    return "epoch" if units == {"epoch"} else "step"


def _pre_onset_stats(run: RunData, onset: int, window: int = 128) -> dict[str, float]:
    out: dict[str, float] = {}
    for m in ("loss", "grad_norm", "throughput", "step_time"):
        s = run.series(m)
        if s is None:
            continue
        sel = (s.steps < onset) & np.isfinite(s.values)
        v = s.values[sel][-window:]
        if v.size >= 5:
            med = float(np.median(v))
            out[f"{m}_median"] = med
            out[f"{m}_sigma"] = float(1.4826 * np.median(np.abs(v - med)))
            out[f"{m}_p95"] = float(np.percentile(v, 95))
            out[f"{m}_p05"] = float(np.percentile(v, 5))
    lr = run.series("lr")
    if lr is not None and len(lr):
        v = lr.values[np.isfinite(lr.values)]
        if v.size:
            out["peak_lr"] = float(v.max())
            i_peak = int(np.argmax(lr.values == v.max()))
            out["warmup_steps"] = float(lr.steps[i_peak] - lr.steps[0])
    return out


def _g(x: float) -> str:
    return f"{x:.4g}"


def plan(run: RunData, cause: str | None, mechanism: str | None, onset: int | None,
         evidence: dict[str, object] | None = None, *, transient: bool = False) -> RecoveryPlan | None:
    """Build the recovery plan for one diagnosis.

    Args:
        run: The run (for checkpoints and pre-onset statistics).
        cause: Chosen cause family, or None when healthy (then no plan).
        mechanism: Mechanism within the cause.
        onset: First anomalous step.
        evidence: Evidence of the chosen cause's main finding (expected lr, batch index, ...).
        transient: The anomaly recovered by itself: monitor, do not go back to a checkpoint.

    Returns:
        A :class:`RecoveryPlan`, or None for a healthy run.
    """
    if cause is None or onset is None:
        return None
    if transient:
        return _monitor_plan(run, onset)
    ev = dict(evidence or {})
    stats = _pre_onset_stats(run, onset)
    ckpts = _checkpoints(run)
    verified: str | None = None
    if run.tensors.height:  # checkpoints were read: only finite, complete ones qualify
        ckpts, verified = _finite_checkpoints(run, onset)
    else:  # none could be read: still never one known to be cut or incomplete
        bad = {c.get("step") for c in run.meta.get("checkpoints") or [] if not c.get("complete", True)}
        ckpts = [c for c in ckpts if c[0] not in bad]
    unit = _step_unit(run)
    epochs = unit == "epoch"
    rollback = 1 if epochs else ROLLBACK_MIN
    target = onset - rollback
    first_logged = int(run.metrics.get_column("step").min()) if run.metrics.height else 0  # type: ignore[arg-type]
    at_resume = cause in ("lr_schedule_reset", "state_not_restored") or (
        mechanism == "nonfinite_state" and verified is not None)  # finiteness verified: no margin needed
    hw = cause == "hardware_or_distributed"
    short_margin = False
    if at_resume or hw:
        # the fault is in the resume (or the machine), not in the weights: the checkpoint is fine
        before = [c for c in ckpts if c[0] <= onset]
    else:
        before = [c for c in ckpts if c[0] <= target]
        if not before:
            before = [c for c in ckpts if c[0] < onset]
            short_margin = bool(before)
    if cause == "grad_scaling_bug":
        resume: dict[str, object] = {"checkpoint": None, "step": 0,
                                     "why": "the scaling is wrong from the first logged step: fix it and rerun "
                                     "from the start (or from the base model)"}
    elif before:
        step, path = before[-1]
        if short_margin:
            why = (f"the only checkpoint before the onset {onset} ({onset - step} {unit}s before it, less than "
                   f"the {rollback}-{unit} margin PaLM used: keep the trial's first steps under watch)")
        elif mechanism == "nonfinite_state":
            why = f"newest checkpoint before the onset {onset} whose tensors are all finite"
        elif at_resume:
            why = f"the checkpoint the faulty resume loaded ({unit} {step}); its weights are fine, the resume was not"
        elif hw:
            why = f"newest checkpoint before the fault at {unit} {onset}"
        else:
            why = f"newest checkpoint at least {rollback} {unit}s before the onset {onset}"
        if verified is not None:
            why += f"; {verified}"
        resume = {"checkpoint": path, "step": step, "why": why}
    elif verified is not None and target < first_logged:
        resume = {"checkpoint": None, "step": 0, "why": f"no checkpoint before the onset {onset} qualifies: "
                  f"{verified}; the onset is within {rollback} {unit}s of the start of the log: restart from the "
                  "beginning"}
    elif verified is not None:
        step = max(first_logged, target)
        resume = {"checkpoint": None, "step": step, "why": f"no checkpoint before the onset {onset} qualifies: "
                  f"{verified}; resume from an earlier copy at or before {unit} {step} or restart"}
    elif target < first_logged and first_logged > LATE_START:
        # the logs start late: this run was itself resumed from a checkpoint near its first logged step
        step = first_logged - 1
        resume = {"checkpoint": None, "step": step,
                  "why": f"no checkpoint found in the folder; the logs start at {unit} {first_logged}, so the run was "
                  f"itself resumed from a checkpoint at or before {unit} {step}: resume from that one (the newest "
                  f"you have at or before {unit} {min(step, onset)}), not from {unit} 0"}
    elif target < first_logged:
        resume = {"checkpoint": None, "step": 0,
                  "why": f"no checkpoint found in the folder and the onset ({unit} {onset}) is within {rollback} "
                  f"{unit}s of the start of the log: restart from the beginning"}
    else:
        resume = {"checkpoint": None, "step": target,
                  "why": f"no checkpoint found in the folder; resume from the newest checkpoint at or before {unit} "
                  f"{target} ({rollback} {unit}s before the onset {onset})"}
    span = max(onset - int(resume["step"]), 0)  # type: ignore[call-overload]
    margin = max(2, int(0.5 * max(span, 1))) if epochs else max(200, int(0.1 * span))
    length = span + margin
    if not epochs and length > TRIAL_MAX:
        # a short trial stays short: when the onset is far from the resume point, say so instead of
        # proposing a trial as long as a training run
        resume = {**resume, "why": str(resume["why"]) + f"; the onset is {span} {unit}s after this point, so each "
                  f"trial runs {TRIAL_MAX} {unit}s and the arm that passes continues from there"}
        length = TRIAL_MAX
    peak = stats.get("peak_lr")
    warm = int(stats.get("warmup_steps", 0) or 0)
    rewarm = max(50, min(warm, 2000)) if warm else 100
    rewarm = max(1, min(rewarm, length // 4))  # a re-warm-up is a small part of the trial, never longer than it
    gmed = stats.get("grad_norm_median")
    clip: float | None = 1.0 if gmed is None or gmed < CLIP_BITES else None
    clip_text = ("global-norm clipping 1.0" if clip else
                 f"the run's current clipping (pre-onset grad norms, median {_g(gmed or 0)}, are far above 1.0: "
                 "a threshold of 1.0 would rescale every step)")
    crit = _criteria(stats, length, unit=unit, hardware=cause == "hardware_or_distributed")
    from forensics.detectors.activation_overflow import is_fp16
    from forensics.detectors.notes import read_notes

    failed_remedies, ideas = read_notes(run)
    fp16 = bool(is_fp16(run))
    restore: list[str] = []
    trials: list[Trial] = []
    do_not: list[str] = []
    if cause == "lr_schedule_reset":
        exp = ev.get("expected_lr")
        restore += [
            "restore the LR scheduler state (scheduler.load_state_dict) from the checkpoint"
            + (f"; the lr at step {onset} should be {_g(float(exp))}" if isinstance(exp, (int, float)) else ""),
            "restore the optimizer state (optimizer.load_state_dict) too: chainable schedulers derive the next lr "
            "from the optimizer's param_groups, so restoring only the scheduler is not enough",
            "check the resumed lr against the schedule on the first logged step before letting it run",
        ]
        trials.append(Trial("scheduler restored", "resume with the scheduler and optimizer state restored; "
                            "nothing else changed", length, {"restore_scheduler": True, "restore_optimizer": True}))
        if mechanism == "horizon_change":
            trials.append(Trial("original horizon", "keep the original total steps / decay horizon of the first "
                                "launch (max_steps, num_train_epochs, lr-decay-iters)", length, {"keep_horizon": True}))
        do_not.append("do not lower the peak lr: the schedule, not its level, changed")
    elif cause == "overflow" and mechanism == "nonfinite_state":
        restore.append("resume from the newest checkpoint whose weights AND optimizer moments are all finite "
                       "(verified tensor by tensor)")
        restore.append("if only the moments went bad: keep the weights, rebuild the Adam moments with lr=0 for "
                       "5/(1-beta2) steps, then resume the schedule")
        trials.append(Trial("finite checkpoint", "resume unchanged from the verified finite checkpoint and watch the "
                            "optimizer state (non-finite checks on exp_avg/exp_avg_sq every save)", length, {}))
        trials.append(Trial("rebuilt moments", "load the weights, reset exp_avg/exp_avg_sq, run lr=0 for 5/(1-beta2) "
                            "steps, then resume", length, {"reset_optimizer_moments": True}))
        if fp16:
            trials.append(Trial("bf16", "train in bf16 instead of fp16", length, {"precision": "bf16"}))
        do_not.append("never resume from a checkpoint with non-finite weights or optimizer moments")
    elif cause == "overflow":
        module = ev.get("module") if "/" in str(ev.get("metric", "")) else "attention scores (q.k) and softmax"
        trials.append(Trial("bf16", "train in bf16 instead of fp16 (same range as fp32, no loss scaler needed)",
                            length, {"precision": "bf16"}))
        trials.append(Trial("fp32 for the offending block", "keep fp16 but run the overflowing block (attention "
                            "softmax/scores or the FFN output) in fp32; unscale gradients before clipping",
                            length, {"precision": "fp16", "fp32_modules": module}))
        restore.append("never resume from a checkpoint with non-finite weights or optimizer moments")
        restore.append("reset the loss scaler to its initial scale on resume")
        growth = ev.get("growth_precursor")
        if mechanism == "activation_overflow" and not growth:
            do_not.append("do not lower the lr: the overflow is in the forward pass, a lower lr does not bound "
                          "activations")
        else:
            why = (f"{growth['mechanism']} from step {growth['step']} precedes the overflow"  # type: ignore[index]
                   if isinstance(growth, dict) else "a loss-scale collapse is often a symptom of growing updates")
            trials.append(Trial("lr x0.5", f"peak lr x0.5 with a re-warm-up and {clip_text} ({why})", length,
                                {"peak_lr_factor": 0.5, "peak_lr": peak and peak * 0.5, "warmup_steps": rewarm,
                                 "clip_grad_norm": clip}))
            if isinstance(growth, dict) and growth.get("mechanism") == "attention_logit_growth":
                trials.append(Trial("qk-layernorm", "add qk-layernorm so attention logits stay bounded in fp16",
                                    length, {"qk_layernorm": True}))
    elif cause == "data_batch" and mechanism == "ordering":
        trials.append(Trial("fix the data order", "resume with a proper shuffle of the sample order (a pseudo-random "
                            "permutation such as a Feistel network instead of an affine a*x+b mod N index permutation) "
                            "and compare the train loss with the failed run over the same steps", length,
                            {"shuffle": "feistel"}))
        trials.append(Trial("inspect the stream", f"dump the batches around step {onset} and check for correlated runs "
                            "of documents from one source or a mixture boundary", 0,
                            {"inspect_batches": [onset, onset + 200]}))
        restore.append("restore the data-sampler state so both arms see the same tokens up to the onset")
        do_not.append("do not lower the lr: the eval loss and the lr are smooth, only the training stream changed")
    elif cause == "data_batch":
        bi = ev.get("batch_index")
        lo = onset if bi is None else int(bi)  # type: ignore[arg-type]
        skip = [lo, lo + 199]
        named = f" (batch index {bi} at step {onset})" if bi is not None else ""
        trials.append(Trial("skip batches", f"resume unchanged and skip the batches {skip[0]}..{skip[1]}{named} "
                            "(PaLM skipped 200-500 batches)", length, {"skip_batches": skip}))
        trials.append(Trial("replay", "resume unchanged WITHOUT skipping to check the spike reproduces on the same "
                            "data (confirms the batch, rules out hardware)", length, {"skip_batches": None}))
        restore.append("restore the data-sampler position so the skip range is exact")
        restore.append("inspect the named samples (empty, repeated-token, fully masked or corrupt sequences)")
        do_not.append("do not lower the lr: nothing before the spike shows the optimizer was unstable")
    elif cause == "update_scale_growth" and mechanism in ("lr_too_high", "init_scale", None) and (
            "lower_lr" in failed_remedies):
        # the notes say lower learning rates were tried and failed: propose what was not tried
        do_not.append("do not lower the lr again: the notes record lower lr attempts that failed ("
                      + _clip_words(failed_remedies["lower_lr"][0], 120) + ")")
        trials += _idea_trials(ideas, length, fp16)
        if not trials:
            trials.append(Trial("smaller init std", "restart with a smaller initialisation std (e.g. "
                                "--init-method-std 0.006 or sqrt(2/(5*hidden)); Le Scao et al. 2022, Takase et al. "
                                "'Spike No More')", length, {"init_std": "smaller"}))
        restore.append("restore optimizer and scheduler state from the checkpoint (only the trial knobs change)")
    elif cause == "update_scale_growth":
        if mechanism == "attention_logit_growth":
            trials.append(Trial("qk-layernorm", "add qk-layernorm (LayerNorm on queries and keys before the dot "
                                "product; Wortsman et al. 2023, Dehghani et al. 2023) and resume",
                                length, {"qk_layernorm": True}))
        if mechanism == "output_logit_divergence":
            trials.append(Trial("z-loss", "add z-loss 1e-4 * log^2 Z on the output logits (PaLM; Wortsman et al. "
                                "2023), or a logit soft-cap", length, {"z_loss": 1e-4}))
        if mechanism != "output_logit_divergence":
            if "spike_steps" in ev and warm:  # WU01: spikes while the lr ramps up (docs/detectors.md#wu01)
                trials.append(Trial("longer warm-up", f"the same peak lr reached over a warm-up twice as long "
                                    f"({2 * warm} steps instead of {warm}) and {clip_text}", length,
                                    {"warmup_steps": 2 * warm, "clip_grad_norm": clip}))
            trials.append(Trial("lr x0.5", "peak lr x0.5 with a re-warm-up of "
                                f"{rewarm} steps and {clip_text}", length,
                                {"peak_lr_factor": 0.5, "peak_lr": peak and peak * 0.5, "warmup_steps": rewarm,
                                 "clip_grad_norm": clip}))
            trials.append(Trial("lr x0.25", f"peak lr x0.25 with the same re-warm-up and {clip_text}", length,
                                {"peak_lr_factor": 0.25, "peak_lr": peak and peak * 0.25, "warmup_steps": rewarm,
                                 "clip_grad_norm": clip}))
            if fp16:
                trials.append(Trial("bf16", "train in bf16 instead of fp16: loss-scale swings and 1e5 grad norms "
                                    "stop mattering (BigScience's stable 176B run changed to bf16)", length,
                                    {"precision": "bf16"}))
            trials += _idea_trials(ideas, length, fp16)
        else:
            trials.append(Trial("weight decay on the head", "keep the lr; apply weight decay to the output layer "
                                "and check that the lm_head norm stops accelerating", length,
                                {"head_weight_decay": True}))
            do_not.append("do not lower the lr: the divergence grows at a low lr; it is the logits, not the step size")
        restore.append("restore optimizer and scheduler state from the checkpoint (only the trial knobs change)")
    elif cause == "hardware_or_distributed":
        if mechanism == "collective_bug":
            trials.append(Trial("overlap_comm off", "disable DeepSpeed overlap_comm (or raise reduce_bucket_size, "
                                "or change the deepspeed version) and resume unchanged otherwise", length,
                                {"overlap_comm": False}))
        else:
            trials.append(Trial("exclude the node", "exclude (drain) the faulty node/GPU, run a benchmark or GPU "
                                "burn-in on it, and resume unchanged on other nodes", length, {"exclude_node": True}))
        do_not.append("do not change hyper-parameters or go further back: the model is fine, the machine is not")
        do_not.append("do not lower the lr and do not skip data: neither addresses a hardware fault")
    elif cause == "grad_scaling_bug":
        trials.append(Trial("fix the scaling", "fix the constant-factor scaling (e.g. upgrade transformers / patch the "
                            "loss normalisation by num_items_in_batch, or the adapter scale alpha/rank) and rerun",
                            length, {}))
        do_not.append("do not lower the lr or go back to an earlier checkpoint: the run is consistently mis-scaled, "
                      "not unstable")
    elif cause == "state_not_restored":
        restore.append("resume again and verify what is loaded: weights, optimizer moments, scheduler, data sampler")
        restore.append("if optimizer moments were lost: run with lr=0 for 5/(1-beta2) steps to rebuild them, "
                       "then resume")
        trials.append(Trial("verified resume", "resume with every state verified against the checkpoint", length, {}))
    else:  # unknown
        if "lower_lr" in failed_remedies:
            do_not.append("do not lower the lr again: the notes record lower lr attempts that failed ("
                          + _clip_words(failed_remedies["lower_lr"][0], 120) + ")")
        trials.append(Trial("replay unchanged", "resume from the checkpoint unchanged to see whether the failure "
                            "reproduces (data or hardware) or not", length, {}))
        if "lower_lr" not in failed_remedies:
            trials.append(Trial("lr x0.5 + clip", f"peak lr x0.5 with a re-warm-up and {clip_text}", length,
                                {"peak_lr_factor": 0.5, "warmup_steps": rewarm, "clip_grad_norm": clip}))
        if "skip_data" not in failed_remedies and "reshuffle_data" not in failed_remedies:
            trials.append(Trial("skip batches", f"resume and skip the batches around the onset "
                                f"({onset}..{onset + 199})", length, {"skip_batches": [onset, onset + 199]}))
        trials += _idea_trials(ideas, length, fp16)
    if "skip_data" in failed_remedies and cause != "data_batch":
        do_not.append("do not skip data again: the notes record data skips that did not help ("
                      + _clip_words(failed_remedies["skip_data"][0], 120) + ")")
    if resume.get("checkpoint") is None and resume.get("step") == 0:
        # a restart from scratch: nothing to restore, keep everything else identical across arms
        restore = [r for r in restore if "checkpoint" not in r and "resum" not in r]
        restore.append("start every arm from the same initialisation and data order (same seed) so they compare")
        trials = [Trial(t.name, t.change.replace(" and resume", " and rerun from the start"), t.steps, t.settings)
                  for t in trials]
    trials = [_with_launch_args(t, str(run.meta.get("framework") or ""), resume) for t in
              {t.name: t for t in trials}.values()]
    return RecoveryPlan(resume_from=resume, restore=tuple(restore), trials=tuple(trials[:4]),
                        success_criteria=tuple(crit), do_not=tuple(do_not))


def _with_launch_args(trial: Trial, framework: str, resume: dict[str, object]) -> Trial:
    """Add ready-to-paste settings for the detected framework to a trial's settings.

    Hugging Face: ``TrainingArguments`` keys; Megatron-LM: command-line flags. Only the knobs the
    trial changes are written; everything else stays as in the failed run.
    """
    st = dict(trial.settings)
    ckpt = resume.get("checkpoint")
    if framework.startswith("hf"):
        args: dict[str, object] = {}
        if ckpt:
            args["resume_from_checkpoint"] = str(ckpt).split(" (")[0]
        if st.get("peak_lr"):
            args["learning_rate"] = float(f"{float(st['peak_lr']):.4g}")
        if st.get("warmup_steps"):
            args["warmup_steps"] = int(st["warmup_steps"])
        if st.get("clip_grad_norm"):
            args["max_grad_norm"] = float(st["clip_grad_norm"])
        if st.get("precision") == "bf16":
            args.update({"bf16": True, "fp16": False})
        if args:
            st["hf_training_arguments"] = args
    elif framework in ("megatron", "deepspeed"):
        flags: list[str] = []
        if st.get("peak_lr"):
            flags += [f"--lr {float(st['peak_lr']):.4g}", "--override-opt_param-scheduler"]
        if st.get("warmup_steps"):
            flags.append(f"--lr-warmup-iters {int(st['warmup_steps'])}")
        if st.get("clip_grad_norm"):
            flags.append(f"--clip-grad {float(st['clip_grad_norm'])}")
        if st.get("precision") == "bf16":
            flags.append("--bf16")
        sk = st.get("skip_batches")
        if isinstance(sk, (list, tuple)) and len(sk) == 2:
            flags.append(f"--skip-train-iteration-range {sk[0]}-{sk[1]}")
        if flags:
            st["megatron_flags"] = flags
    return Trial(trial.name, trial.change, trial.steps, st)


def _clip_words(text: str, limit: int) -> str:
    """``text`` cut at a word boundary to at most ``limit`` characters (with an ellipsis)."""
    if len(text) <= limit:
        return text
    return text[:limit].rsplit(" ", 1)[0] + "..."


def _idea_trials(ideas: dict[str, list[str]], length: int, fp16: bool) -> list[Trial]:
    """Trials for the remedies the notes list as open ideas."""
    out = []
    if "init_std" in ideas:
        out.append(Trial("smaller init std", "restart FROM SCRATCH (the initialisation only acts at step 0) with a "
                         "smaller initialisation std (--init-method-std, e.g. 0.006 instead of 0.02), as the run's "
                         "notes propose", length,
                         {"init_std": "smaller", "notes": _clip_words(ideas["init_std"][0], 200)}))
    if "precision" in ideas:
        out.append(Trial("bf16" if fp16 else "fp32 softmax", "bf16 instead of fp16, or fp32 for the softmax/attention "
                         "(the notes propose it)", length, {"precision": "bf16" if fp16 else "fp32"}))
    if "qk_norm" in ideas:
        out.append(Trial("qk-layernorm", "add qk-layernorm (the notes propose it)", length, {"qk_layernorm": True}))
    if "z_loss" in ideas:
        out.append(Trial("z-loss", "add z-loss 1e-4 (the notes propose it)", length, {"z_loss": 1e-4}))
    return out


def _criteria(stats: dict[str, float], length: int, unit: str = "step", hardware: bool = False) -> list[str]:
    """Success criteria from the run's own pre-onset statistics (robust, not absolute thresholds)."""
    out = []
    if "loss_median" in stats:
        out.append(f"no loss spike beyond 6 robust sigmas of the trailing 128 {unit}s through the {length}-{unit} "
                   f"trial (pre-onset loss median {_g(stats['loss_median'])}, robust sigma {_g(stats['loss_sigma'])})")
        out.append(f"past the onset, the loss stays within 3 robust sigmas of the pre-onset level "
                   f"({_g(stats['loss_median'])} +- {_g(3 * stats['loss_sigma'])}) or below it, and keeps decreasing")
    if "grad_norm_median" in stats:
        out.append(f"the grad norm's rolling median stays within 2x of its pre-onset median "
                   f"({_g(stats['grad_norm_median'])}) and no grad-norm spike beyond 6 robust sigmas appears")
    for m, better in (("throughput", "at or above"), ("step_time", "at or below")):
        if hardware and f"{m}_median" in stats:
            out.append(f"{m.replace('_', ' ')} back {better} its pre-onset median ({_g(stats[f'{m}_median'])}) "
                       "within 3% on the new hardware")
    out.append("`forensics analyze` on the trial run reports it healthy")
    return out


def _monitor_plan(run: RunData, onset: int) -> RecoveryPlan:
    """Plan for a transient anomaly: keep training and monitor; nothing to undo."""
    stats = _pre_onset_stats(run, onset)
    last = int(run.metrics.get_column("step").max()) if run.metrics.height else onset  # type: ignore[arg-type]
    crit = _criteria(stats, 1000)[:-1]
    crit.append("`forensics analyze` on the continuing run stays healthy over the next 1000 steps")
    return RecoveryPlan(
        resume_from={"checkpoint": None, "step": last,
                     "why": "no resume needed: the run recovered by itself; keep training from where it is"},
        restore=(),
        trials=(Trial("monitor", "keep training and monitor the loss and grad norm; if a second spike "
                      "follows within a few thousand steps, treat it as an anomaly and analyse again", 1000,
                      {"action": "monitor"}),),
        success_criteria=tuple(crit),
        do_not=("do not go back to an earlier checkpoint or change hyper-parameters for a spike that recovered",),
    )
