"""Megatron-LM / Megatron-DeepSpeed stdout (``main_log.txt``), docs/formats.md#megatron.

Why a module and not the general reader (:mod:`parsers.lines.kv`): Megatron omits ``lm loss`` from the line
when its average is NaN (the absence is the NaN), prints placeholder zeros (``grad norm: 0.000`` on every
line), a constant ``loss scale: 1.0`` in bf16, and multi-line argument dumps.

Shapes: `` [ts] iteration N/ M | key: value | ... |`` (``lm loss`` absent when its average is
NaN), `` validation loss at iteration N ... | lm loss value: X | lm loss PPL: X |``, the argument
dump (``  name ....... value`` between dashed headers), ``using torch.float16 for parameters``,
``START TIME:``, checkpoint save/load lines, ``> overriding ...`` lines, NaN guard messages and
``Skipped iterations A to B due to --skip-train-iteration-range``.
"""

from __future__ import annotations

import re
from functools import lru_cache

from parsers.lines import LineRecord, metric
from parsers.lines.common import wall_time
from parsers.lines.pyrepr import parse as parse_repr

_ITER = re.compile(r"^\s*(?:\[[^\]]*\]\s*)?iteration\s+(\d+)\s*/\s*(\d+)\s*\|(.*)$")
_VALID = re.compile(r"validation loss at iteration\s+(\d+)(.*)$")
_ARG = re.compile(r"^\s+([A-Za-z_][\w-]*) \.{3,} ?(.*)$")
_ARGS_BEGIN = re.compile(r"^-{3,} arguments -{3,}$")
_ARGS_END = re.compile(r"^-{3,} end of arguments -{3,}$")
_SAVING = re.compile(r"^\s*(?:\[[^\]]*\]\s*)?(?:saving|successfully saved) checkpoint at iteration\s+(\d+)")
_LOAD = re.compile(r"(?:loading|successfully loaded) checkpoint from .* at iteration\s+(\d+)")
_PRECISION = re.compile(r"using torch\.(float16|bfloat16|float32) for parameters")
_NAN_GUARD = re.compile(r"iteration (\d+): Unexpected result (nan|inf)|found (?:NaN|Inf) in|Spiky loss")
_SKIP_RANGE = re.compile(r"Skipped iterations (\d+) to (\d+)")
_OVERRIDE = re.compile(r"^\s*> overriding (.*)$")
_PRECISIONS = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
_LAUNCH = ("START TIME:", "using world size:", "> initializing torch distributed",
           "> initializing tensor model parallel", "> setting random seeds")


def _value(text: str) -> object:
    """An argument value: numbers, booleans, None, lists as Python literals; else the string."""
    t = text.strip()
    return parse_repr(t, default=t)


@lru_cache(maxsize=1024)
def _key(key: str) -> tuple[str, str, float, bool]:
    """(tag, metric, divisor, is_loss) for a field name as printed (ms are divided into seconds)."""
    tag = key.strip()
    low = tag.lower()
    if low.startswith("elapsed time per iteration"):
        return tag, "step_time", 1000.0 if "(ms)" in low else 1.0, False
    is_loss = "loss" in low and "scale" not in low and "load_balancing" not in low
    return tag, metric(tag, None)[0], 1.0, is_loss


def _fields(rest: str) -> tuple[list, bool]:
    out = []
    has_loss = False
    for part in rest.split("|"):
        key, sep, val = part.rpartition(":")
        if not sep or not key.strip():
            continue
        try:
            v = float(val)
        except ValueError:
            continue
        tag, name, scale, is_loss = _key(key)
        has_loss = has_loss or is_loss
        out.append((name, tag, v / scale if scale != 1.0 else v))
    return out, has_loss


def parse_line(line: str, state: dict) -> LineRecord | None:
    """Parse one Megatron line.

    Args:
        line: A cleaned line.
        state: Per-file state: ``in_args`` tracks the argument dump.

    Returns:
        A record, or ``None`` when the line is not a Megatron shape.
    """
    if "iteration" in line:
        r = _iteration_line(line)
        if r is not None:
            return r
    if state.get("in_args"):
        m = _ARG.match(line)
        if m:
            return LineRecord("megatron", arg=(m.group(1), _value(m.group(2))))
        if _ARGS_END.match(line.strip()):
            state["in_args"] = False
            return LineRecord("megatron", dump="end")
    s = line.strip()
    if _ARGS_BEGIN.match(s):
        state["in_args"] = True
        return LineRecord("megatron", dump="begin", ns="args", launch=True)
    if s.startswith(_LAUNCH):
        return LineRecord("megatron", launch=True)
    m = _PRECISION.search(s)
    if m:
        return LineRecord("megatron", launch=True, meta={"precision": _PRECISIONS[m.group(1)]})
    m = _OVERRIDE.match(s)
    if m:
        return LineRecord("megatron", events=[("config", s, None)])
    if _NAN_GUARD.search(s):
        return LineRecord("megatron", events=[("nan_detected", s[:300], None)])
    return None


def _iteration_line(line: str) -> LineRecord | None:
    """Lines that name an iteration: the training line, validation, checkpoint save/load, NaN guard, data skip."""
    m = _ITER.match(line)
    if m:
        metrics, has_loss = _fields(m.group(3))
        step = int(m.group(1))
        events = []
        for name, _, v in metrics:
            if name == "skipped_step" and v:
                msg = f"{v:g} skipped iterations since the last log line"
                events.append(("overflow_skip", msg, step))
            elif name == "nan_step" and v:
                events.append(("nan_detected", f"{v:g} NaN iterations since the last log line", step))
        return LineRecord("megatron", step=step, metrics=metrics, has_loss=has_loss, events=events,
                          meta={"train_iters": int(m.group(2))}, wall_time=wall_time(line))
    m = _VALID.search(line)
    if m:
        return LineRecord("megatron", step=int(m.group(1)), metrics=_valid_metrics(m.group(2)), eval=True)
    m = _SAVING.match(line)
    if m:
        return LineRecord("megatron", events=[("checkpoint_saved", line.strip(), int(m.group(1)))])
    m = _LOAD.search(line)
    if m:
        step = int(m.group(1))
        return LineRecord("megatron", step=step, resume=True, events=[("checkpoint_loaded", line.strip(), step)])
    m = _NAN_GUARD.search(line)
    if m and m.group(1):
        return LineRecord("megatron", events=[("nan_detected", line.strip()[:300], int(m.group(1)))])
    m = _SKIP_RANGE.search(line)
    if m:
        return LineRecord("megatron", events=[("data_skip", line.strip(), int(m.group(1)))])
    return None


def _valid_metrics(rest: str) -> list:
    """``lm loss value: X | lm loss PPL: Y`` of a validation line as ``eval_loss``, ``eval_ppl``, ``eval_<key>``."""
    metrics = []
    for part in rest.split("|"):
        key, sep, val = part.rpartition(":")
        try:
            v = float(val.strip())
        except ValueError:
            continue
        k = key.strip().lower()
        name = "eval_loss" if k.endswith("loss value") else "eval_ppl" if k.endswith("ppl") else None
        metrics.append(metric(key.strip(), v, name or "eval_" + key.strip()))
    return metrics
