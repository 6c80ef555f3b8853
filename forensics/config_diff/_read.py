"""Reading a run's configuration into the canonical settings (:func:`extract_config`) and comparing values."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from typing import Any

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
Z_LOSS_DEFAULT = 1e-4
"""The z-loss coefficient a bare ``z_loss: true`` stands for: PaLM's 1e-4 * log^2 Z (Chowdhery et al. 2022,
arXiv 2204.02311, section 5; docs/detectors.md#ol01)."""
SAME_REL = 1e-9
"""Two numeric settings equal up to this relative difference are the same (float printing; not a threshold)."""


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
        (Z_LOSS_DEFAULT if _bool(v) else 0.0) if _bool(v) is not None else None))
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


def same(a: Any, b: Any) -> bool:
    """Equality of two setting values: numbers within a relative 1e-9, strings case-insensitively."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or (a is not None and b is not None and bool(a) == bool(b) and type(a) is type(b))
    fa, fb = _num(a), _num(b)
    if fa is not None and fb is not None:
        return math.isclose(fa, fb, rel_tol=SAME_REL, abs_tol=0.0)
    if isinstance(a, str) and isinstance(b, str):
        return a.strip().lower() == b.strip().lower()
    return a == b



def flat_config(run: RunData) -> dict[str, Any]:
    """Every configuration the run carries, flattened to ``{dotted key: value}`` (most explicit source wins)."""
    out: dict[str, Any] = {}
    for _label, flat in reversed(_sources(run)):
        out.update(flat)
    return out


def _first(flat: Mapping[str, Any], names: tuple[str, ...]) -> Any:
    hit = _find([("cfg", dict(flat))], names)
    return hit[0] if hit else None
