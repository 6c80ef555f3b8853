"""End of a text log: what is still open is closed, the log-format traps of DESIGN.md section 4, the meta.

- a Megatron iteration line without ``lm loss`` when other lines have it is a NaN average loss:
  a ``loss = NaN`` row and a ``nan_detected`` event;
- fairseq's per-epoch lines are the only series when no inner lines were logged: canonical names;
- a metric printed as exactly 0 on every Megatron line (``grad norm: 0.000``) is a placeholder, and so is
  a constant loss scale of 1.0 in a bf16 run: their rows are dropped and listed in
  ``meta["placeholder_metrics"]``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from forensics.schema import canonical_metric
from parsers.lines import dedupe_canonical, hf_bar, kv

if TYPE_CHECKING:
    from parsers._textlog_asm import Assembler


def finish(asm: Assembler, lineno: int) -> tuple[list[bool] | None, dict[str, Any]]:
    asm.end_dump(lineno)
    if asm.tb is not None:
        asm.event("error", "traceback cut off at the end of the file", None)
    if any(has for _, _, has, _ in asm.loss_lines):
        for seg, step, has, wall in asm.loss_lines:
            if not has:
                asm.rows.add(seg, step, "loss", math.nan, "lm loss (absent: NaN average)", wall)
                asm.rows.event(seg, step, "nan_detected", "iteration line without 'lm loss': the "
                                "averaged loss was NaN (Megatron omits it)")
                asm.meta["nan_loss_lines"] = asm.meta.get("nan_loss_lines", 0) + 1
    if not asm.state.get("fairseq_inner"):  # no inner lines: the epoch lines are the only series
        groups: dict[tuple[int, int], list[int]] = {}
        for i, name in enumerate(asm.rows.metric):
            if name.startswith("epoch_avg/"):
                groups.setdefault((asm.rows.seg[i], asm.rows.step[i]), []).append(i)
        for idx in groups.values():
            raw = [asm.rows.metric[i].partition("/")[2] for i in idx]
            named = dedupe_canonical([(canonical_metric(t), t, None) for t in raw])
            for i, (name, _, _) in zip(idx, named, strict=True):
                asm.rows.metric[i] = name
    keep = None
    if asm.frameworks.get("megatron"):
        for name in ("grad_norm", "param_norm"):
            vals = [v for n, v in zip(asm.rows.metric, asm.rows.value, strict=True) if n == name]
            if len(vals) >= 3 and all(v == 0.0 for v in vals):
                keep = keep or [True] * len(asm.rows)
                for i, n in enumerate(asm.rows.metric):
                    if n == name:
                        keep[i] = False
                asm.meta.setdefault("placeholder_metrics", {})[name] = (
                    "printed as 0 on every line: a placeholder, not a measurement; rows dropped")
    if asm.frameworks.get("megatron") and asm.meta.get("precision") == "bf16":
        scales = [v for n, v in zip(asm.rows.metric, asm.rows.value, strict=True) if n == "loss_scale"]
        if scales and all(v == 1.0 for v in scales):
            keep = keep or [True] * len(asm.rows)
            for i, n in enumerate(asm.rows.metric):
                if n == "loss_scale":
                    keep[i] = False
            asm.meta.setdefault("placeholder_metrics", {})["loss_scale"] = (
                "constant 1.0 in a bf16 run (no loss scaler); rows dropped")
    fw = asm.frameworks.most_common(1)[0][0] if asm.frameworks else "generic"
    asm.meta["framework"] = fw
    asm.meta["frameworks"] = sorted(asm.frameworks)
    if len(asm.history) > 1:
        asm.meta["args_history"] = asm.history
    asm.meta["lines"] = lineno
    asm.meta["segments"] = asm.segment + 1
    for k, v in kv.meta_of(asm.state).items():
        asm.meta.setdefault(k, v)
    if asm.ranks:
        asm.meta["ranks"] = {"metric_lines_per_rank": dict(sorted(asm.ranks.items())),
                              "why": "interleaved rank-prefixed lines are one run: a value several ranks print "
                                     "is kept once, a rank's step never reads as a restart of another's"}
    out_of_range = asm.rows.out_of_range_steps() + asm.state.get("kv_step_out_of_range", 0)
    if out_of_range:
        asm.skip_counts["step outside int64 (not a step)"] += out_of_range
    if asm.skip_counts:
        asm.meta["skipped_lines"] = dict(asm.skip_counts)
    return keep, asm.meta


def date_hf_dicts(asm: Assembler) -> None:
    """HF Trainer dict lines get the global step of the tqdm bar around them (:func:`hf_bar.bar_steps`).

    The line reader numbered them by a running index; the rows are re-stepped and ``meta["step_axis"]``
    says how. Without a bar the running index stays, named as such.
    """
    steps, axis = None, None
    if asm.bars:
        bars = tuple(np.concatenate([b[k] for b in asm.bars]) for k in range(3))
        summary = (asm.meta.get("train_summary") or {}).get("epoch")
        summary = float(summary) if isinstance(summary, (int, float)) and summary > 0 else None
        steps, axis = hf_bar.bar_steps([d[:7] for d in asm.hf_dicts], bars, summary)
        rows = asm.rows.step
        ends = [d[7] for d in asm.hf_dicts[1:]] + [len(rows)]
        for d, s, end in zip(asm.hf_dicts, steps, ends, strict=True):
            if s is None or d[8] == d[7]:
                continue
            old = rows[d[7]]
            rows[d[7]:d[8]] = [s] * (d[8] - d[7])
            for i in range(d[8], end):  # a step-less line after the dict was put at the dict's old step
                if rows[i] == old:
                    rows[i] = s
    if axis is not None:
        asm.meta["step_axis"] = axis
        asm.meta["step_source"] = "tqdm bar"
    elif str(asm.meta.get("step_source", "")).startswith("index"):
        asm.meta["step_axis"] = {"column": f"running index of the dict lines ({asm.meta['step_source']})",
                                 "kind": "row_index" if asm.meta["step_source"] == "index" else "optimizer_step"}
