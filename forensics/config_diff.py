"""A run's configuration in canonical keys, and the differences between a proxy and its target.

:func:`extract_config` reads every configuration a run folder carries (``config.json``/``*.yaml``
files, W&B ``config.yaml`` with its ``{"key": {"value": v}}`` wrapping, TensorBoard hparams, Hugging
Face ``TrainingArguments``, Megatron-LM/DeepSpeed arguments printed in the log) into one flat dict of
the canonical settings of :data:`CANONICAL`. :func:`diff` lists every setting that differs between two
such dicts, each with whether it matters for transferring hyper-parameters from a proxy to a target
and why (the mechanism and its source, :func:`why_matters`).

Sources of the mechanisms: Wortsman et al. 2023, "Small-scale proxies for large-scale Transformer
training instabilities", arXiv 2309.14322 (attention-logit growth and qk-layernorm s3.1.1, output-logit
divergence and z-loss s3.1.2, warm-up s3.2.1, independent weight decay s3.2.2, muParam s3.2: numbers
checked against its table of contents; AdamW epsilon s3.4: as recalled, not checked); Yang et al. 2022
(muP/muTransfer), arXiv 2203.03466; Chowdhery et al. 2022 (PaLM z-loss), arXiv 2204.02311.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from forensics.model import RunData

CANONICAL = (
    "peak_lr", "lr_schedule", "warmup_steps", "warmup_tokens", "total_steps", "global_batch_size", "grad_accum",
    "seq_len", "optimizer", "beta1", "beta2", "eps", "weight_decay", "precision", "init_std", "d_model",
    "n_layers", "n_heads", "norm", "norm_eps", "qk_layernorm", "z_loss", "mup", "clip_grad_norm",
)
"""The canonical settings, in report order."""

ALIASES: dict[str, tuple[str, ...]] = {
    "peak_lr": ("peak_lr", "max_lr", "lr", "learning_rate", "base_lr", "optimizer.params.lr", "optim.lr"),
    "lr_schedule": ("lr_schedule", "lr_scheduler_type", "lr_decay_style", "lr_scheduler", "scheduler",
                    "schedule", "scheduler.type", "scheduler.name"),
    "warmup_steps": ("warmup_steps", "warmup", "lr_warmup_iters", "lr_warmup_steps", "num_warmup_steps",
                     "warmup_iters", "scheduler.params.warmup_num_steps"),
    "warmup_tokens": ("warmup_tokens", "lr_warmup_tokens"),
    "total_steps": ("total_steps", "max_steps", "train_iters", "num_training_steps", "max_iters", "steps",
                    "train_steps", "max_train_steps"),
    "global_batch_size": ("global_batch_size", "total_batch_size", "global_train_batch_size"),
    "grad_accum": ("grad_accum", "gradient_accumulation_steps", "accumulate_grad_batches", "grad_accum_steps"),
    "seq_len": ("seq_len", "seq_length", "max_seq_length", "max_seq_len", "block_size", "context_length",
                "sequence_length", "n_ctx"),
    "optimizer": ("optimizer", "optim", "optimizer.type", "optimizer.name", "optimizer_type"),
    "beta1": ("beta1", "adam_beta1", "b1"),
    "beta2": ("beta2", "adam_beta2", "b2"),
    "eps": ("eps", "adam_eps", "adam_epsilon", "optimizer.params.eps", "epsilon"),
    "weight_decay": ("weight_decay", "wd", "optimizer.params.weight_decay"),
    "precision": ("precision", "mixed_precision", "dtype", "params_dtype", "compute_dtype"),
    "init_std": ("init_std", "init_method_std", "initializer_range", "init_scale"),
    "d_model": ("d_model", "hidden_size", "n_embd", "dim", "model_dim", "emb_dim", "embed_dim", "width"),
    "n_layers": ("n_layers", "num_layers", "num_hidden_layers", "n_layer", "depth"),
    "n_heads": ("n_heads", "num_attention_heads", "n_head", "num_heads"),
    "norm": ("norm", "normalization", "norm_type", "layer_norm_type", "norm_placement"),
    "norm_eps": ("norm_eps", "layernorm_epsilon", "layer_norm_eps", "layer_norm_epsilon", "rms_norm_eps", "ln_eps"),
    "qk_layernorm": ("qk_layernorm", "qk_norm", "qk_ln", "use_qk_norm", "qk_layer_norm", "attention_qk_norm"),
    "z_loss": ("z_loss", "z_loss_coef", "z_loss_weight", "zloss", "z_loss_coefficient"),
    "mup": ("mup", "use_mup", "mup_enabled", "mup_base_width", "mup_width_multiplier"),
    "clip_grad_norm": ("clip_grad_norm", "clip_grad", "max_grad_norm", "grad_clip", "gradient_clipping", "clip"),
}
"""Names under which each setting is found (dotted names match the end of a nested key path)."""

_MICRO_BATCH = ("micro_batch_size", "per_device_train_batch_size", "train_micro_batch_size_per_gpu",
                "batch_size", "train_batch_size")
_DATA_PARALLEL = ("data_parallel_size", "dp_size", "world_size", "n_gpu", "num_processes")
_WARMUP_FRACTION = ("warmup_ratio", "lr_warmup_fraction", "warmup_fraction")


# ----------------------------------------------------------------------------------------------- reading


def unwrap_wandb(cfg: Any) -> Any:
    """Unwrap W&B's ``{"key": {"value": v, "desc": ...}}`` config layout to ``{"key": v}`` (``_wandb`` dropped)."""
    if not isinstance(cfg, Mapping):
        return cfg
    wrapped = [v for k, v in cfg.items() if isinstance(v, Mapping) and "value" in v and set(v) <= {"value", "desc"}]
    if wrapped and len(wrapped) >= 0.5 * len([k for k in cfg if k != "_wandb"]):
        return {k: (v["value"] if isinstance(v, Mapping) and "value" in v else v)
                for k, v in cfg.items() if k != "_wandb"}
    return cfg


