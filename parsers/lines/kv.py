r"""The general metric reader for text lines: any ``key sep value`` grammar, one line or a million at once.

A *pair* is a key, a separator and a number:

- key: a name (``loss``, ``train/box_loss``, ``lm loss``, ``Prec@1``; up to four words), optionally quoted
  (``'loss'``, ``"loss"``: Python-dict and JSON objects anywhere in a line) and optionally followed by a
  parenthesised note (``acc (higher is better) : 0.49``);
- separator: ``=``, ``:`` (spaces around allowed) or a run of spaces/tabs (``loss 2.3``);
- value: a decimal or scientific number, ``nan``/``inf``/``infinity`` in any case, ``1,234`` thousands,
  the first element of a list (``lr=[5e-05, 5e-05]``), optionally quoted, a step fraction ``N/M``
  (``step:12/6200``), and a unit (``ms``, ``s``, ``%``, ``GiB``...: the value is kept as logged, the
  unit recorded) or a magnitude (``K``, ``M``, ``B``: multiplied out);
- the pairs of a line are separated by anything that is not a pair: ``|``, ``,``, ``;``, tabs, runs of
  spaces, brackets.

A line is a *metric line* when one pair is a step (:data:`STEP_KEYS`, or a multi-word key ending in one:
``global step``, ``validate step``) and at least one other pair is a number; or, without a step, when it
carries a loss or perplexity pair (``chosen: 0.1, rejected: 0.0, loss: 0.69``, ``ppl: 2.01``): such a line
belongs to the last step seen. Keys that are not measurements are dropped (:data:`NOT_METRICS`: ranks,
pids, ``logging.py:96`` source locations).

The same grammar is used twice, so that both give the same rows: :func:`parse_line` for one line (the
:mod:`parsers.lines` contract) and :func:`parse_block` for a polars Series of lines, vectorised with
polars' string kernels (Rust ``regex``; the patterns below use no look-around for that reason). The
text reader (:mod:`parsers.textlog`) sends the lines no framework module claims through
:func:`parse_block`, which is what makes it fast.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from typing import Any

import polars as pl

from parsers.lines import LineRecord, metric

STEP_KEYS = frozenset({
    "step", "global_step", "global step", "globalstep", "iteration", "iter", "it",
    "num_updates", "update", "updates", "current_steps", "current_step", "_step", "s", "train_step",
    "trainer/global_step", "batch", "optimizer_step",
})
"""Keys that name the step. ``epoch`` is a step only when nothing else is (see :data:`EPOCH_KEYS`)."""
EPOCH_KEYS = frozenset({"epoch", "ep"})
NOT_METRICS = frozenset({"rank", "local_rank", "global_rank", "pid", "gpu", "device", "node", "worker", "tid",
                         "line", "port", "seed"})
"""Keys dropped from a metric line: identifiers, not measurements."""
_LOSSY = re.compile(r"(?i)loss|ppl|perplexity")
CODE = (r"^\s*(?:def |class |if |elif |else:|for |while |return |import |from \S+ import |print\(|#|@\w|with |"
        r"assert |raise |try:|except|lambda )|^\s+[A-Za-z_][\w.\[\]]*\s*[-+*/]?=\s|^\s*[\w.]+\s*:\s*\w+\s*=")
"""Python source (a script that printed itself before training): never a metric line."""
_CODE = re.compile(CODE)

_NUM = (r"[-+]?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?"
        r"|(?i:nan|inf(?:inity)?))")
_WORD = r"[A-Za-z_][A-Za-z0-9_./@-]*"
PAIR = (rf"['\"]?({_WORD}(?: {_WORD}){{0,3}})['\"]?(?:\s*\([^()]{{0,40}}\))?"
        rf"(?:\s*[:=]\s*|[ \t]+)\[?\s*['\"]?({_NUM})(?:\s*/\s*(\d+))?['\"]?"
        r"(ms|s|%|GiB|GB|MiB|MB|KiB|KB|K|M|B|G|x|it/s|tok/s)?(?:[\s,|;:\])}'\"]|$)")
"""One pair; groups: key, value, fraction denominator, unit. Valid in Python ``re`` and Rust ``regex``."""
_PAIR = re.compile(PAIR)
CANDIDATE = (r"(?i)(?:^|[^A-Za-z0-9_])(?:global[ _]?step|step|steps|iter|iters|iteration|it|num_updates|update|updates"
             r"|current_steps|_step|s|epoch|ep|batch)['\"]?\s*[:=#]?\s*['\"]?\d|(?:loss|ppl|perplexity)['\"]?"
             r"(?:\s*\([^()]{0,40}\))?(?:\s*[:=]\s*|[ \t]+)['\"]?[-+]?(?:\d|\.\d|(?i:nan|inf))")
"""A cheap prefilter: lines that may be metric lines (a step-like key before a number, or a loss pair)."""
_MAGNITUDE = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9}
_UNITS = {"ms", "s", "%", "GiB", "GB", "MiB", "MB", "KiB", "KB", "x", "it/s", "tok/s"}


def _value(text: str) -> float:
    t = text.replace(",", "").lower()
    return float(t)  # float() reads nan, inf, infinity in any case


@lru_cache(maxsize=8192)
def classify(key: str) -> tuple[str, str]:
    """What a key is: ``("step", ...)``, ``("epoch", ...)``, ``("drop", ...)`` or ``("metric", name)``.

    Args:
        key: The key as logged (quotes removed).

    Returns:
        ``(kind, canonical name)``; the name is the canonical metric for ``"metric"``.
    """
    low = key.lower().strip()
    last = low.rsplit(" ", 1)[-1]
    if low in STEP_KEYS or (" " in low and last in ("step", "iteration", "iter")):
        return "step", low
    if low in EPOCH_KEYS:
        return "epoch", low
    if low in NOT_METRICS or low.endswith(".py") or re.search(r"\.py:\d*$", low):
        return "drop", low
    return "metric", metric(key, None)[0]


def _scale(value: float, unit: str | None) -> float:
    if unit and unit in _MAGNITUDE:
        return value * _MAGNITUDE[unit]
    return value


def parse_line(line: str, state: dict) -> LineRecord | None:
    """Parse one line with the general grammar.

    Args:
        line: A cleaned line (ANSI escapes and rank prefixes removed).
        state: Per-file state: ``kv_units`` (key -> unit as logged) and ``kv_total_steps`` are filled in.

    Returns:
        A record with the step (``None``: the last step seen) and the metric pairs, or ``None`` when the
        line is not a metric line.
    """
    if _CODE.search(line):
        return None
    step: int | None = None
    epoch: float | None = None
    out = []
    lossy = False
    for m in _PAIR.finditer(line):
        key, val, frac, unit = m.groups()
        kind, name = classify(key)
        try:
            v = _scale(_value(val), unit)
        except ValueError:
            continue
        if kind == "step":
            if step is None and math.isfinite(v) and v == int(v) and v >= 0:
                step = int(v)
                if frac:
                    state["kv_total_steps"] = int(frac)
            continue
        if kind == "epoch":
            if epoch is None:
                epoch = v
            out.append(metric(key, v, "epoch"))
            continue
        if kind == "drop":
            continue
        if unit in _UNITS:
            state.setdefault("kv_units", {})[key] = unit
        lossy = lossy or bool(_LOSSY.search(key))
        out.append(metric(key, v, name))
    if step is None and epoch is not None and out and any(n != "epoch" for n, _, _ in out):
        if epoch == int(epoch):  # an epoch-indexed line (``Epoch 3 | loss 1.2``): the epoch is the step
            step = int(epoch)
            state["kv_epoch_steps"] = True
    if not any(n != "epoch" for n, _, _ in out):
        return None
    if step is None and not lossy:
        return None
    return LineRecord("generic", step=step, metrics=out)


def parse_block(lines: pl.Series) -> pl.DataFrame:
    """Parse many lines at once with the grammar of :func:`parse_line`.

    Args:
        lines: Cleaned lines (Utf8), in file order; position ``i`` is line ``i`` of the block.

    Returns:
        One row per pair: ``line`` (u32 position), ``key`` (as logged), ``value`` (f64, magnitudes
        multiplied out), ``frac`` (denominator of an ``N/M`` fraction or null), ``unit`` (or null).
        Lines without a pair have no row. The step and metric roles are left to :func:`lines_of`.
    """
    df = pl.DataFrame({"text": lines}).with_row_index("line")
    df = df.select("line", pl.col("text").str.extract_all(PAIR).alias("m")).explode("m").drop_nulls("m")
    if df.height == 0:
        return pl.DataFrame(schema={"line": pl.UInt32, "key": pl.Utf8, "value": pl.Float64, "frac": pl.Int64,
                                    "unit": pl.Utf8})
    g = pl.col("m").str.extract_groups(PAIR)
    df = df.select("line", g.alias("g")).unnest("g")
    df.columns = ["line", "key", "raw", "frac", "unit"]
    mag = pl.col("unit").replace_strict(_MAGNITUDE, default=1.0, return_dtype=pl.Float64)
    return df.select(
        "line", "key",
        (pl.col("raw").str.replace_all(",", "", literal=True).str.to_lowercase()
         .cast(pl.Float64, strict=False) * mag).alias("value"),
        pl.col("frac").cast(pl.Int64, strict=False), "unit",
    ).drop_nulls("value")


def lines_of(pairs: pl.DataFrame, state: dict) -> list[tuple[int, int | None, list[tuple[str, str, float]]]]:
    """Group the pairs of :func:`parse_block` into metric lines, with the rules of :func:`parse_line`.

    Args:
        pairs: The output of :func:`parse_block`.
        state: Per-file state, as in :func:`parse_line`.

    Returns:
        ``(line position, step or None, [(metric, tag, value), ...])`` for every metric line, in order.
    """
    if pairs.height == 0:
        return []
    keys = pairs.get_column("key").unique().to_list()
    kinds = {k: classify(k) for k in keys}
    lossy_key = {k: bool(_LOSSY.search(k)) for k in keys}
    out: list[tuple[int, int | None, list[tuple[str, str, float]]]] = []
    cur = -1
    step: int | None = None
    epoch: float | None = None
    mets: list[tuple[str, str, float]] = []
    lossy = False

    def close() -> None:
        nonlocal step
        if cur < 0:
            return
        if step is None and epoch is not None and epoch == int(epoch) and any(n != "epoch" for n, _, _ in mets):
            step = int(epoch)
            state["kv_epoch_steps"] = True
        if any(n != "epoch" for n, _, _ in mets) and (step is not None or lossy):
            out.append((cur, step, mets))

    units = state.setdefault("kv_units", {})
    for line, key, v, frac, unit in pairs.iter_rows():
        if line != cur:
            close()
            cur, step, epoch, mets, lossy = line, None, None, [], False
        kind, name = kinds[key]
        if kind == "step":
            if step is None and v == v and abs(v) != math.inf and v == int(v) and v >= 0:
                step = int(v)
                if frac is not None:
                    state["kv_total_steps"] = int(frac)
            continue
        if kind == "epoch":
            if epoch is None:
                epoch = v
            mets.append(("epoch", key, v))
            continue
        if kind == "drop":
            continue
        if unit in _UNITS:
            units[key] = unit
        lossy = lossy or lossy_key[key]
        mets.append((name, key, v))
    close()
    if not units:
        state.pop("kv_units", None)
    return out


def meta_of(state: dict[str, Any]) -> dict[str, Any]:
    """Facts the general reader found (units, total steps, epoch-indexed lines) for ``ParseResult.meta``."""
    meta: dict[str, Any] = {}
    if state.get("kv_units"):
        meta["units"] = dict(state["kv_units"])
    if state.get("kv_total_steps"):
        meta["total_steps"] = state["kv_total_steps"]
    if state.get("kv_epoch_steps"):
        meta["step_unit"] = "epoch"
    return meta
