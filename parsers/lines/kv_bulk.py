r"""The general grammar of :mod:`parsers.lines.kv` over a whole block of lines at once (polars, no per-line Python).

Lines are grouped by *shape*: the line with every digit run that starts a token replaced by ``#``
(:data:`SHAPE`; digits inside a name such as ``top5`` or ``loss_0`` are kept, so lines of one shape
have the same keys). A shape that at least :data:`TEMPLATE_MIN` lines share is read by a *plan*, made
once per file from one of its lines with :func:`parsers.lines.kv.classify`: which number token of the
line is the step, the epoch, a fraction's denominator or a metric, with the metric's name. Every line
of all such shapes is then read by one number scan over the block, one join with the plans and a few
column operations. Lines of rarer shapes are read by the pair pattern itself (:func:`_regex_pairs`).
Both give what :func:`parsers.lines.kv.parse_line` gives line by line (a hypothesis test in
``tests/test_parsers_kv.py`` checks it).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import polars as pl

from parsers.lines.kv import (
    _LOSSY,
    _MAGNITUDE,
    _NUM,
    _PAIR,
    _UNITS,
    DURATION,
    DURATION_REPL,
    EPOCH_ITER,
    EPOCH_ITER_REPL,
    EPOCH_THEN_ITER,
    EPOCH_THEN_ITER_REPL,
    NESTED,
    NESTED_REPL,
    PAIR,
    classify,
    late_rewrites,
)

SHAPE = r"(?-u:\b)[0-9]+"
"""Digit runs that start a token (Rust ``regex``): the line's *shape* has them replaced by ``#``."""
TEMPLATE_MIN = 8
"""A shape that this many lines of a block share is read by a plan (one number scan per line)."""
_NUMTOK = re.compile(_NUM)
_STEP, _EPOCH, _METRIC = 0, 1, 2
SIG_SEP = "\x1f"
"""Joins the keys of a metric line into its counter's name (``parsers.textlog``: a restart is judged per counter)."""
_EMPTY_PAIRS = {"line": pl.UInt32, "key": pl.Utf8, "value": pl.Float64, "frac": pl.Int64, "unit": pl.Utf8}
_EMPTY_LINES = {"line": pl.UInt32, "step": pl.Int64, "dup": pl.Boolean, "sig": pl.Utf8, "ep": pl.Boolean}
_EMPTY_METS = {"line": pl.UInt32, "metric": pl.Utf8, "tag": pl.Utf8, "value": pl.Float64}


def _template(line: str) -> list[tuple[str, int, int | None, str | None]] | None:
    """Where each pair's value sits among the line's number tokens: ``[(key, token, frac token, unit)]``.

    ``None`` when a value is not one whole token (the pair pattern then reads the shape).
    """
    toks = [(m.start(), m.end()) for m in _NUMTOK.finditer(line)]
    at = {st: k for k, (st, _) in enumerate(toks)}
    out = []
    for m in _PAIR.finditer(line):
        key, _, frac, unit = m.groups()
        vs, ve = m.span(2)
        k = at.get(vs)
        if k is None or toks[k][1] != ve:
            return None
        f = None
        if frac is not None:
            fs, fe = m.span(3)
            f = at.get(fs)
            if f is None or toks[f][1] != fe:
                return None
        out.append((key, k, f, unit))
    return out


class Plan:
    """How the lines of one shape are read: one row per number token that matters.

    Attributes:
        rows: ``(k, fk, role, magnitude, metric, tag)`` in token order: token ``k`` is a step, an epoch or
            a metric value (an epoch is also a metric row named ``epoch``); ``fk`` is the token of its
            ``N/M`` denominator (-1: none).
        has_metric: The line carries a metric (not only a step and an epoch).
        lossy: One metric is a loss or perplexity (a line without a step is then still a metric line).
        dup: Two metrics of the line have one canonical name (:func:`parsers.lines.dedupe_canonical`).
        units: ``key -> unit`` for metrics logged with a unit.
    """

    def __init__(self, tpl: list[tuple[str, int, int | None, str | None]]) -> None:
        self.rows: list[tuple[int, int, int, float, str, str]] = []
        self.units: dict[str, str] = {}
        names: list[str] = []
        self.lossy = False
        for key, k, f, unit in tpl:
            kind, name = classify(key)
            mag = _MAGNITUDE.get(unit or "", 1.0)
            fk = -1 if f is None else f
            if kind == "step":
                self.rows.append((k, fk, _STEP, mag, "", key))
            elif kind == "epoch":
                self.rows.append((k, fk, _EPOCH, mag, "epoch", key))
                names.append("epoch")
            elif kind == "metric":
                self.rows.append((k, fk, _METRIC, mag, name, key))
                names.append(name)
                self.lossy = self.lossy or bool(_LOSSY.search(key))
                if unit in _UNITS:
                    self.units[key] = unit
        self.has_metric = any(r[2] == _METRIC for r in self.rows)
        self.sig = SIG_SEP.join(r[5] for r in self.rows if r[2] != _STEP)
        self.dup = len(set(names)) < len(names)