def _flat(obj: Any, prefix: str = "", depth: int = 4) -> Iterator[tuple[str, Any]]:
    if isinstance(obj, Mapping) and depth > 0:
        for k, v in obj.items():
            yield from _flat(v, f"{prefix}{str(k).lower()}.", depth - 1)
    elif prefix:
        yield prefix[:-1], obj


def _sources(run: RunData) -> list[tuple[str, dict[str, Any]]]:
    """(label, flat config) of every configuration the run carries, most explicit first."""
    meta = run.meta
    out: list[tuple[str, dict[str, Any]]] = []
    files = meta.get("config_files") or {}
    for rel in sorted(files, key=lambda r: (r.count("/"), r)):
        cfg = unwrap_wandb(files[rel])
        if isinstance(cfg, Mapping):
            out.append((rel, dict(_flat(cfg))))
    for rel, src in (meta.get("by_source") or {}).items():
        if not isinstance(src, Mapping):
            continue
        for key in ("config", "args", "deepspeed_config", "hparams"):
            if isinstance(src.get(key), Mapping):
                out.append((f"{rel}:{key}", dict(_flat(unwrap_wandb(src[key])))))
        scalars = {k: v for k, v in src.items() if k in ("max_steps", "train_batch_size", "precision")}
        if scalars:
            out.append((f"{rel}:state", scalars))
    if isinstance(meta.get("hparams"), Mapping) and meta["hparams"]:
        out.append(("hparams", dict(_flat(meta["hparams"]))))
    return out


def _find(sources: list[tuple[str, dict[str, Any]]], names: tuple[str, ...]) -> tuple[Any, str] | None:
    """First value whose key path equals or ends with one of ``names`` (names in priority order)."""
    for name in names:
        for label, flat in sources:
            for path, value in flat.items():
                if value is None or value == "":
                    continue
                if path == name or path.endswith("." + name):
                    return value, f"{label}:{path}"
    return None


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        f = float(value.strip() if isinstance(value, str) else value)
    except ValueError:
        return None
    return f if math.isfinite(f) else None


def _bool(value: Any) -> bool | None:
    if isinstance(value, bool | int | float | Mapping):
        return bool(value)
    v = str(value).strip().lower()
    return True if v in ("true", "yes", "on", "1", "enabled") else (
        False if v in ("false", "no", "off", "0", "none", "disabled", "") else None)


