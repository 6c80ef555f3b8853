r"""NVIDIA NeMo stdout (NeMo 2 ``ProgressPrinter``, NeMo 1 / NeMo 2 tqdm bars), docs/formats.md#nemo.

Why a module: a tqdm bar repeats the last validation value on every later bar (only the first one after
validation is a sample), and the global step is the bar position minus one.

NeMo 2 ``ProgressPrinter`` (``NVIDIA/NeMo:nemo/lightning/pytorch/callbacks/progress_printer.py``,
``on_train_batch_end`` and ``format_string``) prints with ``print``, one line per ``log_interval``::

    prefix = self.train_description + f" epoch {trainer.current_epoch}, iteration {n-1}/{self.total-1}"
    log_string += f' | {metric}: {val}'      # a float that is a whole number, printed as an int
    log_string += f' | {metric}: {val:.4}'   # otherwise: 4 significant digits (lossy)

    Training epoch 0, iteration 9/99 | lr: 1.5e-05 | global_batch_size: 8 | global_step: 9 | reduced_train_loss:
    10.63 | train_step_timing in s: 0.3117 | consumed_samples: 80                  (one line)

The values are averages over ``log_interval`` (``global_step`` is the latest value); after a validation
the Lightning progress-bar metric ``val_loss`` stays on every line until the next one. ``Validation:
iteration i/n`` lines carry no metrics.

NeMo 1 (PTL ``TQDMProgressBar``) and NeMo 2's interactive ``MegatronProgressBar``
(``nemo/lightning/pytorch/callbacks/progress_bar.py``: ``bar_format = "{desc}: {percentage:3.0f}%|{bar}|
{n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]"``, ``set_description(f"Epoch {trainer.current_epoch}")``)
redraw a bar, split by ``\r``, whose postfix holds the same metrics formatted by tqdm's ``format_num``
(``{:.3g}`` or ``str``, the shorter) and padded by Lightning's ``Tqdm.format_num`` to 5 characters::

    Epoch 0:  10%|█         | 100/1000 [01:40<15:00, reduced_train_loss=2.340, global_step=99.00,
    consumed_samples=800.0, v_num=0]                                                (one line)

Only bars with ``reduced_train_loss`` or ``global_step`` in the postfix are NeMo's. The bar redraws the
same step many times (the latest value of a step wins; a redraw may still show the previous step's
postfix), Lightning pads ``nan`` to ``nan.0``, and from 1000 on ``{:.3g}`` can make the step lossy
(``global_step=1e+3`` for 1000..1004, whereas ``1009.0`` is exact because ``str`` is shorter): the step
is then the bar position plus an offset seen on an exact line, the one whose tqdm rendering is the
printed text (a redraw with a stale lossy step matches none and is dropped; one optimizer step per
batch is assumed). A bar without ``global_step`` is placed at its position (``n - 1``, plus the
batches of earlier epochs).

The step of a row is ``global_step`` (the 0-based index of the optimizer step), else the printed
iteration. ``reduced_train_loss`` is ``loss`` (a ``nan_detected`` event where it turns non-finite),
``train_step_timing in s`` is ``step_time``; ``val_loss`` becomes an ``eval_loss`` row on the first
line that shows a new value. Checkpoint lines, with or without the NeMo logger prefix ``[NeMo I
2025-01-01 12:00:00 module:123]``: ``Async checkpoint save for step N (<path>) finalized successfully``,
Lightning's ``Epoch E, global step N: 'reduced_train_loss' reached X (best Y), saving model to '<path>'
as top K``, ``Resuming training from checkpoint: <path>`` (NeMo 1 ``exp_manager``) and ``Restoring
states from the checkpoint path at <path>`` (Lightning), whose step is the ``step=N`` of the path.
"""

from __future__ import annotations

import math
import re

from parsers.lines import LineRecord, metric
from parsers.lines.common import wall_time

_PRINTER = re.compile(r"^(Training|Sanity checking Validation|Validation|Testing) epoch (\d+), "
                      r"iteration (\d+)/(-?\d+|inf)((?: \| [^|:]+: [-+\w.]+)*)$")
_BAR = re.compile(r"^(?:Epoch (\d+)|Training)?:?\s*\d+%\|[^|]*\|\s*(\d+)/(\d+|\?)\s*\[([^\]]*)\]\s*$")
_PREFIX = re.compile(r"^\[NeMo [DIWEC] (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) [\w.]+:\d+(?: rank:\d+)?\]\s*")
_ASYNC_SAVE = re.compile(r"Async checkpoint save for step (\d+) \((.*)\) finalized successfully")
_TOP_K = re.compile(r"^Epoch \d+, global step (\d+): '[^']+' reached \S+ \(best \S+\), saving model to ")
_RESUME = re.compile(r"^(?:Resuming training from checkpoint:|Restoring states from the checkpoint path at)\s*(.*)$")
_PATH_STEP = re.compile(r"(?<![\w])step=(\d+)")
_PADDED = re.compile(r"^([-+]?(?:nan|inf))\.0*$")
_NOT_METRICS = {"global_step", "v_num", "epoch"}
_EVAL_KEYS = {"val_loss": "eval_loss"}
_NAMES = {"train_step_timing in s": "step_time", "train_step_timing": "step_time"}  # seconds per step


def _value(text: str) -> float | None:
    t = text.strip()
    try:
        return float(t)
    except ValueError:
        m = _PADDED.match(t)  # Lightning pads tqdm's "nan" to "nan.0"
        return float(m.group(1)) if m else None


