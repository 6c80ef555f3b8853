"""The per-line engine of :mod:`parsers.jsonl`: each line through the stdlib ``json`` (the reference path).

It accepts what polars refuses (``NaN``/``Infinity``, ``null`` told apart from a missing key, lone
surrogates, numbers logged as text) and records every bad line in the file state.
"""

from __future__ import annotations

import json
import math

import numpy as np

from forensics.model import Skip
from parsers._jsonl_fields import (
    _RUNTIME_SET,
    _SPECIAL_KEYS,
    NAME_KEYS,
    RUNTIME_KEYS,
    STEP_KEYS,
    TIME_KEYS,
    _as_runtime,
    _as_step,
    _as_time,
    _flatten,
    _float,
    _number_text,
)
from parsers._jsonl_table import _Records, _State


class _PyRecords(_Records):
    """Records parsed line by line with the stdlib ``json`` (the exact reference path)."""

    def __init__(self, st: _State, items: list[tuple[int, bytes, bool]]) -> None:
        """Parse ``items``: (1-based line number, raw bytes, is the cut last line) in line order."""
        line, step, has_step, step_key_of, wall, runtime, suffix = [], [], [], [], [], [], []
        r_rec, r_key, r_val, r_null = [], [], [], []
        self.first, self.non_numeric = {}, {}
        rank, key_index, first, non_numeric = st.rank, st.key_index, self.first, self.non_numeric
        nan, isnan = math.nan, math.isnan
        for line_no, raw, cut in items:
            obj = _parse_line(st, line_no, raw, cut)
            if obj is None:
                continue
            step_key, stp = None, 0
            for i, k in enumerate(STEP_KEYS):
                if k in obj and (stp := _as_step(obj[k])) is not None:
                    step_key = k
                    step_key_of.append(i)
                    break
            else:
                stp = 0
                step_key_of.append(-1)
            flat = _flatten(obj, "", {})
            w = next((w for k in TIME_KEYS if k in flat and (w := _as_time(flat[k])) is not None), None)
            rt = next((r for k in RUNTIME_KEYS if k in flat and not isnan(r := _as_runtime(flat[k]))), nan)
            sfx = next((v for k in NAME_KEYS if isinstance(v := flat.get(k), str) and v), None)
            rec = len(line)
            line.append(line_no)
            step.append(stp)
            has_step.append(step_key is not None)
            wall.append(nan if w is None else w)
            runtime.append(rt)
            suffix.append(-1 if sfx is None else st.suffix_id(sfx))
            for pos, (key, v) in enumerate(flat.items()):
                tv = type(v)
                if tv is float or tv is int:  # the common case first
                    if key == step_key or key in _SPECIAL_KEYS and (
                            key in _RUNTIME_SET or w is not None and _as_time(v) == w):
                        continue
                    v = v if tv is float else _float(v)
                elif key == step_key or key in _SPECIAL_KEYS and (
                        key in _RUNTIME_SET or w is not None and _as_time(v) == w):
                    continue
                elif tv is bool:
                    v = float(v)
                elif tv is str:
                    if key in NAME_KEYS:
                        continue
                    v = _number_text(v)  # numbers logged as text ("4.3", "NaN"), e.g. metaseq/fairseq json logs
                    if v is None:
                        nk = (step_key is not None, key)
                        non_numeric[nk] = non_numeric.get(nk, 0) + 1
                        continue
                elif v is not None:
                    continue  # lists
                ki = key_index.get(key)
                if ki is None:
                    ki = st.key_id(key)
                if rank[ki] < 0 and ki not in first:
                    first[ki] = (line_no, pos)
                r_rec.append(rec)
                r_key.append(ki)
                if v is None:
                    r_val.append(nan)
                    r_null.append(True)
                else:
                    r_val.append(v)
                    r_null.append(False)
        self.line = np.array(line, np.int64)
        self.step = np.array(step, np.int64)
        self.has_step = np.array(has_step, bool)
        self.step_key = np.array(step_key_of, np.int8)
        self.wall = np.array(wall, np.float64)
        self.runtime = np.array(runtime, np.float64)
        self.suffix = np.array(suffix, np.int32)
        self._rows = (np.array(r_rec, np.int64), np.array(r_key, np.int32), np.array(r_val, np.float64),
                      np.array(r_null, bool))

    def rows(self, rank: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        rec, key, val, null = self._rows
        if len(rec) > 1:
            order = np.lexsort((rank[key], rec))
            rec, key, val, null = rec[order], key[order], val[order], null[order]
        return np.bincount(rec, minlength=len(self.line)), ids[key], val, (null if null.any() else None)


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
