"""DeepSpeed engine lines, docs/formats.md#deepspeed.

Why a module: ``skipped=K`` is a running total (the per-step count is its difference), the overflow and
hysteresis messages are events with a loss-scale change that no ``key value`` pair states, and the
engine configuration is a multi-line dump.

Shapes: ``[ts] [INFO] [logging.py:128:log_dist] [Rank 0] step=N, skipped=K, lr=[X], mom=[...]``
(``skipped`` is cumulative; it becomes ``skipped_step``, the count since the previous line), the
fp16 overflow messages of ``deepspeed/runtime/fp16/loss_scaler.py`` (``[deepspeed] OVERFLOW! Rank 0 Skipping
step. Attempted loss scale: X, reducing to Y``; ``... Attempted loss scale: X, but hysteresis is H. Reducing
hysteresis to H-1``, a skipped step that keeps the scale; the bare ``... Skipping step.`` of bf16/fp32
engines) and of ``fused_optimizer.py``/``unfused_optimizer.py`` (``Overflow detected. Skipping step.
Attempted loss scale: X, reducing to Y``, ``Grad overflow on iteration N``, ``Reducing/Increasing dynamic
loss scale from X to Y``; ``No Grad overflow for N iterations`` and ``Consecutive hysteresis is enabled``
are claimed without rows), the fatal ``Current loss scale already at minimum``, the throughput line
``epoch=E/micro_step=M/global_step=N, RunningAvgSamplesPerSec=...`` and the ``DeepSpeedEngine
configuration:`` dump.
"""

from __future__ import annotations

import re

from parsers.lines import LineRecord, metric
from parsers.lines.common import NUM, to_num, wall_time
from parsers.lines.pyrepr import parse as parse_repr

_PREFIX = re.compile(r"^\[[^\]]*\]\s*\[(?:INFO|WARNING|ERROR|DEBUG|CRITICAL)\]\s*\[[^\]]*\]\s*"
                     r"(?:\[Rank \d+\]\s*)?")
_STEP = re.compile(r"\bstep=(\d+),\s*skipped=(\d+),\s*lr=\[([^\]]*)\]")
_ATTEMPT = re.compile(rf"Attempted loss scale:\s*({NUM}),\s*reducing to\s*({NUM})")
_HYSTERESIS = re.compile(rf"Attempted loss scale:\s*({NUM}),\s*but hysteresis is (\d+)\. "
                         r"Reducing hysteresis to (-?\d+)")
_BARE_OVERFLOW = re.compile(r"(?:OVERFLOW! Rank \d+ Skipping step|Overflow detected\. Skipping step)\.?\s*$")
_QUIET = re.compile(r"^(?:Consecutive hysteresis is enabled\. Restoring hysteresis to \d+|"
                    r"No Grad overflow for \d+ iterations)\s*$")
_GRAD_OVERFLOW = re.compile(r"Grad overflow on iteration:?\s*(\d+)")
_CHANGE = re.compile(rf"(Reducing|Increasing) dynamic loss scale from\s*({NUM})\s*to\s*({NUM})")
_MINIMUM = re.compile(r"Current loss scale already at minimum")
_THROUGHPUT = re.compile(r"epoch=(\d+)/micro_step=(\d+)/global_step=(\d+),(.*)$")
_KV = re.compile(r"(?<!\w)(\w{1,63})=([^,]+)")
_ARG = re.compile(r"^\s*([A-Za-z_]\w*) \.{3,} ?(.*)$")
_VERSION = re.compile(r"DeepSpeed info: version=([\w.+-]+)")
_KEYS = re.compile(r"step=|verflow|OVERFLOW|loss scale|hysteresis|DeepSpeed")
_PRECISION_ARGS = {"bfloat16_enabled": "bf16", "fp16_enabled": "fp16"}


