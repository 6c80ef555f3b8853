"""The field rules of one JSONL metric record (:mod:`parsers.jsonl`).

Which keys are the step, the wall time, the run time and a module name, and how a JSON value becomes
a step, a time or a metric value.

Shared by both engines (the per-line path, :mod:`parsers._jsonl_lines`, and the polars path,
:mod:`parsers._jsonl_frames`), so that they read a record alike.
"""

from __future__ import annotations

import hashlib
import math
from datetime import UTC, datetime
from typing import Any

from parsers._table_header import EPOCH_COLUMNS, SAMPLE_COLUMNS
from parsers.file_policy import no_surrogates

_BASE_STEP_KEYS = ("step", "global_step", "iteration", "iter", "_step", "num_updates", "it", "current_steps",
                   "current_step", "trainer/global_step", "train/global_step", "global step", "train_step",
                   "optimizer_step", "steps", "update", "updates", "iters", "s")
STEP_KEYS = tuple(dict.fromkeys(
    _BASE_STEP_KEYS + tuple(k.capitalize() for k in _BASE_STEP_KEYS) + tuple(k.upper() for k in _BASE_STEP_KEYS)))
"""Keys that hold the step, in priority order (the first present in a record wins); ``Step``/``STEP`` too."""
FALLBACK_STEP_KEYS = tuple(dict.fromkeys(EPOCH_COLUMNS + tuple(k.upper() for k in EPOCH_COLUMNS) + SAMPLE_COLUMNS))
"""Epoch or sample counts: the step of a file in which no record has a step key (else they are metrics);
the line index only when no record has one of these either."""


def step_keys(user: str | None) -> tuple[tuple[str, ...], int]:
    """The step keys of one file in priority order, and where the fallback (epoch, samples) keys begin.

    ``user``: the step key the user named (``forensics.toml`` ``step_key``), which wins.
    """
    keys = STEP_KEYS + FALLBACK_STEP_KEYS
    if user:
        keys = (user, *(k for k in keys if k != user))
    return keys, next(i for i, k in enumerate(keys) if k in FALLBACK_STEP_KEYS and k != user)
TIME_KEYS = ("wall_time", "time", "timestamp", "_timestamp")
"""Keys read as the wall time (s since epoch; ms when > 1e11; ISO-8601 strings accepted)."""
RUNTIME_KEYS = ("_runtime", "_wandb/runtime")
"""Seconds since the run started (W&B): never metric rows; run start + runtime is a fallback wall time."""
NAME_KEYS = ("module", "layer", "tensor", "param")  # not "name": often the run name
"""String fields that name what a per-module record is about; they become a metric suffix."""
_RUNTIME_SET = frozenset(RUNTIME_KEYS)
_SPECIAL_KEYS = frozenset(TIME_KEYS) | _RUNTIME_SET

MAX_TAG_CHARS = 1000
"""A key longer than this is kept shortened (its start, ``...#`` and a hash: still one name per key)."""


def _safe_tag(tag: str) -> str:
    r"""A key as a metric name: lone surrogates (``"acc\ud800"`` in valid JSON) escaped, overlong keys shortened."""
    tag = no_surrogates(tag)
    if len(tag) > MAX_TAG_CHARS:
        digest = hashlib.sha1(tag.encode("utf-8", "surrogatepass")).hexdigest()[:10]
        tag = f"{tag[:MAX_TAG_CHARS - 14]}...#{digest}"
    return tag


def _flatten(obj: dict, prefix: str, out: dict[str, Any]) -> dict[str, Any]:
    """Nested objects flattened into ``out`` with ``/``-joined keys, in key order (no recursion: any depth)."""
    stack = [(prefix, iter(obj.items()))]
    while stack:
        pre, items = stack[-1]
        for k, v in items:
            if isinstance(v, dict):
                stack.append((f"{pre}{k}/", iter(v.items())))
                break
            out[f"{pre}{k}"] = v
        else:
            stack.pop()
    return out


def _as_step(v: Any) -> int | None:
    """An integer step (int, integral float, digit string) within int64, else None."""
    if isinstance(v, float) and math.isfinite(v) and v == int(v):
        v = int(v)
    elif isinstance(v, str) and v.strip().lstrip("-").isdigit():
        try:
            v = int(v)
        except ValueError:  # "²" is a digit to str.isdigit, "--5" strips to digits
            return None
    if isinstance(v, int) and not isinstance(v, bool) and -(1 << 63) <= v < 1 << 63:
        return v
    return None


_NUM_TEXT = {"nan": math.nan, "+nan": math.nan, "-nan": math.nan, "inf": math.inf, "+inf": math.inf,
             "-inf": -math.inf, "infinity": math.inf, "+infinity": math.inf, "-infinity": -math.inf}


def _number_text(v: str) -> float | None:
    """A float from a numeric string ("4.3", "1e-5", "NaN", "-Infinity"), else None."""
    t = v.strip()
    if not t or len(t) > 40:
        return None
    low = t.lower()
    if low in _NUM_TEXT:
        return _NUM_TEXT[low]
    try:
        return float(t.replace("_", "x"))  # "1_000" is not a logged number
    except ValueError:
        return None


def _float(v: int | float) -> float:
    try:
        return float(v)
    except OverflowError:  # an integer beyond float range
        return math.inf if v > 0 else -math.inf


def _as_time(v: Any) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 1e8:
        return v / 1000.0 if v > 1e11 else float(v)
    if isinstance(v, str):
        try:
            dt = datetime.fromisoformat(v.strip().replace("Z", "+00:00"))
        except ValueError:
            return None
        return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()
    return None


def _as_runtime(v: Any) -> float:
    """Seconds since the run started, or NaN when ``v`` is not a finite number."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        f = _float(v)
        return f if math.isfinite(f) else math.nan
    return math.nan