def canonical_precision(value: Any) -> str | None:
    """``"bf16"``, ``"fp16"``, ``"fp32"``, ``"fp8"`` from the many spellings (``bf16-mixed``, ``16``, ``float16``)."""
    if value is None or isinstance(value, bool):
        return None
    v = str(value).strip().lower().replace("torch.", "")
    for name, marks in (("bf16", ("bf16", "bfloat16")), ("fp8", ("fp8", "float8")), ("fp16", ("fp16", "float16"))):
        if any(m in v for m in marks):
            return name
    return {"16": "fp16", "16-mixed": "fp16", "half": "fp16", "amp": "fp16", "32": "fp32", "32-true": "fp32",
            "float32": "fp32", "float": "fp32", "no": "fp32", "full": "fp32"}.get(v, v or None)


def _int(value: Any) -> int | None:
    return None if (f := _num(value)) is None else int(round(f))


def extract_config(run: RunData) -> dict[str, Any]:
    """The run's settings in canonical keys (:data:`CANONICAL`); a setting not found is left out.

    Derived values: ``beta1``/``beta2`` from a ``betas`` pair; ``precision`` from ``bf16``/``fp16`` flags;
    ``global_batch_size`` = micro batch x gradient accumulation x data-parallel size when not given;
    ``warmup_steps`` = warm-up fraction x total steps when only a fraction is given (HF ``warmup_ratio``);
    ``warmup_tokens`` = warmup_steps x global_batch_size x seq_len when all three are known.

    Args:
        run: A loaded run (:func:`forensics.api.load`).

    Returns:
        ``{setting: value}`` plus ``"_found"``: ``{setting: "source:key"}`` saying where each came from.
    """
    src = _sources(run)
    cfg: dict[str, Any] = {}
    found: dict[str, str] = {}

    def take(key: str, names: tuple[str, ...], conv: Any) -> None:
        hit = _find(src, names)
        if hit is None:
            return
        value = conv(hit[0])
        if value is not None:
            cfg[key], found[key] = value, hit[1]

    for key in ("peak_lr", "eps", "weight_decay", "init_std", "norm_eps", "clip_grad_norm", "beta1", "beta2"):
        take(key, ALIASES[key], _num)
    for key in ("total_steps", "warmup_steps", "warmup_tokens", "global_batch_size", "grad_accum", "seq_len",
                "d_model", "n_layers", "n_heads"):
        take(key, ALIASES[key], lambda v: (i if (i := _int(v)) is not None and i >= 0 else None))
    if cfg.get("total_steps") == 0:
        cfg.pop("total_steps")
    for key in ("lr_schedule", "optimizer", "norm"):
        take(key, ALIASES[key], lambda v: str(v) if isinstance(v, str | int | float) else None)
    take("qk_layernorm", ALIASES["qk_layernorm"], _bool)
    take("mup", ALIASES["mup"], lambda v: _bool(v) if _bool(v) is not None else True)
    take("z_loss", ALIASES["z_loss"], lambda v: _num(v) if _num(v) is not None else (
        (1e-4 if _bool(v) else 0.0) if _bool(v) is not None else None))
    take("precision", ALIASES["precision"], canonical_precision)
    if "precision" not in cfg:
        for flag in ("bf16", "fp16"):
            hit = _find(src, (flag,))
            if hit and _bool(hit[0]):
                cfg["precision"], found["precision"] = flag, hit[1]
                break
    if "beta1" not in cfg or "beta2" not in cfg:
        hit = _find(src, ("betas", "adam_betas", "optimizer.params.betas"))
        if hit is not None:
            pair = hit[0] if isinstance(hit[0], list | tuple) else re.findall(r"[-+0-9.eE]+", str(hit[0]))
            if len(pair) == 2 and all(_num(b) is not None for b in pair):
                cfg["beta1"], cfg["beta2"] = _num(pair[0]), _num(pair[1])
                found["beta1"] = found["beta2"] = hit[1]
    _derive(src, cfg, found)
    cfg["_found"] = found
    return cfg


