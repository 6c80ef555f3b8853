r"""Metrics in a tqdm progress bar's postfix: ``pbar.set_postfix(loss=...)`` and Lightning's default stdout.

Why a module: a bar is a counter, not a log line, and the general ``key value`` reader (:mod:`parsers.lines.kv`)
refuses bars, whose redraws repeat values. tqdm's default ``bar_format`` is ``{l_bar}{bar}| {n_fmt}/{total_fmt}
[{elapsed}<{remaining}, {rate_fmt}{postfix}]`` with the postfix ``, key=value, key=value``; a bar drawn to a file
is redrawn after ``\r`` (split into lines by the text reader)::

    Epoch 0:  49%|████      | 498/1000 [00:08<00:10, 42.1it/s, loss=0.428, lr=1.64e-02]
    Epoch 3:  10%|#         | 25/250 [00:03<00:05, 41.23it/s, v_num=0, train_loss_step=2.3, train_loss_epoch=0.512]

The step is the counter ``N`` (the batches done); with Lightning's ``Epoch E`` description and a known total it
is ``E * TOTAL + N`` (the batches done over the epochs). A redraw of the same step replaces the earlier values
(the latest wins). Lightning's ``v_num`` (the logger version) is no metric; ``nan.0`` (Lightning's padding of
``nan``) is NaN. NeMo's bars (``reduced_train_loss``, ``global_step``) are :mod:`parsers.lines.nemo`'s, and a
validation or test bar is not a training step.
"""

from __future__ import annotations

import math
import re

from parsers.lines import LineRecord, metric

_BAR = re.compile(r"^(.{0,80}?):?\s*\d+%\|[^|]*\|\s*(\d+)/(\d+|\?)\s*\[([^\]]*)\]\s*$")
_EPOCH = re.compile(r"(?i)\bepoch\s*(\d+)")
_NOT_METRICS = frozenset({"v_num"})
_EVAL_BAR = re.compile(r"(?i)\b(?:validat\w*|val|test\w*|sanity|predict\w*|eval\w*)\b")


def _number(text: str) -> float | None:
    t = text.strip()
    if t in ("nan.0", "-nan.0"):
        return math.nan
    try:
        return float(t)
    except ValueError:
        return None


def parse_line(line: str, state: dict) -> LineRecord | None:
    r"""Read the ``key=value`` postfix of a tqdm bar, at the bar's step; ``None`` for any other line.

    Args:
        line: A cleaned line (one redraw of a bar: the text reader splits on ``\r``).
        state: Per-file state (unused).

    Returns:
        A ``generic`` record (``agg_last``: a redraw replaces the values of its step), or ``None``.
    """
    if "%|" not in line or "=" not in line:
        return None
    m = _BAR.match(line.strip())
    if not m or "reduced_train_loss=" in m.group(4) or "global_step=" in m.group(4) or _EVAL_BAR.search(m.group(1)):
        return None
    out = []
    for part in m.group(4).split(", "):
        key, sep, text = part.partition("=")
        key = key.strip()
        if sep and key and key not in _NOT_METRICS and (x := _number(text)) is not None:
            out.append(metric(key, x))
    if not out:
        return None
    n, total = int(m.group(2)), m.group(3)
    e = _EPOCH.search(m.group(1))
    step = n + (int(e.group(1)) * int(total) if e and total.isdigit() else 0)
    return LineRecord("generic", step=step, metrics=out, agg_last=True)
