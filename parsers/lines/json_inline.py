"""A JSON object (or a Python dict) after any log prefix: ``<ts> INFO trainer.py:88 metrics {"global_step": 7, ...}``.

Why a module: ``logger.info(json.dumps(metrics))`` puts a whole metric record after the logger's prefix, where the
general ``key value`` reader (:mod:`parsers.lines.kv`) would read the quoted keys as words. The object is the
balanced ``{...}`` that ends the line after a prefix (a dict that starts the line, or follows HF's logging prefix, is
:mod:`parsers.lines.hf_stdout`'s): the first ``{`` from which the rest of the line parses as JSON, else as a
Python literal (:mod:`parsers.lines.pyrepr`, ``nan``/``inf`` tokens). Nested objects are flattened with ``/``
(``{"train": {"loss": 1}}`` -> ``train/loss``). The step is the key a metric table's step column would be
(:func:`parsers._table_header.step_column`: ``global_step``, ``step``, ``iteration``, ...); a record is read only
when it has an optimizer-step key or a loss-like key with a number, so a configuration dict (``{"lr": 3e-4,
"epochs": 10}``) is left to the configuration rules. A boolean is not a number (``"loss": true`` is skipped, not
1.0), and a step beyond int64 makes the line damaged, listed, not a row.
"""

from __future__ import annotations

import json
import math

from parsers._jsonl_fields import _flatten
from parsers._table_header import lossy_header, step_axis, step_column
from parsers.lines import LineRecord, metric
from parsers.lines.hf_stdout import _PREFIX as _HF_PREFIX
from parsers.lines.pyrepr import parse as parse_repr
from parsers.lines.pyrepr import to_float

_MAX_TRIES = 4
"""Opening braces tried from the left before a line is given up (a prefix may hold ``{rank}``-like braces)."""
_INT64 = (1 << 63) - 1


def _object(s: str) -> dict | None:
    """The dict that ends ``s``: the first ``{`` from which the rest parses (JSON, then a Python literal)."""
    i = s.find("{")
    for _ in range(_MAX_TRIES):
        if i < 0:
            return None
        t = s[i:]
        try:
            d = json.loads(t)
        except ValueError:
            d = parse_repr(t) if "'" in t or "nan" in t or "inf" in t else None
        if isinstance(d, dict):
            return d
        i = s.find("{", i + 1)
    return None


def parse_line(line: str, state: dict) -> LineRecord | None:
    """Read a JSON object or Python dict that ends a line after any prefix; ``None`` when there is none.

    Args:
        line: A cleaned line.
        state: Per-file state (unused: each line stands alone).

    Returns:
        A ``generic`` record with the step (``None`` when the object has no step key) and the numeric values.
    """
    s = line.rstrip()
    if not s.endswith("}") or s.lstrip().startswith("{") or _HF_PREFIX.match(s):  # HF Trainer's dicts: its module
        return None
    d = _object(s)
    if not d:
        return None
    flat = _flatten(d, "", {})
    keys = [str(k) for k in flat]
    col = step_column(keys, row_index=False)
    numeric = {k: x for k, v in flat.items() if (x := to_float(v)) is not None}  # to_float: None for a bool
    if not lossy_header(list(numeric)) and (col is None or step_axis(col) != "optimizer_step"):
        return None  # a configuration (``{"lr": 3e-4, "epochs": 10}``), not a record
    step = None
    if col is not None:
        raw = flat[col]
        x = to_float(raw)
        if x is None or not math.isfinite(x) or abs(x) > _INT64:
            return LineRecord("generic", damaged=f"step {col!r} = {str(raw)[:40]} is not an integer step "
                                                 "within int64")
        step = int(x)
    out = [metric(str(k), x) for k, x in numeric.items() if k != col]
    if not out:
        return None
    return LineRecord("generic", step=step, metrics=out)
