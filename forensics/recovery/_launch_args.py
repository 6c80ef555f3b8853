"""Ready-to-paste settings for the detected framework, added to each trial arm.

Hugging Face: ``TrainingArguments`` keys; Megatron-LM / DeepSpeed: command-line flags. Only the knobs the
trial changes are written; everything else stays as in the failed run.
"""

from __future__ import annotations

from collections.abc import Mapping

from forensics.model import Trial


def _hf_arguments(st: Mapping[str, object], ckpt: object) -> dict[str, object]:
    args: dict[str, object] = {}
    if ckpt:
        args["resume_from_checkpoint"] = str(ckpt).split(" (")[0]
    if st.get("peak_lr"):
        args["learning_rate"] = float(f"{float(st['peak_lr']):.4g}")  # type: ignore[arg-type]
    if st.get("warmup_steps"):
        args["warmup_steps"] = int(st["warmup_steps"])  # type: ignore[call-overload]
    if st.get("clip_grad_norm"):
        args["max_grad_norm"] = float(st["clip_grad_norm"])  # type: ignore[arg-type]
    if st.get("precision") == "bf16":
        args.update({"bf16": True, "fp16": False})
    return args


def _megatron_flags(st: Mapping[str, object]) -> list[str]:
    flags: list[str] = []
    if st.get("peak_lr"):
        flags += [f"--lr {float(st['peak_lr']):.4g}", "--override-opt_param-scheduler"]  # type: ignore[arg-type]
    if st.get("warmup_steps"):
        flags.append(f"--lr-warmup-iters {int(st['warmup_steps'])}")  # type: ignore[call-overload]
    if st.get("clip_grad_norm"):
        flags.append(f"--clip-grad {float(st['clip_grad_norm'])}")  # type: ignore[arg-type]
    if st.get("precision") == "bf16":
        flags.append("--bf16")
    sk = st.get("skip_batches")
    if isinstance(sk, (list, tuple)) and len(sk) == 2:
        flags.append(f"--skip-train-iteration-range {sk[0]}-{sk[1]}")
    return flags


def with_launch_args(trial: Trial, framework: str, resume: Mapping[str, object]) -> Trial:
    """``trial`` with ``hf_training_arguments`` or ``megatron_flags`` added to its settings (when any apply)."""
    st = dict(trial.settings)
    if framework.startswith("hf"):
        args = _hf_arguments(st, resume.get("checkpoint"))
        if args:
            st["hf_training_arguments"] = args
    elif framework in ("megatron", "deepspeed"):
        flags = _megatron_flags(st)
        if flags:
            st["megatron_flags"] = flags
    return Trial(trial.name, trial.change, trial.steps, st)
