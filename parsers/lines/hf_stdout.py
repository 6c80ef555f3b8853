"""Hugging Face Trainer stdout, docs/formats.md#hf-stdout.

Why a module: recent dict lines carry no step (it is derived from the epoch and the printed training
block), transformers 5 quotes every float as ``%.4g`` text, and the summary dict is not a step.

Shapes: the dict lines ``{'loss': 2.3, 'grad_norm': nan, 'learning_rate': 4.9e-05, 'epoch': 0.01}``
(a Python repr: ``nan``/``inf`` tokens), the same with every float as a ``f"{v:.4g}"`` string
(``{'loss': '3.914', 'grad_norm': 'nan', 'learning_rate': '0.0006', 'epoch': '0.01562'}``: ``ProgressCallback``
and ``PrinterCallback`` of recent versions, measured with transformers 5.24.0; ``meta["value_format"]`` is
then ``"%.4g"``) and the older JSON ``{"loss": ..., "step": 250}``; eval
dicts (``eval_*`` keys) and the end-of-training summary (``train_runtime``, ``train_loss``); the
``***** Running training *****`` block (``Num Epochs = E``, ``Total optimization steps = N``, ...);
``TrainingArguments(...)`` on one line or over many; ``Continuing training from global step N``;
``Saving model checkpoint to .../checkpoint-N``.

The step is not on the dict lines of recent versions. It is taken, in this order, from a ``step``
key, from ``round(epoch * N / E)`` when the block printed N and E, or from a running index times
``logging_steps`` (from a printed ``TrainingArguments``) or times one; ``state["hf_step_source"]``
records which. When the epoch of a train dict goes back (a relaunch that resumed from a checkpoint, with
nothing printed at the default log level to say so), the running index is re-anchored at
``round(epoch * steps per epoch)``, the steps per epoch being the last step over the last epoch.
"""

from __future__ import annotations

import json
import re

from parsers.lines import LineRecord, metric
from parsers.lines.hf_bar import BAR, quantum
from parsers.lines.pyrepr import parse as parse_repr
from parsers.lines.pyrepr import to_float

_PREFIX = re.compile(
    r"^(?:\[(?:INFO|WARNING|ERROR|DEBUG|CRITICAL)\|[^\]]*\]\s*[\d-]+ [\d:,.]+ >>\s?|"
    r"\d\d/\d\d/\d{4} \d\d:\d\d:\d\d - (?:INFO|WARNING|ERROR|DEBUG) - [\w.]+ -\s+)"
)
_FACTS = {
    "Num examples": "num_examples", "Num Epochs": "num_epochs", "Total optimization steps": "total_steps",
    "Gradient Accumulation steps": "gradient_accumulation_steps",
    "Instantaneous batch size per device": "per_device_train_batch_size",
    "Total train batch size (w. parallel, distributed & accumulation)": "total_train_batch_size",
    "Number of trainable parameters": "trainable_parameters",
}
_FACT = re.compile(r"^\s*(" + "|".join(re.escape(k) for k in _FACTS) + r")\s*=\s*([\d,]+)\s*$")
_GLOBAL_STEP = re.compile(r"Continuing training from global step (\d+)")
_SAVE = re.compile(r"Saving model checkpoint to (\S*?checkpoint-(\d+))")
_ARGLINE = re.compile(r"^([A-Za-z_]\w*)=(.*?),?$")
_DICT_KEYS = ("'loss'", '"loss"', "'eval_", '"eval_', "'learning_rate'", '"learning_rate"',
              "'train_runtime'", '"train_runtime"', "'grad_norm'", '"grad_norm"', "'step'", '"step"')
_SKIP_KEYS = {"step", "total_flos"}
_BAR_BEFORE = re.compile(r"^.{0,80}?" + BAR + r"\s*$")
_NONFINITE = re.compile(r"(:\s*)(-?)(nan|inf)(?=\s*[,}])")
_JSON_NAMES = {("", "nan"): "NaN", ("-", "nan"): "NaN", ("", "inf"): "Infinity", ("-", "inf"): "-Infinity"}


def _fast_dict(s: str) -> object:
    """``json.loads`` of a simple dict repr (quotes swapped, nan/inf spelled the JSON way), or ``None``."""
    t = _NONFINITE.sub(lambda m: m.group(1) + _JSON_NAMES[(m.group(2), m.group(3))], s)
    if "'" in t:
        if '"' in t:
            return None
        t = t.replace("'", '"')
    try:
        return json.loads(t)
    except ValueError:
        return None


def _precision(args: dict) -> dict:
    if args.get("bf16") is True:
        return {"precision": "bf16"}
    if args.get("fp16") is True:
        return {"precision": "fp16"}
    return {}


def _args_record(args: dict, state: dict) -> LineRecord:
    ls = args.get("logging_steps")
    if isinstance(ls, (int, float)) and not isinstance(ls, bool) and ls >= 1:
        state["hf_logging_steps"] = int(ls)
    return LineRecord("hf_trainer_stdout", config=args, ns="training_args", launch=True,
                      meta=_precision(args))


