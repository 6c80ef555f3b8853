"""Two traps of custom scripts: ImageNet running averages, and a step line with a non-finite loss in words.

Trap 1 (ImageNet): the value to read is the running average in parentheses (``Loss 1.9 (1.6)``), numbered by
epoch, the last batch line of an epoch winning; a general ``key value`` reader would read the instantaneous
value. Trap 2: ``[step 55895] non-finite loss (nan)`` carries no ``loss`` pair, yet says the loss was NaN.
Every other step line is read by the general reader (:mod:`parsers.lines.kv`).

History: this module used to hold a ``key value`` tokenizer keyed on a step token:

The tokenizer finds a step token near the start of the line (``step``, ``iter``, ``iteration``,
``global_step``, ``num_updates``, ``update``; after timestamps, ``[tags]`` and log levels only), then
every ``name[:= ]number`` pair after it. That covers ``step N | lr X | loss Y``, ``[step N] loss X
grad_norm Y``, nanoGPT ``iter N: loss X, time Yms, mfu Z%`` and ``step N: train loss X, val loss Y``,
mlx-lm/mlx-vlm ``Iter N: Train loss X, Learning Rate Y, It/sec ...`` and ``Iter N: Val loss X``,
torchtitan ``step:  1  loss: 12.3  grad_norm: 3.1  tps: 1,234``. A step line that says the loss is
non-finite (``[step 55895] non-finite loss (nan)``) gives ``loss = NaN`` and a ``nan_detected`` event.

ImageNet (``pytorch/examples`` style, numbered by epoch): ``[Epoch=083/150] ... [learning_rate=0.001]``
gives ``lr`` at step = epoch; ``Epoch: [83][200/10010] ... Loss 1.9 (1.6) Prec@1 ...`` gives the
running averages (the value in parentheses) at step = epoch, the last one of the epoch winning;
`` * Prec@1 65.2 Prec@5 86.4`` gives ``eval_Prec@1``. ``meta["step_unit"]`` is ``"epoch"``.
"""

from __future__ import annotations

import math
import re

from parsers.lines import LineRecord, metric
from parsers.lines.common import NUM, wall_time

_PRE = (r"^(?:\s*(?:\[(?!\s*(?:global[_ ]step|step|iteration|iter|num_updates|update)\b)[^\]]{0,200}\]|"
        r"\d{4}-\d\d-\d\d[ T][\d:.,]+|\d\d:\d\d:\d\d(?:[.,]\d+)?|[-|:>]+|INFO|DEBUG|"
        r"WARNING|WARN|root|__main__|[\w.]{1,80}\.py:\d+|[\w.]{1,80} -))*+\s*\[?")
_STEP = re.compile(_PRE + r"(global[_ ]step|step|iteration|iter|num_updates|update)\s*[:=#]?\s*(\d+)"
                   r"(?:\s*/\s*(\d+))?\s*[\]):|,]?", re.I)
_VAL = rf"(?:[-+]?\d{{1,3}}(?:,\d{{3}})+(?:\.\d+)?|{NUM})"
_PAIR = re.compile(rf"(?<![\w./@%-])([A-Za-z_][\w./@%-]{{0,63}}(?: [A-Za-z_][\w./@%-]{{0,63}}){{0,3}}?)"
                   rf"(?:\s*[:=]\s*|\s+)({_VAL})"
                   r"(?:\s*(?:ms|s|%|GB|GiB|MB|MiB|it/s|tok/s)\b|%)?(?=[\s,|;\])(]|$)")
_NANLOSS = re.compile(r"(?i)(?:non-finite|\bnan\b|\binf\b)[^|,;]{0,20}\bloss\b|"
                      r"\bloss\b[^|,;]{0,20}(?:\bnan\b|non-finite)")
_EVAL_NAMES = {"val loss": "eval_loss", "valid loss": "eval_loss", "validation loss": "eval_loss",
               "eval loss": "eval_loss", "test loss": "test_loss"}
_IN_HEADER = re.compile(rf"\[Epoch=(\d+)/(\d+)\].*?\[learning_rate=({NUM})\]")
_IN_BATCH = re.compile(r"^Epoch: \[(\d+)\]\[(\d+)/(\d+)\]\s+(.*)$")
_IN_AVG = re.compile(rf"(?<![\w@])([A-Za-z@][\w@]{{0,63}})\s+({NUM})\s+\(({NUM})\)")
_IN_EVAL = re.compile(rf"^\s*\*\s+((?:[A-Za-z@][\w@]*\s+{NUM}\s*)+)$")


def _imagenet(line: str, state: dict) -> LineRecord | None:
    if "Epoch" in line:
        h = _IN_HEADER.search(line)
        if h:
            epoch = int(h.group(1))
            state["imagenet_epoch"] = epoch
            return LineRecord("imagenet", step=epoch, metrics=[metric("learning_rate", float(h.group(3)))],
                              meta={"step_unit": "epoch", "epochs": int(h.group(2))})
        b = _IN_BATCH.match(line)
        if b:
            epoch = int(b.group(1))
            state["imagenet_epoch"] = epoch
            out = []
            for name, _, avg in _IN_AVG.findall(b.group(4)):
                if name in ("Time", "Data"):
                    continue
                out.append(metric(f"{name} (avg)", float(avg), "loss" if name == "Loss" else name))
            return LineRecord("imagenet", step=epoch, metrics=out, agg_last=True,
                              meta={"step_unit": "epoch", "batches_per_epoch": int(b.group(3))})
    if "imagenet_epoch" in state and line.lstrip().startswith("*"):
        e = _IN_EVAL.match(line)
        if e:
            toks = e.group(1).split()
            pairs = zip(toks[::2], toks[1::2], strict=False)
            out = [metric(f"* {k}", float(v), f"eval_{k}") for k, v in pairs]
            return LineRecord("imagenet", step=state["imagenet_epoch"], metrics=out, eval=True)
    return None


def _name(tag: str) -> str:
    return _EVAL_NAMES.get(tag.lower()) or metric(tag, None)[0]


def parse_line(line: str, state: dict) -> LineRecord | None:
    """Parse one line of the ImageNet example, or a step line that says its loss is non-finite.

    Every other ``key value`` line is left to the general reader (:mod:`parsers.lines.kv`).

    Args:
        line: A cleaned line.
        state: Per-file state (``imagenet_epoch``).

    Returns:
        A record, or ``None``.
    """
    r = _imagenet(line, state)
    if r is not None:
        return r
    if "loss" not in line:
        return None
    m = _STEP.match(line)
    if not m or not _NANLOSS.search(line, m.end()):
        return None
    step = int(m.group(2))
    if any(n == "loss" for n, _, _ in _pairs(line, m.end())):
        return None
    return LineRecord("generic", step=step, metrics=[metric("loss", math.nan)],
                      events=[("nan_detected", line.strip()[:300], step)], wall_time=wall_time(line))


def _pairs(line: str, start: int) -> list:
    out = []
    for tag, val in _PAIR.findall(line, start):
        try:
            out.append(metric(tag.strip(), float(val.replace(",", ""))))
        except ValueError:
            continue
    return out
