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

import polars as pl

from parsers.lines.kv import (
    _LOSSY,
    _MAGNITUDE,
    _NUM,
    _PAIR,
    _UNITS,
    LEAD,
    LEAD_REPL,
    PAIR,
    classify,
)

SHAPE = r"(?-u:\b)[0-9]+"
"""Digit runs that start a token (Rust ``regex``): the line's *shape* has them replaced by ``#``."""
TEMPLATE_MIN = 8
"""A shape that this many lines of a block share is read by a plan (one number scan per line)."""
_NUMTOK = re.compile(_NUM)
_STEP, _SFRAC, _EPOCH, _EFRAC, _METRIC = 0, 1, 2, 3, 4
_PLAN_SCHEMA = {"code": pl.UInt32, "k": pl.Int64, "j": pl.Int32, "role": pl.Int8, "mag": pl.Float64,
                "metric": pl.Utf8, "tag": pl.Utf8}
_EMPTY_PAIRS = {"line": pl.UInt32, "key": pl.Utf8, "value": pl.Float64, "frac": pl.Int64, "unit": pl.Utf8}
_EMPTY_LINES = {"line": pl.UInt32, "step": pl.Int64, "dup": pl.Boolean}
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
        rows: ``(k, j, role, magnitude, metric, tag)``: token ``k`` is pair ``j``'s step, step fraction,
            epoch, epoch fraction or metric value (an epoch is also a metric row named ``epoch``).
        has_metric: The line carries a metric (not only a step and an epoch).
        lossy: One metric is a loss or perplexity (a line without a step is then still a metric line).
        dup: Two metrics of the line have one canonical name (:func:`parsers.lines.dedupe_canonical`).
        units: ``key -> unit`` for metrics logged with a unit.
    """

    def __init__(self, tpl: list[tuple[str, int, int | None, str | None]]) -> None:
        self.rows: list[tuple[int, int, int, float, str | None, str | None]] = []
        self.units: dict[str, str] = {}
        names: list[str] = []
        self.lossy = False
        for j, (key, k, f, unit) in enumerate(tpl):
            kind, name = classify(key)
            mag = _MAGNITUDE.get(unit or "", 1.0)
            if kind == "step":
                self.rows.append((k, j, _STEP, mag, None, None))
                if f is not None:
                    self.rows.append((f, j, _SFRAC, 1.0, None, None))
            elif kind == "epoch":
                self.rows.append((k, j, _EPOCH, mag, "epoch", key))
                if f is not None:
                    self.rows.append((f, j, _EFRAC, 1.0, None, None))
                names.append("epoch")
            elif kind == "metric":
                self.rows.append((k, j, _METRIC, mag, name, key))
                names.append(name)
                self.lossy = self.lossy or bool(_LOSSY.search(key))
                if unit in _UNITS:
                    self.units[key] = unit
        self.rows.sort()
        self.has_metric = any(r[2] == _METRIC for r in self.rows)
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
    lines = per.select("line", "step", pl.col("line").is_in(dup.implode()).alias("dup"))
    return lines, mets


def _plan_frames(df: pl.DataFrame, plans: list[Plan], codes: list[int], state: dict,
                 notes: dict) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Lines of planned shapes (``df``: ``line, text, code``): one number scan, one join with the plans."""
    rows = [(c, *r) for c, p in zip(codes, plans, strict=True) for r in p.rows]
    plan = pl.DataFrame(rows, schema=_PLAN_SCHEMA, orient="row")
    shape = pl.DataFrame({"code": pl.Series(codes, dtype=pl.UInt32),
                          "has_metric": [p.has_metric for p in plans], "lossy": [p.lossy for p in plans],
                          "dup": [p.dup for p in plans]})
    toks = (df.select("line", "code", pl.col("text").str.extract_all(_NUM).alias("t"))
            .with_columns(pl.int_ranges(pl.col("t").list.len()).alias("k")).explode(["t", "k"]))
    j = toks.join(plan, on=["code", "k"], how="inner", maintain_order="left").select(
        "line", "j", "role", "metric", "tag",
        (pl.col("t").str.to_lowercase().cast(pl.Float64, strict=False) * pl.col("mag")).alias("value"))
    role = pl.col("role")
    step = (j.filter((role == _STEP) & _valid_step(pl.col("value")))
            .unique(subset="line", keep="first", maintain_order=True).select("line", "j", pl.col("value").alias("step")))
    fracs = j.filter(role == _SFRAC).select("line", "j", pl.col("value").cast(pl.Int64).alias("frac"))
    step = step.join(fracs, on=["line", "j"], how="left").drop("j")
    epoch = (j.filter(role == _EPOCH).unique(subset="line", keep="first", maintain_order=True)
             .select("line", "j", pl.col("value").alias("epoch")))
    efr = j.filter(role == _EFRAC).select("line", "j", pl.lit(True).alias("epoch_frac"))
    epoch = epoch.join(efr, on=["line", "j"], how="left").drop("j")
    per = (df.select("line", "code").join(shape, on="code", how="left", maintain_order="left")
           .join(step, on="line", how="left", maintain_order="left")
           .join(epoch, on="line", how="left", maintain_order="left"))
    fr = per.filter(pl.col("frac").is_not_null())
    if fr.height:
        notes["frac"].append((int(fr.get_column("line")[-1]), int(fr.get_column("frac")[-1])))
    for c, p in zip(codes, plans, strict=True):
        if p.units:
            last = int(df.filter(pl.col("code") == c).get_column("line")[-1])
            notes["units"].extend((last, k, u) for k, u in p.units.items())
    per = _line_rules(per, state)
    mets = (j.filter(role.is_in([_METRIC, _EPOCH]) & pl.col("value").is_not_null())
            .join(per.select("line"), on="line", how="semi", maintain_order="left")
            .select("line", "metric", "tag", "value"))
    return per.select("line", "step", "dup"), mets


