"""The Arrow schemas of DESIGN.md section 2 and the canonical metric names.

All parsers emit these tables. Values are kept exactly as logged (NaN and +-inf kept; JSON
``null`` is null). Steps may repeat across segments.
"""

from __future__ import annotations

import re
from functools import lru_cache

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

METRICS_TEXT = ("run", "metric", "tag", "source")
"""The text columns of :data:`METRICS_SCHEMA`: few distinct values over many rows (one run, one file, a few names)."""

METRICS_COMPACT_SCHEMA = pa.schema(
    [pa.field(f.name, pa.dictionary(pa.int32(), pa.string()), nullable=False) if f.name in METRICS_TEXT else f
     for f in METRICS_SCHEMA]
)
""":data:`METRICS_SCHEMA` with dictionary-encoded text columns: what a reader of big files may emit instead.

A reader may also give ``run``/``source`` a narrower index (``int8``) and ``wall_time`` the ``null`` type when no
row has a wall time (no buffer at all); :func:`conform_metrics` accepts all of these, and the values are the
same strings and numbers (a dictionary column compares equal to its strings)."""


def conform_metrics(t: pa.Table) -> pa.Table:
    """``t`` with the columns of :data:`METRICS_SCHEMA` in order, in its types or their compact forms.

    A text column may be ``string`` or a dictionary of strings (kept as it is: no copy); ``wall_time`` may be
    of the ``null`` type (kept); every other column is cast to its schema type when it differs.

    Raises:
        KeyError, pyarrow.ArrowInvalid, pyarrow.ArrowTypeError: ``t`` lacks a column or a type does not cast.
    """
    t = t.select(METRICS_SCHEMA.names)
    for i, f in enumerate(METRICS_SCHEMA):
        typ = t.schema.field(i).type
        if typ == f.type or (f.name == "wall_time" and pa.types.is_null(typ)):
            continue
        text = pa.types.is_dictionary(typ) and typ.value_type in (pa.string(), pa.large_string())
        if f.name in METRICS_TEXT and text:
            continue
        t = t.set_column(i, f, t.column(i).cast(f.type))
    return t

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
    "step_time", "eval_loss", "samples", "batch_size", "ppl", "eval_ppl",
)