def _regex_pairs(df: pl.DataFrame) -> pl.DataFrame:
    """The pairs of lines read by the pair pattern (capture groups: slower, any line)."""
    df = df.select("line", pl.col("text").str.extract_all(PAIR).alias("m")).explode("m").drop_nulls("m")
    if df.height == 0:
        return pl.DataFrame(schema=_EMPTY_PAIRS)
    g = pl.col("m").str.extract_groups(PAIR)
    df = df.select("line", g.alias("g")).unnest("g")
    df.columns = ["line", "key", "raw", "frac", "unit"]
    mag = pl.col("unit").replace_strict(_MAGNITUDE, default=1.0, return_dtype=pl.Float64)
    return df.select(
        "line", "key",
        (pl.col("raw").str.replace_all(",", "", literal=True).str.to_lowercase()
         .cast(pl.Float64, strict=False) * mag).alias("value"),
        pl.col("frac").cast(pl.Int64, strict=False), "unit",
    ).drop_nulls("value").cast(_EMPTY_PAIRS)


def _valid_step(v: pl.Expr) -> pl.Expr:
    return v.is_finite() & (v >= 0) & (v == v.floor())


def _line_rules(per: pl.DataFrame, state: dict) -> pl.DataFrame:
    """Per line (``line, step, frac, epoch, epoch_frac, has_metric, lossy``): the step rules of ``parse_line``.

    ``Epoch[3/100], Step[50/196]`` counts within the epoch (step = epoch x 196 + 50); a line with an epoch
    and no step has the epoch as its step; a line is kept when it has a metric and a step or a loss.
    """
    whole = pl.col("epoch").is_finite() & (pl.col("epoch") == pl.col("epoch").floor())
    within = (pl.col("step").is_not_null() & pl.col("frac").is_not_null() & pl.col("frac").gt(0)
              & pl.col("epoch_frac").fill_null(False) & whole)
    ep_step = pl.col("step").is_null() & pl.col("epoch").is_not_null() & whole
    per = per.with_columns(within.fill_null(False).alias("within"), ep_step.fill_null(False).alias("ep_step"))
    big = pl.col("step").is_not_null() & (pl.col("step").abs() >= 2.0**63)  # no int64 holds it: not a step
    per = per.with_columns(big.fill_null(False).alias("big"))
    per = per.with_columns(
        pl.when("within").then(pl.col("epoch").cast(pl.Int64, strict=False) * pl.col("frac")
                               + pl.col("step").cast(pl.Int64, strict=False))
        .when("ep_step").then(pl.col("epoch").cast(pl.Int64, strict=False))
        .otherwise(pl.col("step").cast(pl.Int64, strict=False)).alias("step"))
    if per.get_column("within").any():
        state["kv_step_within_epoch"] = True
    per = per.filter(pl.col("has_metric") & (pl.col("step").is_not_null() | pl.col("lossy") | pl.col("big")))
    n_big = int(per.get_column("big").sum())
    if n_big:
        state["kv_step_out_of_range"] = state.get("kv_step_out_of_range", 0) + n_big
        per = per.filter(~pl.col("big"))
    if per.get_column("ep_step").any():
        state["kv_epoch_steps"] = True
    return per