def parse_line(line: str, state: dict) -> LineRecord | None:
    """Parse one DeepSpeed line.

    Args:
        line: A cleaned line.
        state: Per-file state: ``ds_skipped`` (last cumulative skipped count), ``ds_config``.

    Returns:
        A record, or ``None``.
    """
    m = _PREFIX.match(line)
    msg = line[m.end():] if m else line
    if m is None and not state.get("ds_config") and not _KEYS.search(line):
        return None
    if state.get("ds_config"):
        a = _ARG.match(msg)
        if a:
            key, raw = a.group(1), a.group(2).strip()
            value = parse_repr(raw, default=raw)
            meta = {"precision": _PRECISION_ARGS[key]} if key in _PRECISION_ARGS and value is True else {}
            return LineRecord("deepspeed", arg=(key, value), ns="deepspeed", meta=meta)
        state["ds_config"] = False
    ts = wall_time(line)
    s = _STEP.search(msg)
    if s:
        return _step_line(s, state, ts)
    return _scale_line(msg, ts) or _other_line(msg, state, ts)


def _step_line(s: re.Match, state: dict, ts: float | None) -> LineRecord:
    """``step=N, skipped=K, lr=[...]``: the lr and the skipped steps since the last such line."""
    step, skipped = int(s.group(1)), int(s.group(2))
    prev = state.get("ds_skipped", 0)
    state["ds_skipped"] = skipped
    delta = skipped - prev if skipped >= prev else skipped
    lrs = [to_num(x) for x in s.group(3).split(",") if x.strip()]
    # named for what it now holds, the per-step count (forensics.objective.per_step_counters leaves such a series
    # alone: every step skipped gives 1, 1, 1, ..., which must not be read as a running total a second time)
    out = [metric("skipped_step", float(delta), "skipped_step")]
    if lrs and lrs[0] is not None:
        out.insert(0, metric("lr", lrs[0]))
    return LineRecord("deepspeed", step=step, metrics=out, wall_time=ts)


def _scale_line(msg: str, ts: float | None) -> LineRecord | None:
    """The loss scaler's lines: overflow skips, scale changes, hysteresis, the minimum reached."""
    a = _ATTEMPT.search(msg)
    if a:
        new = float(a.group(2))
        return LineRecord("deepspeed", metrics=[metric("loss scale (overflow)", new, "loss_scale")],
                          events=[("overflow_skip", msg.strip(), None),
                                  ("loss_scale_change", f"loss scale {a.group(1)} -> {a.group(2)}", None)],
                          wall_time=ts)
    h = _HYSTERESIS.search(msg)
    if h:  # skipped, but the scale is kept until the hysteresis runs out
        return LineRecord("deepspeed", metrics=[metric("loss scale (overflow, hysteresis)", float(h.group(1)),
                                                       "loss_scale")],
                          events=[("overflow_skip", msg.strip(), None)], wall_time=ts)
    if _BARE_OVERFLOW.search(msg):  # bf16/fp32 engines print no scale
        return LineRecord("deepspeed", events=[("overflow_skip", msg.strip(), None)], wall_time=ts)
    if _QUIET.match(msg.strip()):
        return LineRecord("deepspeed")
    g = _GRAD_OVERFLOW.search(msg)
    if g:
        return LineRecord("deepspeed", events=[("overflow_skip", msg.strip(), int(g.group(1)))])
    c = _CHANGE.search(msg)
    if c:
        new = float(c.group(3))
        return LineRecord("deepspeed", metrics=[metric("dynamic loss scale", new, "loss_scale")],
                          events=[("loss_scale_change", msg.strip(), None)], wall_time=ts)
    if _MINIMUM.search(msg):
        return LineRecord("deepspeed", events=[("error", msg.strip(), None)])
    return None


def _other_line(msg: str, state: dict, ts: float | None) -> LineRecord | None:
    """Throughput lines (``epoch=0/micro_step=10/global_step=10, ...``), the engine's config dump, the version."""
    t = _THROUGHPUT.search(msg)
    if t:
        out = []
        for k, v in _KV.findall(t.group(4)):
            num = to_num(v)
            if num is not None:
                out.append(metric(k, num))
        return LineRecord("deepspeed", step=int(t.group(3)), metrics=out, wall_time=ts)
    if "DeepSpeedEngine configuration" in msg:
        state["ds_config"] = True
        return LineRecord("deepspeed", dump="begin", ns="deepspeed", launch=True)
    v = _VERSION.search(msg)
    if v:
        return LineRecord("deepspeed", launch=True, meta={"versions": {"deepspeed": v.group(1)}})
    return None