def _derive(src: list[tuple[str, dict[str, Any]]], cfg: dict[str, Any], found: dict[str, str]) -> None:
    if "global_batch_size" not in cfg:
        ds = [s for s in src if s[0].endswith(":deepspeed_config")]
        hit = _find(ds, ("train_batch_size",)) if ds else None
        micro = _find(src, _MICRO_BATCH)
        if hit is not None and _int(hit[0]):
            cfg["global_batch_size"], found["global_batch_size"] = _int(hit[0]), hit[1]
        elif micro is not None and _int(micro[0]):
            dp = _find(src, _DATA_PARALLEL)
            n = _int(micro[0]) * (cfg.get("grad_accum") or 1) * ((_int(dp[0]) or 1) if dp else 1)
            cfg["global_batch_size"] = n
            found["global_batch_size"] = f"{micro[1]} x grad_accum x data-parallel"
    if "warmup_steps" not in cfg and cfg.get("total_steps"):
        hit = _find(src, _WARMUP_FRACTION)
        if hit is not None and _num(hit[0]) is not None:
            cfg["warmup_steps"] = int(round(_num(hit[0]) * cfg["total_steps"]))
            found["warmup_steps"] = f"{hit[1]} x total_steps"
    if "warmup_tokens" not in cfg and all(cfg.get(k) is not None for k in
                                          ("warmup_steps", "global_batch_size", "seq_len")):
        cfg["warmup_tokens"] = cfg["warmup_steps"] * cfg["global_batch_size"] * cfg["seq_len"]
        found["warmup_tokens"] = "warmup_steps x global_batch_size x seq_len"


# ----------------------------------------------------------------------------------------------- rules

W23 = "Wortsman et al. 2023, arXiv 2309.14322"
_FP16_MAX = 65504.0


def _ratio(p: Any, t: Any) -> float | None:
    return _num(t) / fp if (fp := _num(p)) and _num(t) is not None else None  # type: ignore[operator]


def _x(r: float | None) -> str:
    return "" if r is None else f" (x{r:.3g})"