def _regex_frames(df: pl.DataFrame, state: dict, notes: dict) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Lines read by the pair pattern: ``(lines, metrics)`` as :func:`read_block` returns them."""
    pairs = _regex_pairs(df)
    if pairs.height == 0:
        return pl.DataFrame(schema=_EMPTY_LINES), pl.DataFrame(schema=_EMPTY_METS)
    keys = pairs.get_column("key").unique().to_list()
    kinds = {k: classify(k) for k in keys}
    look = pl.DataFrame({"key": keys, "kind": [kinds[k][0] for k in keys],
                         "metric": ["epoch" if kinds[k][0] == "epoch" else kinds[k][1] for k in keys],
                         "lossy": [bool(_LOSSY.search(k)) for k in keys]})
    df = pairs.join(look, on="key", how="left", maintain_order="left")
    is_step = (pl.col("kind") == "step") & _valid_step(pl.col("value"))
    per = df.group_by("line", maintain_order=True).agg(
        pl.col("value").filter(is_step).first().alias("step"),
        pl.col("frac").filter(is_step).first().alias("frac"),
        pl.col("value").filter(pl.col("kind") == "epoch").first().alias("epoch"),
        pl.col("frac").filter(pl.col("kind") == "epoch").first().is_not_null().alias("epoch_frac"),
        ((pl.col("kind") == "metric") & pl.col("lossy")).any().alias("lossy"),
        (pl.col("kind") == "metric").any().alias("has_metric"),
    )
    fr = per.filter(pl.col("frac").is_not_null())
    if fr.height:
        notes["frac"].append((int(fr.get_column("line")[-1]), int(fr.get_column("frac")[-1])))
    units = df.filter(pl.col("unit").is_in(list(_UNITS)) & (pl.col("kind") == "metric"))
    notes["units"].extend(units.select("line", "key", "unit").iter_rows())
    per = _line_rules(per, state)
    mets = df.filter(pl.col("kind").is_in(["metric", "epoch"])).join(per.select("line"), on="line", how="semi",
                                                                     maintain_order="left")
    mets = mets.select("line", "metric", pl.col("key").alias("tag"), "value")
    dup = mets.filter(pl.struct("line", "metric").is_duplicated()).get_column("line").unique()
    sig = mets.group_by("line", maintain_order=True).agg(pl.col("tag").str.join(SIG_SEP).alias("sig"))
    lines = per.select("line", "step", pl.col("line").is_in(dup.implode()).alias("dup"),
                       pl.col("ep_step").alias("ep")).join(sig, on="line", how="left", maintain_order="left")
    lines = lines.with_columns(pl.col("sig").fill_null("")).select(list(_EMPTY_LINES))
    return lines, mets


def _first_per_line(li: np.ndarray, ok: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(lines, rows)``: for each line, its first row (in row order) where ``ok``."""
    rows = np.flatnonzero(ok)
    lines, first = np.unique(li[rows], return_index=True)
    return lines, rows[first]


class _Tokens:
    """Every (line, plan row) of a block's planned lines, as arrays over the block's flat number tokens.

    Every line of a shape has the same number tokens in the same places, so the value of plan row ``r``
    for line ``i`` is token ``start[i] + k[r]`` of the flat token column.

    Attributes:
        li: The line (row of the frame) of each item; ``r``: its plan row (into ``rows``).
        v: Its value (magnitude multiplied out); ``bad``: the token is not a number.
        role: ``_STEP``, ``_EPOCH`` or ``_METRIC``; ``fk``: its fraction token (-1: none); ``fval``: that value.
    """

    def __init__(self, df: pl.DataFrame, plans: list[Plan], codes: list[int]) -> None:
        ncode = max(codes) + 1
        self.rows = [r for p in plans for r in p.rows]
        count = np.zeros(ncode, np.int64)
        first = np.zeros(ncode, np.int64)
        at = 0
        for c, p in zip(codes, plans, strict=True):
            first[c], count[c] = at, len(p.rows)
            at += len(p.rows)
        toks = df.get_column("toks") if "toks" in df.columns else df.get_column("text").str.extract_all(_NUM)
        n_tok = toks.list.len().to_numpy().astype(np.int64)
        start = np.concatenate([[0], np.cumsum(n_tok)[:-1]])
        flat = toks.explode().cast(pl.Float64, strict=False)  # reads nan, inf, infinity in any case
        val = flat.fill_null(np.nan).to_numpy()
        null = flat.is_null().to_numpy()
        self.line_code = df.get_column("code").to_numpy().astype(np.int64)
        per_line = count[self.line_code]
        self.li = np.repeat(np.arange(df.height), per_line)
        off = np.arange(self.li.shape[0]) - np.repeat(np.cumsum(per_line) - per_line, per_line)
        self.r = np.repeat(first[self.line_code], per_line) + off
        tok = start[self.li] + np.array([x[0] for x in self.rows], np.int64)[self.r]
        self.v = val[tok] * np.array([x[3] for x in self.rows], np.float64)[self.r]
        self.bad = null[tok]
        self.role = np.array([x[2] for x in self.rows], np.int8)[self.r]
        self.fk = np.array([x[1] for x in self.rows], np.int64)[self.r]
        ftok = np.where(self.fk >= 0, start[self.li] + np.maximum(self.fk, 0), 0)
        self.fval = np.where(self.fk >= 0, val[ftok], np.nan)

    def per_line(self, n: int) -> dict[str, np.ndarray]:
        """Per line: the first valid step and its fraction, the first epoch and whether it has a fraction."""
        v, role, bad = self.v, self.role, self.bad
        with np.errstate(invalid="ignore"):
            ok_step = (role == _STEP) & ~bad & np.isfinite(v) & (v >= 0) & (v == np.floor(v))
        out = {"step": np.full(n, np.nan), "frac": np.full(n, np.nan), "epoch": np.full(n, np.nan),
               "epoch_frac": np.zeros(n, bool), "has_epoch": np.zeros(n, bool)}
        sl, sr = _first_per_line(self.li, ok_step)
        out["step"][sl], out["frac"][sl] = v[sr], self.fval[sr]
        el, er = _first_per_line(self.li, (role == _EPOCH) & ~bad)
        out["epoch"][el], out["epoch_frac"][el], out["has_epoch"][el] = v[er], self.fk[er] >= 0, True
        return out