def _tqdm_num(x: float) -> str:
    """``x`` as tqdm's ``format_num`` prints it: ``{:.3g}`` without exponent zeros, or ``str``, the shorter."""
    f = f"{x:.3g}".replace("+0", "+").replace("-0", "-")
    s = str(x)
    return f if len(f) < len(s) else s


def _exact_step(text: str | None) -> int | None:
    """An exact step from a printed value (``9``, ``99.00``); ``None`` for ``1e+3`` or a non-integer."""
    if text is None or "e" in text.lower():
        return None
    v = _value(text)
    if v is None or not math.isfinite(v) or v != int(v):
        return None
    return int(v)


def _rows(pairs: list[tuple[str, str]], state: dict) -> tuple[list, list]:
    """Metric triples of ``(key, printed value)`` pairs; ``val_*`` keys only when their value changed."""
    out, events = [], []
    seen = state.setdefault("nemo_eval", {})
    for key, text in pairs:
        if key in _NOT_METRICS:
            continue
        v = _value(text)
        if v is None:
            continue
        if key in _EVAL_KEYS or key.startswith("val_"):
            if key in seen and (seen[key] == v or (math.isnan(v) and math.isnan(seen[key]))):
                continue
            seen[key] = v
            out.append(metric(key, v, _EVAL_KEYS.get(key, "eval_" + key[4:])))
            continue
        out.append(metric(key, v, _NAMES.get(key)))
        if key == "reduced_train_loss":
            bad = not math.isfinite(v)
            if bad and not state.get("nemo_nonfinite"):  # once, where the loss turns non-finite
                events.append(("nan_detected", f"reduced_train_loss: {text.strip()}", None))
            state["nemo_nonfinite"] = bad
    return out, events


def _printer(m: re.Match, state: dict) -> LineRecord | None:
    if m.group(1) != "Training":
        return LineRecord("nemo")
    pairs = []
    for part in m.group(5).split(" | ")[1:]:
        key, sep, text = part.rpartition(": ")
        if sep:
            pairs.append((key.strip(), text))
    d = dict(pairs)
    step = _exact_step(d.get("global_step"))
    if step is None:
        step = int(m.group(3))
    out, events = _rows(pairs, state)
    events = [(k, msg, step) for k, msg, _ in events]
    return LineRecord("nemo", step=step, metrics=out, events=events)


def _bar(m: re.Match, state: dict) -> LineRecord | None:
    inside = m.group(4)
    if "reduced_train_loss=" not in inside and "global_step=" not in inside:
        return None
    pairs = []
    for part in inside.split(", ")[1:]:
        key, sep, text = part.partition("=")
        if sep:
            pairs.append((key.strip(), text))
    d = dict(pairs)
    epoch, n, total = int(m.group(1) or 0), int(m.group(2)), m.group(3)
    pos = n - 1 + (epoch * int(total) if total.isdigit() else 0)  # batches before this one, over the epochs
    offsets = state.setdefault("nemo_bar_offsets", [0])
    text = d.get("global_step")
    step = _exact_step(text)
    if step is not None:
        if step - pos not in offsets:
            offsets.insert(0, step - pos)
            del offsets[4:]
    elif text is not None:
        # tqdm's {:.3g} made the step lossy (1e+3): the bar position plus a recent offset that prints the
        # same; none matches on a redraw that still shows the previous step's postfix: nothing new there
        step = next((pos + off for off in offsets if _tqdm_num(float(pos + off)) == text.strip()), None)
        if step is None:
            return LineRecord("nemo")
    else:
        step = pos
    out, events = _rows(pairs, state)
    if not out:
        return LineRecord("nemo")
    events = [(k, msg, step) for k, msg, _ in events]
    return LineRecord("nemo", step=step, metrics=out, events=events, agg_last=True)


def parse_line(line: str, state: dict) -> LineRecord | None:
    """Parse one NeMo line.

    Args:
        line: A cleaned line (ANSI colours and ``[rankN]:``/``[defaultN]:`` prefixes removed).
        state: Per-file state: ``nemo_eval`` (last ``val_*`` values), ``nemo_bar_offsets`` (step minus bar
            position on recent exact lines).

    Returns:
        A record, or ``None`` when the line is not a NeMo shape.
    """
    if " epoch " in line and "iteration" in line:
        m = _PRINTER.match(line)
        if m:
            return _printer(m, state)
        if line.startswith("Training epoch "):
            return LineRecord("nemo", damaged=f"NeMo progress line that does not parse (cut or garbled): "
                                              f"{line[:120]!r}")
    if "%|" in line and "=" in line:
        m = _BAR.match(line.strip())
        if m:
            return _bar(m, state)
    p = _PREFIX.match(line)
    msg = line[p.end():].strip() if p else line.strip()
    ts = wall_time(p.group(1)) if p else None
    if "checkpoint" not in msg and "saving model to" not in msg:
        return None
    a = _ASYNC_SAVE.search(msg)
    if a:
        return LineRecord("nemo", events=[("checkpoint_saved", msg[:300], int(a.group(1)))], wall_time=ts)
    k = _TOP_K.match(msg)
    if k:
        return LineRecord("nemo", events=[("checkpoint_saved", msg[:300], int(k.group(1)))], wall_time=ts)
    r = _RESUME.match(msg)
    if r:
        s = _PATH_STEP.findall(r.group(1))
        step = int(s[-1]) if s else None
        return LineRecord("nemo", step=step, resume=True, events=[("checkpoint_loaded", msg[:300], step)],
                          wall_time=ts)
    return None