def why_matters(key: str, p: Any, t: Any, pc: Mapping[str, Any], tc: Mapping[str, Any]) -> tuple[bool, str]:
    """Whether a proxy -> target change of one setting matters for transfer, and why (mechanism, source).

    Args:
        key: Canonical setting.
        p: Proxy value (``None`` when not recorded).
        t: Target value (``None`` when not recorded).
        pc: The proxy's whole canonical config (context: batch, muP...).
        tc: The target's whole canonical config.

    Returns:
        ``(matters, why)``.
    """
    r = _ratio(p, t)
    pb, tb = pc.get("global_batch_size"), tc.get("global_batch_size")
    if key == "qk_layernorm":
        if p and not t:
            return True, ("qk-layernorm dropped: without a norm on queries and keys the q.k logits grow with lr and "
                          f"scale until attention collapses to one-hot (attention-logit growth; {W23} s3.1.1; "
                          "Dehghani et al. 2023, arXiv 2302.05442)")
        return False, "qk-layernorm added in the target: a stabiliser, it cannot explain a target instability"
    if key == "z_loss":
        if (_num(p) or 0) > 0 and not (_num(t) or 0) > 0:
            return True, ("z-loss dropped: nothing holds log Z near 0, so the output logits can drift away from the "
                          f"log-probabilities (output-logit divergence; {W23} s3.1.2; PaLM z-loss 1e-4 log^2 Z, "
                          "Chowdhery et al. 2022, arXiv 2204.02311)")
        return (_num(t) or 0) < (_num(p) or 0), "z-loss coefficient changed (output-logit control; " + W23 + " s3.1.2)"
    if key == "peak_lr":
        return True, (f"peak lr {p} -> {t}{_x(r)}: Adam's update size scales with the lr; at high lr small models "
                      f"already show attention-logit growth and output-logit divergence ({W23} s3.1), and under "
                      "standard parametrisation the best lr moves with width (Yang et al. 2022, arXiv 2203.03466)")
    if key in ("warmup_steps", "warmup_tokens"):
        ps, ts = pc.get("warmup_steps"), tc.get("warmup_steps")
        if key == "warmup_tokens" and same(ps, ts) and pb and tb and not same(pb, tb):
            return True, (f"warm-up kept at {ps} steps while the global batch went {pb} -> {tb}{_x(_ratio(pb, tb))}: "
                          f"warm-up tokens {p} -> {t}; the target reaches its peak lr after the same number of "
                          "updates, so if the lr was raised with the batch Adam gets no more steps to settle its "
                          f"moment estimates; longer warm-up lowers LR sensitivity, more so at scale ({W23} s3.2.1)")
        less = (_num(t) or 0) < (_num(p) or 0)
        return less, (f"warm-up {key.split('_')[1]} {p} -> {t}{_x(r)}: "
                      + ("fewer warm-up updates before the peak lr" if less else "a longer warm-up")
                      + f"; longer warm-up lowers LR sensitivity, more so for larger models ({W23} s3.2.1)")
    if key == "global_batch_size":
        return True, (f"global batch {p} -> {t}{_x(r)}: tokens per step and gradient noise change, so the lr and a "
                      "warm-up counted in steps tuned at the proxy's batch do not carry over unchanged")
    if key == "grad_accum":
        same_b = pb is not None and tb is not None and same(pb, tb)
        return not same_b, (f"gradient accumulation {p} -> {t}" + (
            " with the same global batch: harmless unless the loss is not divided by the number of micro-batches "
            "(a constant-factor gradient scaling bug)" if same_b else
            ": the global batch changes with it (see global_batch_size)"))
    if key == "eps":
        return True, (f"AdamW epsilon {p} -> {t}: when a parameter's gradient RMS falls towards epsilon (it shrinks "
                      "with width and depth) the update collapses; epsilon 1e-15 instead of 1e-8 fixed it "
                      f"({W23}, AdamW epsilon, s3.4)")
    if key in ("beta1", "beta2", "optimizer"):
        return True, (f"{key} {p} -> {t}: the optimizer state sets how fast the update follows a sudden gradient "
                      "change; a slow second moment (beta2 0.999) lets the update blow up when gradients grow "
                      f"(the large-run recipe is (0.9, 0.95), {W23} s2.1)")
    if key == "precision":
        if "fp16" in (p, t):
            return True, (f"precision {p} -> {t}: fp16 overflows above {_FP16_MAX:.0f}, so growing attention or output "
                          "logits become inf (activation overflow, loss-scale collapse); bf16 keeps fp32's range "
                          "(Micikevicius et al. 2018, arXiv 1710.03740)")
        return True, f"precision {p} -> {t}: fewer mantissa bits round small updates away (bf16 has 8)"
    if key == "d_model":
        if pc.get("mup") and tc.get("mup"):
            return False, f"width {p} -> {t}{_x(r)} with muP on both: the lr is meant to transfer (Yang et al. 2022)"
        return True, (f"width {p} -> {t}{_x(r)} without muP: under standard parametrisation the optimal lr shifts "
                      "with width, so the proxy's lr does not transfer (Yang et al. 2022, arXiv 2203.03466, "
                      f"muTransfer); wider models grow attention logits at lower lr ({W23} s3.1.1)")
    if key == "n_layers":
        return True, (f"depth {p} -> {t}{_x(r)}: instabilities set in at lower lr in deeper models ({W23}); the "
                      "proxy's lr does not transfer across depth without a depth-aware parametrisation")
    if key == "n_heads":
        return True, (f"heads {p} -> {t}: the head dimension d_model/n_heads changes the 1/sqrt(d_head) scale of the "
                      "attention logits")
    if key == "mup":
        return True, (f"muP {p} -> {t}: lr transfer across width holds only under muP (Yang et al. 2022); muParam "
                      f"lowers but does not remove LR sensitivity ({W23} s3.2)")
    if key == "weight_decay":
        less = (_num(t) or 0) < (_num(p) or 0)
        return less, (f"weight decay {p} -> {t}: less decay lets parameter norms, and with them attention and "
                      f"output logits, grow; independent weight decay lowers LR sensitivity ({W23} s3.2.2)")
    if key == "init_std":
        return True, (f"init std {p} -> {t}{_x(r)}: a larger init raises the initial activations and logits and "
                      "lowers the stable lr (Takase et al. 2023, arXiv 2312.16903)")
    if key == "clip_grad_norm":
        looser = not (_num(t) or 0) or ((_num(p) or 0) > 0 and (_num(t) or 0) > (_num(p) or 0))
        return looser, (f"global-norm clipping {p} -> {t}: clipping bounds the update of a spike; "
                        + ("the target clips less or not at all" if looser else "the target clips tighter"))
    if key == "seq_len":
        return True, (f"sequence length {p} -> {t}: tokens per step and warm-up tokens change, and each query "
                      "attends over more keys, so the largest attention logit grows")
    if key == "norm":
        return True, (f"normalisation {p} -> {t}: post-LN needs warm-up and is less stable than pre-LN (Xiong et al. "
                      "2020, arXiv 2002.04745)")
    if key == "norm_eps":
        big = r is not None and (r > 100 or r < 0.01)
        return big, f"norm epsilon {p} -> {t}: matters only when it is comparable to the activation variance"
    if key == "total_steps":
        return False, (f"total steps {p} -> {t}: the decay horizon moves, so the lr at a matched step differs after "
                       "warm-up; not a stability change by itself")
    return True, f"{key} {p} -> {t}: the lr schedule differs after warm-up"


