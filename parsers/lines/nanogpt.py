"""nanoGPT ``train.py`` stdout, docs/formats.md#nanogpt (``karpathy/nanoGPT:train.py``).

Why a module: ``mfu -100.00%`` is a placeholder until the fifth iteration, and the ``train loss`` of the
``step N:`` line is an evaluation estimate (``eval_train_loss``), not the training objective.

Shapes (``print`` calls of ``train.py``)::

    print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
    print(f"iter {iter_num}: loss {lossf:.4f}, time {dt*1000:.2f}ms, mfu {running_mfu*100:.2f}%")

The ``step`` line is the periodic estimate over ``eval_iters`` batches of both splits: rows
``eval_train_loss`` and ``eval_loss``. The ``iter`` line gives ``loss`` (the last micro-batch's loss
times ``gradient_accumulation_steps``), ``step_time`` in seconds and ``mfu`` in percent, except for
the ``-100.00%`` that ``running_mfu = -1.0`` prints until the fifth iteration of a launch (a
placeholder, no row). Forks that append ``, name value`` pairs (``, grad_norm 0.512``) get those as
rows too. ``saving checkpoint to <out_dir>`` and ``Resuming training from <out_dir>`` are left to the
framework-neutral rules of :mod:`parsers.lines.common`.
"""

from __future__ import annotations

import math
import re

from parsers.lines import LineRecord, metric
from parsers.lines.common import NUM

_ITER = re.compile(rf"^iter (\d+): loss ({NUM}), time ({NUM})ms, mfu ({NUM})%((?:, [A-Za-z_][\w/.]* {NUM})*)$")
_STEP = re.compile(rf"^step (\d+): train loss ({NUM}), val loss ({NUM})$")
_EXTRA = re.compile(rf", ([A-Za-z_][\w/.]*) ({NUM})")


def parse_line(line: str, state: dict) -> LineRecord | None:
    """Parse one nanoGPT line.

    Args:
        line: A cleaned line.
        state: Per-file state (unused).

    Returns:
        A record, or ``None`` when the line is not a nanoGPT shape.
    """
    if line.startswith("iter "):
        m = _ITER.match(line)
        if m is None:
            return None
        step, loss = int(m.group(1)), float(m.group(2))
        out = [metric("loss", loss), metric("time (ms)", float(m.group(3)) / 1000.0, "step_time")]
        mfu = float(m.group(4))
        if mfu != -100.0:
            out.append(metric("mfu", mfu))
        out.extend(metric(k, float(v)) for k, v in _EXTRA.findall(m.group(5)))
        events = [] if math.isfinite(loss) else [("nan_detected", line.strip()[:300], step)]
        return LineRecord("nanogpt", step=step, metrics=out, events=events)
    if line.startswith("step "):
        m = _STEP.match(line)
        if m is None:
            return None
        out = [metric("train loss", float(m.group(2)), "eval_train_loss"),
               metric("val loss", float(m.group(3)), "eval_loss")]
        return LineRecord("nanogpt", step=int(m.group(1)), metrics=out, eval=True)
    return None
