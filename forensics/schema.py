"""The Arrow schemas of DESIGN.md section 2 and the canonical metric names.

All parsers emit these tables. Values are kept exactly as logged (NaN and +-inf kept; JSON
``null`` is null). Steps may repeat across segments.
"""

from __future__ import annotations

import re

import pyarrow as pa

METRICS_SCHEMA = pa.schema(
    [
        pa.field("run", pa.string(), nullable=False),
        pa.field("segment", pa.int32(), nullable=False),
        pa.field("step", pa.int64(), nullable=False),
        pa.field("metric", pa.string(), nullable=False),
        pa.field("value", pa.float64()),
        pa.field("wall_time", pa.float64()),
        pa.field("tag", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
    ]
)
"""Long metrics table: one row per (source, step, tag). ``value`` is null for JSON ``null``."""

EVENTS_SCHEMA = pa.schema(
    [
        pa.field("run", pa.string(), nullable=False),
        pa.field("segment", pa.int32(), nullable=False),
        pa.field("step", pa.int64()),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("message", pa.string()),
        pa.field("source", pa.string(), nullable=False),
    ]
)
"""Events from text logs: restart, checkpoint_saved, checkpoint_loaded, overflow_skip,
loss_scale_change, nan_detected, oom, error, warning, config."""

TENSORS_SCHEMA = pa.schema(
    [
        pa.field("run", pa.string()),
        pa.field("step", pa.int64()),
        pa.field("checkpoint", pa.string()),
        pa.field("tensor", pa.string()),
        pa.field("role", pa.string()),
        pa.field("dtype", pa.string()),
        pa.field("shape", pa.list_(pa.int64())),
        pa.field("numel", pa.int64()),
        pa.field("l2", pa.float64()),
        pa.field("rms", pa.float64()),
        pa.field("max_abs", pa.float64()),
        pa.field("n_nan", pa.int64()),
        pa.field("n_inf", pa.int64()),
        pa.field("n_zero", pa.int64()),
    ]
)

UPDATES_SCHEMA = pa.schema(
    [
        pa.field("run", pa.string()),
        pa.field("step_from", pa.int64()),
        pa.field("step_to", pa.int64()),
        pa.field("tensor", pa.string()),
        pa.field("delta_l2", pa.float64()),
        pa.field("weight_l2", pa.float64()),
        pa.field("ratio", pa.float64()),
    ]
)

EVENT_KINDS = frozenset(
    {
        "restart", "checkpoint_saved", "checkpoint_loaded", "overflow_skip", "loss_scale_change",
        "nan_detected", "oom", "error", "warning", "config", "hardware_error", "data_skip",
        "job_end",  # the job stopped on purpose or was cancelled (time limit, exit-duration, END TIME)
    }
)

CANONICAL_METRICS = (
    "loss", "lr", "grad_norm", "loss_scale", "skipped_step", "nan_step", "param_norm", "update_ratio",
    "tokens", "seq_len", "batch_index", "attn_logit_max", "log_z", "output_logit_max", "throughput",
    "step_time", "eval_loss", "samples", "batch_size",
)

# Raw name (lower-cased, with common prefixes such as "train/" stripped) -> canonical name.
_ALIASES: dict[str, str] = {
    "loss": "loss", "lm loss": "loss", "lm_loss": "loss", "train_loss": "loss", "training_loss": "loss",
    "train loss": "loss", "ce loss": "loss", "crossentropyloss": "loss", "reduced_train_loss": "loss",
    "train_inner_loss": "loss", "nll_loss": "loss",
    "lr": "lr", "learning_rate": "lr", "learning rate": "lr", "learning-rate": "lr", "lr-adam": "lr",
    "grad_norm": "grad_norm", "grad norm": "grad_norm", "grad-norm": "grad_norm", "gnorm": "grad_norm",
    "gradient_norm": "grad_norm", "total_grad_norm": "grad_norm", "total grad norm": "grad_norm",
    "global_grad_norm": "grad_norm",
    "loss_scale": "loss_scale", "loss scale": "loss_scale", "loss-scale": "loss_scale",
    "scale": "loss_scale", "grad_scale": "loss_scale",
    "skipped_step": "skipped_step", "skipped_steps": "skipped_step",
    "number of skipped iterations": "skipped_step", "skipped": "skipped_step",
    "number of nan iterations": "nan_step",
    "param_norm": "param_norm", "params norm": "param_norm", "params-norm": "param_norm",
    "parameter_norm": "param_norm", "weight_norm": "param_norm",
    "update_ratio": "update_ratio", "update ratio": "update_ratio", "update_to_weight_ratio": "update_ratio",
    "tokens": "tokens", "num_input_tokens_seen": "tokens", "consumed tokens": "tokens",
    "seq_len": "seq_len", "seq_length": "seq_len",
    "batch_index": "batch_index", "batch_idx": "batch_index", "batch_id": "batch_index",
    "attn_logit_max": "attn_logit_max", "max_attention_logit": "attn_logit_max",
    "attention_logit_max": "attn_logit_max", "max_attn_logit": "attn_logit_max",
    "log_z": "log_z", "logz": "log_z", "log_partition": "log_z",
    "output_logit_max": "output_logit_max", "logits_max": "output_logit_max", "max_logit": "output_logit_max",
    "throughput": "throughput", "tflops": "throughput", "throughput per gpu (tflop/s/gpu)": "throughput",
    "tflops/s": "throughput", "tps": "throughput",
    "step_time": "step_time", "elapsed time per iteration (ms)": "step_time", "iteration-time": "step_time",
    "eval_loss": "eval_loss", "val_loss": "eval_loss", "validation loss": "eval_loss", "valid_loss": "eval_loss",
    "consumed samples": "samples", "consumed_samples": "samples",
    "global batch size": "batch_size", "batch-size": "batch_size",
    # added for the text/CSV parsers (mlx-lm stdout, W&B exports, Megatron in seconds)
    "val loss": "eval_loss", "trained tokens": "tokens", "tokens/sec": "throughput",
    "grad/norm/total": "grad_norm", "elapsed time per iteration (s)": "step_time",
}

_PREFIXES = ("train/", "training/", "train_inner/", "optim/", "trainer/", "metrics/", "train_")


def canonical_metric(raw: str) -> str:
    """Map a metric name as logged to its canonical name (DESIGN.md section 2).

    ``train/loss`` -> ``loss``; ``learning_rate`` -> ``lr``; ``attn_logit_max/layer0`` ->
    ``attn_logit_max/layer0`` (per-layer variants keep their suffix). An unknown name is
    returned unchanged, so nothing logged is ever dropped.

    Args:
        raw: The tag or key exactly as the writer logged it.

    Returns:
        The canonical name, or ``raw`` itself when no alias applies.
    """
    name = raw.strip()
    low = re.sub(r"\s+", " ", name.lower())
    if low in _ALIASES:
        return _ALIASES[low]
    for prefix in _PREFIXES:
        if low.startswith(prefix) and low[len(prefix):] in _ALIASES:
            return _ALIASES[low[len(prefix):]]
    if "/" in low:
        head, _, tail = low.partition("/")
        if head in ("eval", "val", "valid", "validation") and tail in ("loss", "lm loss", "lm_loss"):
            return "eval_loss"
        if head in _ALIASES and head not in ("train", "eval"):
            return f"{_ALIASES[head]}/{name.partition('/')[2]}"
        if head in ("train", "training", "optim") and "/" in tail:
            head2, _, tail2 = tail.partition("/")
            if head2 in _ALIASES:
                return f"{_ALIASES[head2]}/{tail2}"
    return name


def empty_metrics() -> pa.Table:
    """An empty metrics table with :data:`METRICS_SCHEMA`."""
    return METRICS_SCHEMA.empty_table()


def empty_events() -> pa.Table:
    """An empty events table with :data:`EVENTS_SCHEMA`."""
    return EVENTS_SCHEMA.empty_table()