# ----------------------------------------------------------------------------------------------- diff


def same(a: Any, b: Any) -> bool:
    """Equality of two setting values: numbers within a relative 1e-9, strings case-insensitively."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or (a is not None and b is not None and bool(a) == bool(b) and type(a) is type(b))
    fa, fb = _num(a), _num(b)
    if fa is not None and fb is not None:
        return math.isclose(fa, fb, rel_tol=1e-9, abs_tol=0.0)
    if isinstance(a, str) and isinstance(b, str):
        return a.strip().lower() == b.strip().lower()
    return a == b


def diff(proxy_cfg: Mapping[str, Any], target_cfg: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every canonical setting whose value differs between the proxy and the target.

    A setting present on one side only is a difference too (``None`` on the other side): a switch the
    proxy records and the target does not (qk-layernorm, z-loss) may have been dropped.

    Args:
        proxy_cfg: :func:`extract_config` of the proxy (the run that trained well).
        target_cfg: :func:`extract_config` of the target (the run that did not).

    Returns:
        ``[{"setting", "proxy", "target", "matters": bool, "why"}]`` in :data:`CANONICAL` order; ``why``
        names the mechanism and its source (:func:`why_matters`).
    """
    out: list[dict[str, Any]] = []
    for key in CANONICAL:
        p, t = proxy_cfg.get(key), target_cfg.get(key)
        if (p is None and t is None) or same(p, t):
            continue
        matters, why = why_matters(key, p, t, proxy_cfg, target_cfg)
        out.append({"setting": key, "proxy": p, "target": t, "matters": matters, "why": why})
    return out


# ----------------------------------------------------------------------------------------------- muP

MUP_CLAIM = re.compile(r"(?:^|\.)(?:mup|use_mup|mup_enabled|mutransfer|base_shapes|mup_base_shapes|"
                       r"mup_base_width|mup_base_hidden_size|mup_width_multiplier|mup_width_scale|width_mult)$")
"""Config keys by which a run claims muP: the ``mup`` package's users (``base_shapes``, ``width_mult``,
``output_mult``), GPT-NeoX / Cerebras muTransfer (``use_mup``, ``mup_base_hidden_size``, ``mup_width_scale``,
``mup_output_multiplier``/``output_logits_alpha``), and the common ``mup``/``mup_base_width`` flags."""
_WIDTH_MULT = ("width_mult", "mup_width_multiplier", "mup_width_scale", "mup_width_mult")
_BASE_WIDTH = ("mup_base_width", "mup_base_hidden_size", "base_width", "base_hidden_size", "mup_base_d_model")
_OUTPUT_MULT = ("output_mult", "mup_output_multiplier", "mup_output_mult", "output_logits_alpha",
                "output_logits_scale", "mup_output_temp", "readout_mult")
_HIDDEN_LR = ("lr_hidden", "hidden_lr", "matrix_lr", "lr_matrix")


def flat_config(run: RunData) -> dict[str, Any]:
    """Every configuration the run carries, flattened to ``{dotted key: value}`` (most explicit source wins)."""
    out: dict[str, Any] = {}
    for _label, flat in reversed(_sources(run)):
        out.update(flat)
    return out