def _step_for(d: dict, is_eval: bool, state: dict) -> tuple[int | None, str]:
    step = d.get("step")
    if isinstance(step, (int, float)) and not isinstance(step, bool):
        state["hf_last_step"] = int(step)
        return int(step), "logged"
    epoch = to_float(d.get("epoch"))
    total, epochs = state.get("hf_total_steps"), state.get("hf_num_epochs")
    if epoch is not None and total and epochs:
        s = int(round(epoch * total / epochs))
        state["hf_last_step"] = s
        return s, "epoch"
    if is_eval:
        return state.get("hf_last_step"), state.get("hf_step_source", "index")
    state["hf_index"] = state.get("hf_index", 0) + 1
    ls = state.get("hf_logging_steps")
    s = state.get("hf_base", 0) + state["hf_index"] * (ls or 1)
    source = "index*logging_steps" if ls else "index"
    last_epoch, last_step = state.get("hf_last_epoch"), state.get("hf_last_step")
    if epoch is not None and last_epoch and last_step and epoch < last_epoch:
        # the epoch went back: a relaunch resumed from a checkpoint; steps per epoch from the run so far
        s = int(round(epoch * last_step / last_epoch))
        state["hf_base"] = s - state["hf_index"] * (ls or 1)
        source = "epoch rewind"
    if epoch is not None:
        state["hf_last_epoch"] = epoch
    state["hf_last_step"] = s
    return s, source


def _dict_line(s: str, state: dict) -> LineRecord | None:
    i = s.find("{")
    bar = None
    if i > 0:  # a dict flushed right after a tqdm bar that had no newline: ``  34%|###| 600/1755 [..]{'loss': ..}``
        bar = _BAR_BEFORE.match(s[:i])
        if bar is None:
            return None  # after another prefix: json_inline
    if i < 0 or not s.endswith("}") or not any(k in s for k in _DICT_KEYS):
        return None
    d = _fast_dict(s[i:])
    if not isinstance(d, dict):
        d = parse_repr(s[i:])
    if not isinstance(d, dict):
        return None
    if "train_runtime" in d or ("train_loss" in d and "loss" not in d):
        summary = {k: to_float(v) if isinstance(v, str) and to_float(v) is not None else v for k, v in d.items()}
        return LineRecord("hf_trainer_stdout", summary=summary)
    is_eval = any(k.startswith("eval_") for k in d)
    step, source = _step_for(d, is_eval, state)
    if step is None:
        return None
    state["hf_step_source"] = source
    out = []
    strings = False
    for k, v in d.items():
        if k in _SKIP_KEYS or (is_eval and k == "epoch"):
            continue
        if v is None:
            out.append(metric(k, None))
            continue
        x = to_float(v)  # recent versions print floats as f"{v:.4g}" strings
        if x is not None:
            out.append(metric(k, x))
            strings = strings or isinstance(v, str)
    meta = {"step_source": source}
    if strings:
        meta["value_format"] = "%.4g"
    epoch = to_float(d.get("epoch"))
    pos = (epoch, quantum(d.get("epoch")), int(bar.group(2)) if bar else None, int(bar.group(3)) if bar else None)
    return LineRecord("hf_trainer_stdout", step=step, metrics=out, eval=is_eval, meta=meta, bar_pos=pos)


def parse_line(line: str, state: dict) -> LineRecord | None:
    """Parse one HF Trainer stdout line.

    Args:
        line: A cleaned line.
        state: Per-file state (``hf_total_steps``, ``hf_num_epochs``, ``hf_logging_steps``,
            ``hf_index``, ``hf_base``, ``hf_args`` for a multi-line ``TrainingArguments``).

    Returns:
        A record, or ``None``.
    """
    m = _PREFIX.match(line)
    s = (line[m.end():] if m else line).strip()
    if not s:
        return None
    if state.get("hf_args") is not None:
        if s == ")":
            args = state.pop("hf_args")
            return LineRecord("hf_trainer_stdout", dump="end", ns="training_args", meta=_precision(args))
        a = _ARGLINE.match(s)
        if a:
            v = parse_repr(a.group(2), default=a.group(2))
            state["hf_args"][a.group(1)] = v
            if a.group(1) == "logging_steps" and isinstance(v, int):
                state["hf_logging_steps"] = v
            return LineRecord("hf_trainer_stdout", arg=(a.group(1), v), ns="training_args")
        state.pop("hf_args")
    if s[-1] == "}":
        return _dict_line(s, state)
    if s.endswith("Arguments(") or s.endswith("TrainingArguments("):
        state["hf_args"] = {}
        return LineRecord("hf_trainer_stdout", dump="begin", ns="training_args", launch=True)
    j = s.find("TrainingArguments(")
    if j >= 0 and s.endswith(")"):
        args = parse_repr(s[j + len("TrainingArguments"):].replace("(", "dict(", 1), default=None)
        if isinstance(args, dict):
            return _args_record(args, state)
    if s.startswith("***** Running training"):
        state.pop("hf_index", None)
        state.pop("hf_base", None)
        return LineRecord("hf_trainer_stdout", launch=True)
    f = _FACT.match(s)
    if f:
        key, val = _FACTS[f.group(1)], int(f.group(2).replace(",", ""))
        if key == "total_steps":
            state["hf_total_steps"] = val
        elif key == "num_epochs":
            state["hf_num_epochs"] = val
        return LineRecord("hf_trainer_stdout", meta={f"hf_{key}": val})
    g = _GLOBAL_STEP.search(s)
    if g:
        state["hf_base"] = int(g.group(1))
        return LineRecord("hf_trainer_stdout", step=int(g.group(1)), resume=True,
                          events=[("checkpoint_loaded", s, int(g.group(1)))])
    if s.startswith(("Continuing training from", "Will skip the first")):
        return LineRecord("hf_trainer_stdout", resume=s.endswith("global_step"))
    sv = _SAVE.search(s)
    if sv:
        return LineRecord("hf_trainer_stdout", events=[("checkpoint_saved", s, int(sv.group(2)))])
    return None