# Raw name (lower-cased, with common prefixes such as "train/" stripped) -> canonical name.
_ALIASES: dict[str, str] = {
    "loss": "loss", "lm loss": "loss", "lm_loss": "loss", "train_loss": "loss", "training_loss": "loss",
    "train loss": "loss", "ce loss": "loss", "crossentropyloss": "loss", "reduced_train_loss": "loss",
    "train_inner_loss": "loss", "nll_loss": "loss",
    "lr": "lr", "learning_rate": "lr", "learning rate": "lr", "learning-rate": "lr", "lr-adam": "lr",
    "grad_norm": "grad_norm", "grad norm": "grad_norm", "grad-norm": "grad_norm", "gnorm": "grad_norm",
    "gradient_norm": "grad_norm", "total_grad_norm": "grad_norm", "total grad norm": "grad_norm",
    "global_grad_norm": "grad_norm", "gn": "grad_norm",  # gn: the short grad-norm name of hand-written loops
    "grad": "grad_norm",  # a bare number named grad: the norm a loop prints (``Loss: 8.24 | LR: 6e-05 | Grad: 25.4``)
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

_NORMALIZED: dict[str, str] = {"_".join(w for w in re.split(r"[^0-9a-z]+", k) if w): v
                               for k, v in _ALIASES.items()}
"""The alias table keyed by :func:`normalized` names (``GradNorm`` -> ``grad_norm``), for names without a slash."""

_PREFIXES = ("train/", "training/", "train_inner/", "optim/", "trainer/", "metrics/", "train_")


_EVAL = frozenset({"val", "valid", "validation", "eval", "evaluation", "test", "dev", "holdout"})
_WRAP = frozenset({"train", "training", "sft", "trainer", "metrics", "metric", "optim", "train_inner", "step",
                   "avg", "mean", "global", "total", "reduced", "running", "smoothed", "lm", "ce", "nll", "objective",
                   "loss_metrics", "losses", "value", "main", "overall", "final", "batch", "iter", "cur", "current",
                   "loss", "with", "at", "of", "is", "the", "a", "an", "in", "on", "for", "and", "mean_of"})
_SPLIT = frozenset({"train", "training"}) | _EVAL
_AGGREGATE = frozenset({"epoch", "ema", "min", "max", "std", "sum", "count", "best"})
_XENT = frozenset({"xent", "crossentropy"})
"""Words that name the cross-entropy itself, without the word loss: a loss (OpenNMT-py ``xent``, TF ``xent``)."""
_SHORT = {"trl": ("loss", "abbreviation of train loss"), "tl": ("loss", "abbreviation of train loss"),
          "tel": ("eval_loss", "abbreviation of test/eval loss"), "vl": ("eval_loss", "abbreviation of val loss")}


def words_of(raw: str) -> list[str]:
    """The lower-case words of a name: split at camel case and at any character that is not a letter or digit.

    ``Train Loss (avg)`` -> ``["train", "loss", "avg"]``; ``GradNorm`` -> ``["grad", "norm"]``; ``Iteration #``
    -> ``["iteration"]``.
    """
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", raw.strip()).lower()
    return [w for w in re.split(r"[^0-9a-z]+", spaced) if w]


def normalized(raw: str) -> str:
    """A name's words joined by ``_`` (:func:`words_of`): the key that alias look-ups ignoring punctuation use."""
    return "_".join(words_of(raw))


_SCALE_NAMES = frozenset({"loss_scale", "loss_scaler", "lossscale", "grad_scale", "grad_scaler", "loss_scaling",
                          "scaler_scale", "cur_scale", "current_scale"})
"""Last path parts that name the dynamic loss scale whatever the prefix (``amp/loss_scale``, ``fp16/loss_scale``)."""
_SCALER_SPACES = frozenset({"amp", "fp16", "scaler", "grad_scaler", "gradscaler", "loss_scaler", "mixed_precision",
                            "half", "deepspeed"})
"""Prefixes under which a bare ``scale`` is the loss scale (``scaler/scale``, ``amp/scale``)."""
_SKIP_WORDS = frozenset({"skipped", "skip", "skips", "overflow", "overflows", "overflowed"})
_COUNT_WORDS = frozenset({"num", "n", "nb", "total", "count", "cnt", "steps", "step", "iters", "iter", "iterations",
                          "iteration", "number", "of", "optimizer", "optim", "updates", "update", "amp", "fp16",
                          "scaler", "train", "training", "grad", "grads", "gradient", "is", "has", "flag"})
"""Words a skipped-step counter or overflow flag may carry besides a skip word (``num_skipped``,
``amp/skipped_total``, ``Skipped Steps``, ``grad_overflow``); any other word (``skipped_batches``,
``overflow_rate``) leaves the name as logged."""


def scale_or_skip_rule(raw: str) -> tuple[str, str] | None:
    """``loss_scale`` or ``skipped_step`` for a loss-scale or skipped-step name by rule, with why; else ``None``.

    A loss-scale name (:data:`_SCALE_NAMES` as the last path part, or ``scale`` under a scaler's prefix
    :data:`_SCALER_SPACES`) is the loss scale under any prefix, never a part of the loss. A name whose words are a
    skip word (``skipped``, ``overflow``) and counting words only (:data:`_COUNT_WORDS`) is the skipped-step
    count (a running total is made per-step later, :func:`forensics.objective.per_step_counters`).
    """
    parts = [normalized(p) for p in raw.strip().split("/") if normalized(p)]
    if not parts:
        return None
    last = parts[-1]
    if last in _SCALE_NAMES or (last in ("scale", "scaler") and any(p in _SCALER_SPACES for p in parts[:-1])):
        return "loss_scale", f"a loss-scale name ({last!r}) under any prefix: the dynamic loss scale"
    words = words_of(raw)
    if any(w in _SKIP_WORDS for w in words) and all(w in _SKIP_WORDS or w in _COUNT_WORDS for w in words):
        return "skipped_step", "a skipped-step counter or overflow flag by its words"
    return None


_LR_MONITOR = re.compile(r"lr-([a-z][\w.]*?)(-\d+)?(/pg\d+)?", re.IGNORECASE)


def lr_monitor_rule(raw: str) -> tuple[str, str] | None:
    """``lr`` for Lightning's ``LearningRateMonitor`` names (``lr-AdamW``, ``lr-SGD-1``, ``lr-AdamW/pg2``), with why.

    The first optimizer's first parameter group is ``lr``; any other keeps its suffix (``lr/AdamW-1/pg2``);
    ``lr-SGD-momentum`` (its ``log_momentum``) is no lr. ``None`` for any other name.
    """
    m = _LR_MONITOR.fullmatch(raw.strip())
    if m is None or m.group(1).lower().endswith("momentum"):
        return None
    if m.group(2) is None and m.group(3) in (None, "/pg1"):
        return "lr", "Lightning LearningRateMonitor's name for the first optimizer's lr"
    return f"lr/{raw.strip()[3:]}", "Lightning LearningRateMonitor's name for another optimizer or parameter group"


def _split_suffix(canon: str, raw: str, tail: str) -> str | None:
    """The name of ``<alias>/<split word>`` (``Loss/train``, ``Loss/test``), or ``None`` when the tail is not one.

    A split word after the slash is like the prefix in ``train/loss``: ``train`` -> the metric itself, an eval word
    -> its eval form (``eval_loss``; the raw name when there is none), ``epoch`` -> the raw name (a summary).
    """
    words = words_of(tail)
    if not words or not all(w in _SPLIT or w == "epoch" or w == "step" for w in words) \
            or not any(w in _SPLIT for w in words):
        return None
    if "epoch" in words:
        return raw
    if any(w in _EVAL for w in words):
        return f"eval_{canon}" if f"eval_{canon}" in CANONICAL_METRICS else raw
    return canon


def name_rule(raw: str) -> tuple[str, str] | None:
    """The canonical name of a loss- or perplexity-like raw name, by rule, with why; ``None`` if no rule applies.

    Rules (DESIGN.md section 2): the name is split into words at any punctuation or space and camel case
    (``CrossEntropyLoss``); ``xent`` (the cross-entropy) is a loss word; an eval word (``val``, ``test``...) makes
    it ``eval_loss``; an aggregate word (``epoch``, ``ema``, ``min``...) leaves it under its raw name (a per-epoch
    mean is not the per-step objective); wrapper words (``train``, ``sft``, ``total``, ``avg``, ``step``...) are
    dropped; any other word is a part: ``box_loss`` -> ``loss/box``; perplexity -> ``ppl`` (``eval_ppl``).

    Args:
        raw: The name as logged.

    Returns:
        ``(canonical, why)`` or ``None``.
    """
    low = raw.strip().lower()
    if low in _SHORT:
        return _SHORT[low]
    if scale_or_skip_rule(raw) is not None:
        return None  # ``amp/loss_scale``, ``loss_scaler``: the loss scale, never a part of the loss
    words = words_of(raw)
    if any(a == "loss" and b.startswith("scal") for a, b in zip(words, words[1:], strict=False)):
        return None  # ``loss_scale_window``, ``min_loss_scale``: a loss-scale setting, not a part of the loss
    words = ["loss" if (w.endswith("loss") and w != "loss" and w[:-4] in ("crossentropy", "ce", "nll", "lm"))
             or w in _XENT else w for w in words]
    if "loss" in words or low.endswith("loss"):
        kind = "loss"
    elif any(w in ("ppl", "perplexity") for w in words):
        kind = "ppl"
    else:
        return None
    ev = [w for w in words if w in _EVAL]
    agg = [w for w in words if w in _AGGREGATE]
    if agg:
        return None
    parts = [w for w in words if w not in _WRAP and w not in _EVAL and w not in ("ppl", "perplexity")
             and not w.isdigit()]
    if kind == "ppl":
        return ("eval_ppl", f"perplexity with the eval word {ev[0]!r}") if ev else ("ppl", "perplexity")
    base = "eval_loss" if ev else "loss"
    why = f"a loss with the eval word {ev[0]!r}" if ev else "the training loss (wrapper words dropped)"
    if parts:
        return f"{base}/{'_'.join(parts)}", f"a component of the {'eval ' if ev else ''}loss: {'_'.join(parts)!r}"
    return base, why


def explain_metric(raw: str) -> tuple[str, str]:
    """The canonical name of ``raw`` and why (alias table, rule, or kept as logged)."""
    name = canonical_metric(raw)
    low = re.sub(r"\s+", " ", raw.strip().lower())
    if name == raw:
        if name in CANONICAL_METRICS:
            return name, "already a canonical name"
        return name, "no alias or rule applies: kept as logged"
    if low in _ALIASES:
        return name, f"alias table: {low!r} -> {name!r}"
    rule = scale_or_skip_rule(raw) or lr_monitor_rule(raw)
    if rule is not None and rule[0] == name:
        return name, f"rule: {rule[1]}"
    if "/" not in low and _NORMALIZED.get(normalized(raw)) == name:
        return name, f"alias table ignoring case and punctuation: {normalized(raw)!r} -> {name!r}"
    hc = _ALIASES.get(low.partition("/")[0]) or _NORMALIZED.get(normalized(raw.partition("/")[0]))
    if "/" in low and hc and name in (hc, f"eval_{hc}"):
        return name, f"rule: {raw.partition('/')[2]!r} after the slash is a split word, like the prefix in train/loss"
    rule = name_rule(raw)
    if rule is not None and rule[0] == name:
        return name, f"rule: {rule[1]}"
    return name, f"alias table after a prefix or with a per-layer suffix: {raw!r} -> {name!r}"


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
    rule = scale_or_skip_rule(name) or lr_monitor_rule(name)
    if rule is not None:
        return rule[0]
    if "/" not in low and normalized(name) in _NORMALIZED:  # ``GradNorm``, ``Skipped Steps``, ``learning.rate``
        return _NORMALIZED[normalized(name)]
    if "/" in low:
        head, _, tail = low.partition("/")
        if head in ("eval", "val", "valid", "validation") and tail in ("loss", "lm loss", "lm_loss"):
            return "eval_loss"
        hc = _ALIASES.get(head) or _NORMALIZED.get(normalized(name.partition("/")[0]))
        split = _split_suffix(hc, name, tail) if hc else None
        if split is not None:
            return split
        if head in _ALIASES and head not in ("train", "eval"):
            return f"{_ALIASES[head]}/{name.partition('/')[2]}"
        if head in ("train", "training", "optim") and "/" in tail:
            head2, _, tail2 = tail.partition("/")
            if head2 in _ALIASES:
                return f"{_ALIASES[head2]}/{tail2}"
    rule = name_rule(name)
    if rule is not None:
        return rule[0]
    return name


FLAG_METRICS = ("skipped_step", "nan_step")
"""Per-step counts that a writer may log as a boolean flag (``"overflow": true``): true/false is their 1/0."""


@lru_cache(maxsize=4096)
def boolean_is_a_count(raw: str) -> bool:
    """True when a JSON boolean under ``raw`` reads as 1/0: a flag (``fp16_finite``, ``overflow``).

    False for a measurement (a canonical metric other than :data:`FLAG_METRICS`, or a part of one: ``loss``,
    ``lr``, ``loss/box``): ``"loss": true`` is no loss value.
    """
    name = canonical_metric(raw)
    base = name.split("/")[0]
    return name in FLAG_METRICS or (base not in CANONICAL_METRICS and name not in CANONICAL_METRICS)


def empty_metrics() -> pa.Table:
    """An empty metrics table with :data:`METRICS_SCHEMA`."""
    return METRICS_SCHEMA.empty_table()


def empty_events() -> pa.Table:
    """An empty events table with :data:`EVENTS_SCHEMA`."""
    return EVENTS_SCHEMA.empty_table()