def _plan_frames(df: pl.DataFrame, plans: list[Plan], codes: list[int], state: dict,
                 notes: dict) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Lines of planned shapes (``df``: ``line, text, code``): one number scan, then arrays (no join, no loop)."""
    t = _Tokens(df, plans, codes)
    n = df.height
    a = t.per_line(n)
    shape = dict(zip(codes, plans, strict=True))
    ncode = max(codes) + 1
    flags = np.array([[shape[c].has_metric, shape[c].lossy, shape[c].dup] if c in shape else [False] * 3
                      for c in range(ncode)], bool)
    line_no = df.get_column("line")
    sigs = pl.Series([shape[c].sig if c in shape else "" for c in range(ncode)], dtype=pl.Utf8)
    lc = t.line_code
    per = pl.DataFrame({
        "line": line_no, "step": pl.Series(a["step"], nan_to_null=True),
        "frac": pl.Series(a["frac"], nan_to_null=True).cast(pl.Int64, strict=False),
        "epoch": pl.Series(np.where(a["has_epoch"], a["epoch"], 0.0)),
        "epoch_frac": a["epoch_frac"], "has_metric": flags[lc, 0], "lossy": flags[lc, 1],
        "dup": flags[lc, 2], "sig": sigs.gather(pl.Series(lc, dtype=pl.UInt32))})
    per = per.with_columns(pl.when(pl.Series(a["has_epoch"])).then(pl.col("epoch")).alias("epoch"))
    fr = np.flatnonzero(~np.isnan(a["frac"]))
    if fr.size:
        notes["frac"].append((int(line_no[int(fr[-1])]), int(a["frac"][fr[-1]])))
    for c, p in shape.items():
        if p.units:
            last = int(line_no[int(np.flatnonzero(lc == c)[-1])])
            notes["units"].extend((last, k, u) for k, u in p.units.items())
    per = _line_rules(per, state)
    kept = np.zeros(n, bool)
    kept[np.searchsorted(line_no.to_numpy(), per.get_column("line").to_numpy())] = True
    m = ((t.role == _METRIC) | (t.role == _EPOCH)) & ~t.bad & kept[t.li]
    ridx = pl.Series(t.r[m], dtype=pl.UInt32)
    mets = pl.DataFrame({"line": line_no.gather(pl.Series(t.li[m], dtype=pl.UInt32)),
                         "metric": pl.Series([x[4] for x in t.rows], dtype=pl.Utf8).gather(ridx),
                         "tag": pl.Series([x[5] for x in t.rows], dtype=pl.Utf8).gather(ridx),
                         "value": pl.Series(t.v[m], dtype=pl.Float64, nan_to_null=False)})
    return per.select("line", "step", "dup", "sig", pl.col("ep_step").alias("ep")).select(list(_EMPTY_LINES)), mets


def _note_state(notes: dict[str, list], state: dict[str, Any]) -> None:
    """The block's last step total and each key's last unit (by line, over both paths) into ``state``."""
    if notes["frac"]:
        state["kv_total_steps"] = max(notes["frac"])[1]
    if notes["units"]:
        units = state.setdefault("kv_units", {})
        for _, key, unit in sorted(notes["units"], key=lambda x: x[0]):
            units[key] = unit


def _rewrite(text: pl.Series, pattern: str, repl: str, *, every: bool) -> pl.Series:
    """``text`` with ``pattern`` replaced by ``repl`` (the first match, or ``every`` one).

    Only the lines that match are rewritten: a match test needs no capture groups (fast); the replace does.
    """
    idx = text.str.contains(pattern).arg_true()
    if idx.len() == 0:
        return text
    part = text.gather(idx)
    part = part.str.replace_all(pattern, repl) if every else part.str.replace(pattern, repl)
    return text.clone().scatter(idx, part)  # scatter writes in place: never into the caller's lines


def prepare_block(lines: pl.Series, shapes: pl.Series | None) -> tuple[pl.Series, pl.Series, pl.Series, pl.Series]:
    """The part of :func:`read_block` that needs no state (a worker thread may make it ahead).

    Returns:
        ``(text, unique shapes, each line's shape code (u32), its number tokens (list[str]))``; ``text``: the
        lines with nested counters, durations and a leading ``[N/M]`` rewritten as in ``parse_line``.
    """
    if shapes is None:
        shapes = lines.str.replace_all(SHAPE, "#")
    text = lines
    if text.str.contains("]", literal=True).any():  # nested counters, as in parse_line
        text = text.str.replace(NESTED, NESTED_REPL[1]).str.replace(EPOCH_ITER, EPOCH_ITER_REPL[1])
    # ``epoch 3 - iter 50/500`` is iteration 50 of epoch 3; ``eta: 4:59:11`` is no number (as in parse_line)
    text = _rewrite(text, EPOCH_THEN_ITER, EPOCH_THEN_ITER_REPL[1], every=False)
    text = _rewrite(text, DURATION, DURATION_REPL[1], every=True)
    uniq = shapes.unique(maintain_order=True)
    code = shapes.replace_strict(uniq, pl.Series(range(uniq.len()), dtype=pl.UInt32), return_dtype=pl.UInt32)
    text = late_rewrites(text, code, uniq)  # ``[N/M] loss: X``: N is the step; ``olmo.train:990 INFO``: no pairs
    return text, uniq, code, text.str.extract_all(_NUM)


def read_block(lines: pl.Series, shapes: pl.Series | None, state: dict[str, Any],
               cache: dict[str, Plan | None] | None = None,
               pre: tuple[pl.Series, pl.Series, pl.Series, pl.Series] | None = None,
               ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Read many lines at once with the grammar of :func:`parsers.lines.kv.parse_line`.

    Args:
        lines: Cleaned candidate lines (Utf8), in file order; position ``i`` is line ``i``.
        shapes: The lines with :data:`SHAPE` replaced by ``#`` (computed when ``None``).
        state: Per-file state, as in ``parse_line`` (``kv_units``, ``kv_total_steps``, ... are set).
        cache: Plans by shape, kept by the caller from block to block (``None``: a new one).
        pre: :func:`prepare_block` of ``lines`` and ``shapes``, made ahead (``None``: made here).

    Returns:
        ``(lines, metrics)``: ``lines`` has one row per metric line (``line`` u32, ``step`` i64 or null:
        the last step seen, ``dup`` bool: two of its metrics share a canonical name, ``sig``: its keys, ``ep``:
        the step is its epoch), in line order;
        ``metrics`` one row per metric of those lines (``line``, ``metric``, ``tag``, ``value``), by line,
        then by position in the line.
    """
    cache = {} if cache is None else cache
    text, uniq, code, toks = prepare_block(lines, shapes) if pre is None else pre
    df = pl.DataFrame({"text": text, "code": code, "toks": toks}).with_row_index("line")
    counts = df.group_by("code").agg(pl.len().alias("n"), pl.col("text").first().alias("example"))
    uniq_l = uniq.to_list()
    planned: list[int] = []
    plans: list[Plan] = []
    for c, n, example in counts.iter_rows():
        shape = uniq_l[c]
        if shape not in cache:
            if n < TEMPLATE_MIN or "#,#" in shape:
                continue
            tpl = _template(example)
            cache[shape] = None if tpl is None else Plan(tpl)
        if cache[shape] is not None:
            planned.append(c)
            plans.append(cache[shape])  # type: ignore[arg-type]
    notes: dict[str, list] = {"frac": [], "units": []}
    parts = []
    in_plan = pl.col("code").is_in(pl.Series(planned, dtype=pl.UInt32).implode())
    if planned:
        parts.append(_plan_frames(df.filter(in_plan), plans, planned, state, notes))
    if len(planned) < len(uniq_l):
        parts.append(_regex_frames(df.filter(~in_plan), state, notes))
    _note_state(notes, state)
    if not parts:
        return pl.DataFrame(schema=_EMPTY_LINES), pl.DataFrame(schema=_EMPTY_METS)
    if len(parts) == 1:
        return parts[0][0].cast(_EMPTY_LINES), parts[0][1].cast(_EMPTY_METS)
    ld = pl.concat([p[0].cast(_EMPTY_LINES) for p in parts]).sort("line", maintain_order=True)
    md = pl.concat([p[1].cast(_EMPTY_METS) for p in parts]).sort("line", maintain_order=True)
    return ld, md
