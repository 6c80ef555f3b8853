"""The per-line engine of :mod:`parsers.jsonl`: each line through the stdlib ``json`` (the reference path).

It accepts what polars refuses (``NaN``/``Infinity``, ``null`` told apart from a missing key, lone
surrogates, numbers logged as text) and records every bad line in the file state.
"""

from __future__ import annotations

import json
import math

import numpy as np

from forensics.model import Skip
from forensics.schema import boolean_is_a_count
from parsers._jsonl_fields import (
    _RUNTIME_SET,
    _SPECIAL_KEYS,
    NAME_KEYS,
    RUNTIME_KEYS,
    TIME_KEYS,
    _as_runtime,
    _as_step,
    _as_time,
    _flatten,
    _float,
    _number_text,
)
from parsers._jsonl_table import _Records, _State
from parsers._table_header import SPLIT_KEYS, split_suffix


class _PyRecords(_Records):
    """Records parsed line by line with the stdlib ``json`` (the exact reference path)."""

    def __init__(self, st: _State, items: list[tuple[int, bytes, bool]]) -> None:
        """Parse ``items``: (1-based line number, raw bytes, is the cut last line) in line order."""
        recs: tuple[list, ...] = ([], [], [], [], [], [], [])  # line, step, has_step, step_key, wall, runtime, suffix
        rows: tuple[list, ...] = ([], [], [], [])  # record, key id, value, null
        self.first, self.non_numeric = {}, {}
        for line_no, raw, cut in items:
            obj = _parse_line(st, line_no, raw, cut)
            if obj is not None:
                self._record(st, line_no, obj, recs, rows)
        for name, values, dtype in zip(("line", "step", "has_step", "step_key", "wall", "runtime", "suffix"), recs,
                                       (np.int64, np.int64, bool, np.int8, np.float64, np.float64, np.int32),
                                       strict=True):
            setattr(self, name, np.array(values, dtype))
        self._rows = (np.array(rows[0], np.int64), np.array(rows[1], np.int32), np.array(rows[2], np.float64),
                      np.array(rows[3], bool))

    def _record(self, st: _State, line_no: int, obj: dict, recs: tuple[list, ...], rows: tuple[list, ...]) -> None:
        """Append one record's fields to ``recs`` and its metric rows to ``rows``."""
        line, step, has_step, step_key_of, wall, runtime, suffix = recs
        r_rec, r_key, r_val, r_null = rows
        rank, key_index, first, non_numeric = st.rank, st.key_index, self.first, self.non_numeric
        step_key, stp = None, 0
        flat = _flatten(obj, "", {})  # a nested step key ({"train": {"global_step": N}}) counts, as in polars' path
        for i, k in enumerate(st.step_keys):
            if k in flat and (stp := _as_step(flat[k])) is not None:
                step_key = k
                step_key_of.append(i)
                break
        else:
            stp = 0
            step_key_of.append(-1)
            for k in st.step_keys:  # an integer step beyond int64 is said, not taken for "no step key"
                if type(obj.get(k)) is int:
                    st.big_steps[k] = st.big_steps.get(k, 0) + 1
        skip_key = step_key if step_key_of[-1] < st.fallback_from else None  # an epoch stays a metric too
        w = next((w for k in TIME_KEYS if k in flat and (w := _as_time(flat[k])) is not None), None)
        rt = next((r for k in RUNTIME_KEYS if k in flat and not math.isnan(r := _as_runtime(flat[k]))), math.nan)
        sfx = next((v for k in NAME_KEYS if isinstance(v := flat.get(k), str) and v), None)
        if sfx is None:  # a val/eval/test split: its keys get the split's prefix
            sfx = next((p for k in SPLIT_KEYS if k in flat and (p := split_suffix(flat[k]))), None)
        rec = len(line)
        line.append(line_no)
        step.append(stp)
        has_step.append(step_key is not None)
        wall.append(math.nan if w is None else w)
        runtime.append(rt)
        suffix.append(-1 if sfx is None else st.suffix_id(sfx))
        for pos, (key, v) in enumerate(flat.items()):
            v = _value(key, v, skip_key, w)
            if v is _SKIP:
                continue
            if v is _TEXT:
                nk = (step_key is not None, key)
                non_numeric[nk] = non_numeric.get(nk, 0) + 1
                continue
            if v is _BOOL:
                st.booleans[key] = st.booleans.get(key, 0) + 1
                continue
            ki = key_index.get(key)
            if ki is None:
                ki = st.key_id(key)
            if rank[ki] < 0 and ki not in first:
                first[ki] = (line_no, pos)
            r_rec.append(rec)
            r_key.append(ki)
            r_val.append(math.nan if v is None else v)
            r_null.append(v is None)

    def rows(self, rank: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        rec, key, val, null = self._rows
        if len(rec) > 1:
            order = np.lexsort((rank[key], rec))
            rec, key, val, null = rec[order], key[order], val[order], null[order]
        return np.bincount(rec, minlength=len(self.line)), ids[key], val, (null if null.any() else None)


_SKIP = object()  # a field that is no metric row (the step, the wall time, _runtime, a name, a list)
_TEXT = object()  # text that is not a number
_BOOL = object()  # a JSON boolean under a key that is no per-step flag: not a number


def _value(key: str, v: object, step_key: str | None, w: float | None) -> object:
    """A field's metric value: a float, None (JSON ``null``), :data:`_SKIP` or :data:`_TEXT`."""
    tv = type(v)
    if key == step_key or key in _SPECIAL_KEYS and (key in _RUNTIME_SET or w is not None and _as_time(v) == w):
        return _SKIP
    if tv is float:
        return v
    if tv is int:
        return _float(v)  # type: ignore[arg-type]
    if tv is bool:
        return float(v) if boolean_is_a_count(key) else _BOOL  # type: ignore[arg-type]
    if tv is str:
        if key in NAME_KEYS:
            return _SKIP
        f = _number_text(v)  # type: ignore[arg-type]  # numbers logged as text ("4.3", "NaN"): metaseq/fairseq
        return _TEXT if f is None else f
    return None if v is None else _SKIP  # lists


def _parse_line(st: _State, line_no: int, raw: bytes, cut: bool) -> dict | None:
    """The JSON object of one line, or None (blank; bad lines are recorded in ``st``)."""
    text = raw.strip()
    if not text:
        return None
    st.python_lines += 1
    try:
        obj = json.loads(text)
    except RecursionError:
        st.skip(line_no, "JSON nested too deeply to decode; line skipped")
        return None
    except (ValueError, UnicodeDecodeError) as exc:
        if cut:
            st.bad.append(Skip(f"{st.rel}:{line_no}", "half-written last line dropped (killed job?)"))
        else:
            st.skip(line_no, f"not valid JSON ({str(exc).split(':')[0]}); line skipped")
        return None
    if not isinstance(obj, dict):
        st.skip(line_no, f"a JSON {type(obj).__name__}, not an object; line skipped")
        return None
    return obj
