"""Header rules of metric tables (CSV/TSV, Parquet, JSON arrays): which column is the step, which are metrics.

By rule, not by file: a step name (:data:`STEP_COLUMNS`, compared exactly, then ignoring case and
padding, then punctuation: ``Iteration #``), else an epoch or sample count, else the row index when a column is a
loss by name. Shared by
:mod:`parsers.csv_metrics` and :mod:`parsers.json_table`.
"""

from __future__ import annotations

import math
import re

from parsers._io import STEP_KEY

STEP_COLUMNS = ("_step", "step", "Step", "global_step", "trainer/global_step", "iteration", "iter",
                "num_updates", "train/global_step", "global step", "current_steps", "current_step", "it", "steps",
                "train_step", "optimizer_step", "update", "updates", "s", "batch", "iterations")
"""Step columns, in priority order (compared exactly, then ignoring case and padding, then punctuation)."""
SPLIT_KEYS = ("split", "mode", "phase", "stage")
"""String fields naming the data split of a record (``{"split": "val", "step": 50, "loss": 2.3}``)."""
_SPLIT_PREFIX = {"val": "val", "valid": "val", "validation": "val", "eval": "eval", "evaluation": "eval",
                 "dev": "dev", "test": "test", "testing": "test"}
"""Split values whose records are not training rows: their keys get the prefix (``val/loss`` -> eval_loss,
like a logged ``val/`` prefix). ``train``/``training`` and any other value (``"stage": "sft"``) change nothing."""
PREFIX_MARK = "\x00"
"""Marks a JSONL record suffix (``parsers._jsonl_fields.NAME_KEYS``) that is a split prefix instead
(``val`` -> ``val/<key>``)."""


def split_suffix(value: object) -> str | None:
    """The suffix text of a :data:`SPLIT_KEYS` value (``PREFIX_MARK + "val"``), or None (train, other values)."""
    prefix = _SPLIT_PREFIX.get(value.strip().lower()) if isinstance(value, str) else None
    return None if prefix is None else PREFIX_MARK + prefix
EPOCH_COLUMNS = ("epoch", "Epoch", "ep", "epochs")
"""Used as the step only when no step column exists (an epoch-indexed table, YOLOv5 ``results.csv``)."""
SAMPLE_COLUMNS = ("samples", "consumed_samples", "num_samples", "examples", "total_timesteps", "timesteps",
                  "total_samples", "env_steps", "frames")
"""Sample (or environment-step) counters: the step only when no step or epoch column exists (an RL run's
``time/total_timesteps``)."""
ROW_INDEX = "(row index)"
"""The step of a table with no step, epoch or sample column but a loss column: its row number (0-based)."""


def step_axis(col: str | None) -> str:
    """The kind of step axis a column names: ``optimizer_step``, ``epoch``, ``samples`` or ``row_index``."""
    if col is None or col == ROW_INDEX:
        return "row_index"
    low = _norm(col)
    if low in EPOCH_COLUMNS:
        return "epoch"
    if low in SAMPLE_COLUMNS or _norm(col.rsplit("/", 1)[-1]) in SAMPLE_COLUMNS:
        return "samples"
    if low in ("batch", "micro_step", "micro_batch"):
        return "micro_batch"
    return "optimizer_step"


def lossy_header(header: list[str]) -> bool:
    from forensics.schema import canonical_metric

    return any(canonical_metric(h).split("/")[0] in ("loss", "eval_loss", "ppl", "eval_ppl") for h in header)
WALL_COLUMNS = ("_timestamp", "timestamp", "wall_time")
SKIP_COLUMNS = {"_runtime", "_timestamp", "_wandb", "timestamp", "wall_time", "Wall time",
              "Relative Time (Process)"}


def step_column(header: list[str], *, row_index: bool = True) -> str | None:
    """The step column of a header by rule: a step name, else an epoch or sample count, else the row index.

    The row index (:data:`ROW_INDEX`) is taken only when ``row_index`` and a column is a loss by name. A
    step column the user named (``forensics.toml`` ``step_key``) wins when the header has it.
    """
    user = STEP_KEY.get()
    if user and user in header:
        return user
    for names in (STEP_COLUMNS, EPOCH_COLUMNS, SAMPLE_COLUMNS):
        for name in names:
            if name in header:
                return name
        low = {h.strip().lower(): h for h in header}
        for name in names:
            if name.lower() in low:
                return low[name.lower()]
        norm = {_norm(h): h for h in reversed(header)}  # ``Iteration #``, ``Step #``, ``iter.``, ``Global Step``
        for name in names:
            if _norm(name) in norm:
                return norm[_norm(name)]
        last = {_norm(h.rsplit("/", 1)[-1]): h for h in reversed(header) if "/" in h}  # ``time/total timesteps``
        for name in names:
            if _norm(name) in last:
                return last[_norm(name)]
    if row_index and lossy_header(header):
        return ROW_INDEX
    return None


def _norm(name: str) -> str:
    """A column name with case, punctuation and spacing ignored: ``Iteration #`` -> ``iteration``."""
    return "_".join(w for w in re.split(r"[^0-9a-z]+", name.strip().lower()) if w)


def to_float(cell: str) -> float | None:
    """A cell as float (``nan``/``inf`` in any case kept), or None for a blank or non-numeric cell."""
    t = cell.strip()
    if not t:
        return None
    try:
        return float(t)
    except ValueError:
        low = t.lower()
        if low in ("nan", "-nan"):
            return math.nan
        if low in ("inf", "+inf", "infinity", "+infinity"):
            return math.inf
        if low in ("-inf", "-infinity"):
            return -math.inf
        return None


def metric_tag(h: str, step_col: str | None) -> str | None:
    """The tag of a column that holds a metric; ``None`` for the step, wall-time and W&B-internal columns."""
    internal = h.startswith("_") and h != "_step"
    if h == step_col or h in SKIP_COLUMNS or internal or h.endswith(("__MIN", "__MAX")):
        return None
    return h