def _first(flat: Mapping[str, Any], names: tuple[str, ...]) -> Any:
    hit = _find([("cfg", dict(flat))], names)
    return hit[0] if hit else None


def claims_mup(flat: Mapping[str, Any]) -> bool:
    """True when a key of :data:`MUP_CLAIM` is set (a flag must be true; a base width or multiplier counts)."""
    for k, v in flat.items():
        if MUP_CLAIM.search(k) and v is not None and v is not False and str(v).strip().lower() not in (
                "false", "0", "no", "none", "off", ""):
            return True
    return False


def _group_lrs(flat: Mapping[str, Any]) -> dict[str, float]:
    """Per-group lrs from ``param_groups``/``optimizer.param_groups`` lists or ``lr_hidden``-style keys."""
    out: dict[str, float] = {}
    for k, v in flat.items():
        if (k.endswith("param_groups") or k.endswith("optimizer_groups")) and isinstance(v, list | tuple):
            for i, g in enumerate(v):
                if isinstance(g, Mapping) and _num(g.get("lr")) is not None:
                    out[str(g.get("name", i))] = _num(g["lr"])  # type: ignore[assignment]
    hit = _first(flat, _HIDDEN_LR)
    if hit is not None and _num(hit) is not None:
        out.setdefault("hidden", _num(hit))  # type: ignore[arg-type]
    return out