def read_block(lines: pl.Series, shapes: pl.Series | None, state: dict[str, Any],
               cache: dict[str, Plan | None] | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Read many lines at once with the grammar of :func:`parsers.lines.kv.parse_line`.

    Args:
        lines: Cleaned candidate lines (Utf8), in file order; position ``i`` is line ``i``.
        shapes: The lines with :data:`SHAPE` replaced by ``#`` (computed when ``None``).
        state: Per-file state, as in ``parse_line`` (``kv_units``, ``kv_total_steps``, ... are set).
        cache: Plans by shape, kept by the caller from block to block (``None``: a new one).

    Returns:
        ``(lines, metrics)``: ``lines`` has one row per metric line (``line`` u32, ``step`` i64 or null:
        the last step seen, ``dup`` bool: two of its metrics share a canonical name), in line order;
        ``metrics`` one row per metric of those lines (``line``, ``metric``, ``tag``, ``value``), by line,
        then by position in the line.
    """
    cache = {} if cache is None else cache
    if shapes is None:
        shapes = lines.str.replace_all(SHAPE, "#")
    text = lines.str.replace(LEAD, LEAD_REPL[1])  # ``[N/M] loss: X``: N is the step (as in parse_line)
    uniq = shapes.unique(maintain_order=True)
    code = shapes.replace_strict(uniq, pl.Series(range(uniq.len()), dtype=pl.UInt32), return_dtype=pl.UInt32)
    df = pl.DataFrame({"text": text, "code": code}).with_row_index("line")
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
    if notes["frac"]:
        state["kv_total_steps"] = max(notes["frac"])[1]
    if notes["units"]:
        units = state.setdefault("kv_units", {})
        for _, key, unit in sorted(notes["units"], key=lambda x: x[0]):
            units[key] = unit
    if not parts:
        return pl.DataFrame(schema=_EMPTY_LINES), pl.DataFrame(schema=_EMPTY_METS)
    if len(parts) == 1:
        return parts[0][0].cast(_EMPTY_LINES), parts[0][1].cast(_EMPTY_METS)
    ld = pl.concat([p[0].cast(_EMPTY_LINES) for p in parts]).sort("line", maintain_order=True)
    md = pl.concat([p[1].cast(_EMPTY_METS) for p in parts]).sort("line", maintain_order=True)
    return ld, md