def mup_check(pf: Mapping[str, Any], tf: Mapping[str, Any], pc: Mapping[str, Any], tc: Mapping[str, Any],
              proxy: RunData | None = None, target: RunData | None = None) -> dict[str, Any] | None:
    """Verify a muP claim made by both runs, from their configurations and logs (Yang et al. 2022, table 3, Adam).

    Checks: (1) width multipliers: each run's ``width_mult`` equals d_model / base width when all three are
    recorded, and target/proxy multipliers equal the width ratio; (2) per-group lrs: the hidden (matrix)
    lr scales as 1 / width multiplier relative to the base lr (config ``param_groups``/``lr_hidden``, or the
    logged ``lr/hidden`` series), vector-like groups keep the base lr; (3) the output multiplier: an
    effective multiplier scales as 1 / width multiplier (a constant ``output_mult`` of the ``mup`` package,
    which divides by ``width_mult`` itself, is equal on both sides); from the logs, the output logits of the
    two runs over the first 10% of training within 2x of each other (they stay O(1) in width under muP).

    Returns:
        ``None`` unless both runs claim muP (:func:`claims_mup`), else ``{"claimed": True, "checks": [{"what",
        "status": "ok" | "mismatch" | "not_verifiable", "detail"}], "not_verifiable": [what...], "verdict"}``.
    """
    if not (claims_mup(pf) and claims_mup(tf)):
        return None
    checks: list[dict[str, Any]] = []

    def add(what: str, status: str, detail: str) -> None:
        checks.append({"what": what, "status": status, "detail": detail})

    mults = []
    for side, f, c in (("proxy", pf, pc), ("target", tf, tc)):
        m, base, d = _num(_first(f, _WIDTH_MULT)), _num(_first(f, _BASE_WIDTH)), _num(c.get("d_model"))
        if m is None and base and d:
            m = d / base
        elif m is not None and base and d and not math.isclose(m, d / base, rel_tol=0.02):
            add(f"width multiplier ({side})", "mismatch", f"width_mult {m:g} but d_model / base width = {d:g} / "
                f"{base:g} = {d / base:g}")
        mults.append(m)
    mp, mt = mults
    dp, dt = _num(pc.get("d_model")), _num(tc.get("d_model"))
    if mp and mt and dp and dt:
        ok = math.isclose(mt / mp, dt / dp, rel_tol=0.02)
        add("width multipliers", "ok" if ok else "mismatch",
            f"target/proxy multiplier {mt / mp:.4g} vs width ratio {dt / dp:.4g} (d_model {dp:g} -> {dt:g})")
    else:
        add("width multipliers", "not_verifiable",
            "needs each run's width multiplier (or base width) and d_model; recorded: "
            f"multipliers {mp}, {mt}; d_model {dp}, {dt}")
    # per-group lrs
    gp, gt = _group_lrs(pf), _group_lrs(tf)
    lp, lt = _num(pc.get("peak_lr")), _num(tc.get("peak_lr"))
    src = "config"
    if "hidden" not in gp or "hidden" not in gt:
        for run, g in ((proxy, gp), (target, gt)):
            s = run.series("lr/hidden") if run is not None else None
            if s is not None and len(s) and np.isfinite(s.values).any():
                g.setdefault("hidden", float(np.nanmax(s.values)))
                src = "logs (lr/hidden, peak)"
    if "hidden" in gp and "hidden" in gt and mp and mt and lp and lt:
        want = (lt / lp) * (mp / mt)
        got = gt["hidden"] / gp["hidden"]
        add("per-group lrs", "ok" if math.isclose(got, want, rel_tol=0.05) else "mismatch",
            f"hidden-matrix lr target/proxy x{got:.4g}, muP (Adam) expects x{want:.4g} = base lr ratio "
            f"x{lt / lp:.4g} / width multiplier ratio x{mt / mp:.4g} (from {src})")
        for name in sorted((set(gp) & set(gt)) - {"hidden"}):
            r = gt[name] / gp[name]
            add(f"lr of group {name!r}", "ok" if math.isclose(r, lt / lp, rel_tol=0.05) else "mismatch",
                f"x{r:.4g} vs base lr ratio x{lt / lp:.4g} (vector-like groups keep the base lr under muP)")
    else:
        add("per-group lrs", "not_verifiable", "needs the hidden-matrix lr of both runs (config param_groups / "
            "lr_hidden, or a logged lr/hidden series), both base lrs and both width multipliers")
    # output multiplier
    op, ot = _num(_first(pf, _OUTPUT_MULT)), _num(_first(tf, _OUTPUT_MULT))
    if op and ot and mp and mt:
        if math.isclose(ot / op, mp / mt, rel_tol=0.05):
            add("output multiplier", "ok", f"x{ot / op:.4g} = 1 / width multiplier ratio (an effective multiplier)")
        elif math.isclose(ot, op, rel_tol=1e-6):
            add("output multiplier", "ok", f"{op:g} on both: the mup package's constant (MuReadout divides by "
                "width_mult itself); wrong if the code applies it as the effective multiplier")
        else:
            add("output multiplier", "mismatch", f"target/proxy x{ot / op:.4g}; muP expects x{mp / mt:.4g} "
                "(effective) or x1 (mup package constant)")
    else:
        add("output multiplier", "not_verifiable", "no output multiplier recorded in both configurations "
            f"({', '.join(_OUTPUT_MULT[:4])}, ...)")
    if proxy is not None and target is not None:
        a, b = proxy.series("output_logit_max"), target.series("output_logit_max")
        if a is not None and b is not None and len(a) >= 10 and len(b) >= 10:
            ea = float(np.nanmedian(a.values[: max(3, len(a) // 10)]))
            eb = float(np.nanmedian(b.values[: max(3, len(b) // 10)]))
            if ea > 0 and eb > 0:
                r = eb / ea
                add("output logits in the logs", "ok" if 0.5 <= r <= 2 else "mismatch",
                    f"median output_logit_max over the first 10% of steps: target/proxy x{r:.3g} (muP keeps output "
                    "logits O(1) in width: within 2x expected)")
        else:
            add("output logits in the logs", "not_verifiable", "no output_logit_max series in both runs")
    bad = [c for c in checks if c["status"] == "mismatch"]
    nv = [c["what"] for c in checks if c["status"] == "not_verifiable"]
    verdict = ("muP claim contradicted: " + "; ".join(c["what"] for c in bad)) if bad else (
        "consistent with muP where verifiable" + (f"; not verifiable: {', '.join(nv)}" if nv else ""))
    return {"claimed": True, "checks": checks, "not_verifiable": nv, "verdict": verdict,
            "also_not_verifiable": ["attention scale 1/d_head vs 1/sqrt(d_head) (not in the logs)",
                                    "initialisation variances per parameter group (need checkpoints at step 0)"]}
