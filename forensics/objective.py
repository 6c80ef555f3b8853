"""Which series is the run's training objective, and how each raw name was mapped (DESIGN.md section 2).

Runs log their objective under many names (``train/loss``, ``total_loss``, ``train_loss_step``, only
components such as ``box_loss``, only an evaluation loss or a perplexity). :func:`resolve` looks at the
whole run and picks, in rank order:

1. ``loss``: the training objective read directly (a name mapped to ``loss`` by
   :func:`forensics.schema.canonical_metric`), unless it is constant zero (a placeholder, not a loss);
2. the sum of the training loss components ``loss/<part>`` (YOLOv5 ``box+obj+cls``, detectron2 parts,
   DeepSpeed-Chat ``act+cri``) at the steps where they all were logged, constant-zero components left out;
   the rows are added as ``loss`` with the tag ``sum(...)``;
3. the training perplexity ``ppl``: its natural log is added as ``loss`` (tag ``log(<name>)``);
4. ``eval_loss``, then ``eval_ppl``: an evaluation objective only (the verdict may be healthy, and
   ``meta["objective"]["kind"]`` says ``evaluation``).

A user mapping (``--metric loss=COLUMN`` or ``forensics.toml``) wins over all of these. With none: ``inconclusive``.
"""

from __future__ import annotations

import re
from typing import Any

import polars as pl

from forensics.metric_rows import distinct_pairs
from forensics.schema import _ALIASES, _PREFIXES, explain_metric

_EVAL_OBJECTIVES = ("eval_loss", "ppl", "eval_ppl")
ZERO = "constant_zero:"
"""Prefix of the name a constant-zero ``loss`` series is kept under (it is not the loss)."""


def _single_eval_part(metrics: pl.DataFrame, names: dict[str, Any],
                      pairs: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The only evaluation loss of a run, logged per dataset or split, is ``eval_loss`` (said in ``names``).

    ``eval/paloma/c4_en/loss`` (named ``eval_loss/paloma_c4_en`` by rule) alone is the eval loss; several
    per-dataset eval losses stay as parts. ``pairs``: the frame's distinct (tag, metric) rows; returns
    ``(metrics, pairs)``, both renamed alike.
    """
    present = pairs.get_column("metric").unique().to_list()
    if "eval_loss" in present:
        return metrics, pairs
    parts = [m for m in present if m.startswith("eval_loss/") and not re.search(_STAT, m)]
    if len(parts) != 1:
        return metrics, pairs
    part = parts[0]
    for t in pairs.filter(pl.col("metric") == part).get_column("tag").unique().to_list():
        names[t] = {"metric": "eval_loss", "why": f"the run's only evaluation loss ({part})"}
    rename = pl.when(pl.col("metric") == part).then(pl.lit("eval_loss")).otherwise(pl.col("metric")).alias("metric")
    return metrics.with_columns(rename), pairs.with_columns(rename)


def _constant_zero(df: pl.DataFrame) -> bool:
    v = df.get_column("value").drop_nulls().drop_nans()
    return v.len() > 0 and bool((v == 0.0).all())


DISPLACED = "displaced:"
"""Prefix of the name a series logged under a canonical name keeps when the user named another series as that
metric (``--metric loss=loss_ce`` beside a logged ``loss``)."""
UNMATCHED = "no series named"
"""What :func:`apply_user_map` says of a mapping whose column no input holds (:func:`unmatched_mappings` reads it)."""


def unmatched_mappings(names: dict[str, Any], mapping: dict[str, str]) -> list[tuple[str, str]]:
    """The ``(canonical, column)`` pairs of ``mapping`` that :func:`apply_user_map` could not apply.

    Args:
        names: ``RunData.meta["names"]`` (raw name -> ``{"why": ...}`` or the why text).
        mapping: The user's ``{canonical: column}``.
    """
    out = []
    for canon, raw in mapping.items():
        why = names.get(raw)
        text = why.get("why", "") if isinstance(why, dict) else str(why or "")
        if UNMATCHED in text:
            out.append((canon, raw))
    return out


def apply_user_map(metrics: pl.DataFrame, mapping: dict[str, str]) -> tuple[pl.DataFrame, dict[str, str]]:
    """Rename series as the user said: ``{canonical: raw tag or metric}`` (``--metric loss=COLUMN``).

    Returns:
        The metrics and ``{raw: why}`` for every mapping applied.
    """
    why: dict[str, str] = {}
    for canon, raw in mapping.items():
        hit = pl.col("tag") == raw  # the name as logged first; a canonical name only when no tag is so named
        if metrics.filter(hit).height == 0:
            hit = pl.col("metric") == raw
        if metrics.filter(hit).height == 0:
            why[raw] = f"user mapping {canon}={raw}: {UNMATCHED} {raw!r} was found"
            continue
        if metrics.filter((pl.col("metric") == canon) & (pl.col("tag") == canon) & ~hit).height:
            why[canon] = (f"logged as {canon!r}; kept as {DISPLACED}{canon} "
                          f"(the user mapping {canon}={raw} names another)")
        displaced = pl.when(pl.col("tag") == canon).then(pl.lit(DISPLACED) + pl.col("tag")).otherwise(pl.col("tag"))
        metrics = metrics.with_columns(
            pl.when((pl.col("metric") == canon) & ~hit).then(displaced).otherwise(pl.col("metric")).alias("metric"))
        metrics = metrics.with_columns(pl.when(hit).then(pl.lit(canon)).otherwise(pl.col("metric")).alias("metric"))
        why[raw] = f"user mapping: {raw!r} is {canon!r} (--metric or forensics.toml)"
    return metrics, why


def resolve(metrics: pl.DataFrame) -> tuple[pl.DataFrame, dict[str, Any] | None, dict[str, Any]]:
    """Find the objective; returns the metrics (maybe with added ``loss`` rows), the objective, and the names.

    In this order: the training loss read directly (a constant-zero placeholder demoted, a loss logged as an
    interval statistic taken by its mean), the sum of its logged components, a promoted loss-function name,
    then an evaluation objective.

    Returns:
        ``(metrics, objective, names)``: ``objective`` is ``{"metric", "tags", "kind", "why"}`` or ``None``;
        ``names`` maps each raw tag to ``{"metric", "why"}`` (only tags whose name changed, plus demotions).
    """
    names: dict[str, Any] = {}
    if metrics.height == 0:
        return metrics, None, names
    pairs = distinct_pairs(metrics)  # a wide log's first record, else one pass over the long table
    metrics, pairs = _single_eval_part(metrics, names, pairs)
    _reader_names(pairs, names)
    metrics, loss = _direct_loss(metrics, names)
    if loss.height:
        tags = sorted(loss.get_column("tag").unique().to_list())
        return metrics, {"metric": "loss", "tags": tags, "kind": "training",
                         "why": "the training objective, read directly: " + ", ".join(tags)}, names
    summed = _loss_parts(metrics)
    if summed is not None:
        return summed[0], summed[1], names
    promoted = _promote(metrics)
    if promoted is not None:
        tag, kind, why = promoted
        metrics = metrics.with_columns(pl.when((pl.col("tag") == tag) & (pl.col("metric") == tag))
                                       .then(pl.lit("loss")).otherwise(pl.col("metric")).alias("metric"))
        names[tag] = {"metric": "loss", "why": why}
        return metrics, {"metric": "loss", "tags": [tag], "kind": kind, "why": why}, names
    ppl = metrics.filter(pl.col("metric") == "ppl")
    if ppl.height and not _constant_zero(ppl):  # the training perplexity: its log is the loss the detectors judge
        tags = sorted(set(ppl.get_column("tag").cast(pl.String).to_list()))
        rows = ppl.with_columns(pl.lit("loss").alias("metric"), pl.col("value").log().alias("value"),
                                ("log(" + pl.col("tag").cast(pl.String) + ")").alias("tag"))
        metrics = pl.concat([metrics, rows.select(metrics.columns)], how="vertical_relaxed")
        why = (f"no training loss was logged; the training perplexity {', '.join(tags)} is exp(loss), so its "
               "natural log is the loss")
        return metrics, {"metric": "loss", "tags": [f"log({t})" for t in tags], "kind": "training (log of the "
                         "perplexity)", "why": why}, names
    for m in _EVAL_OBJECTIVES:
        df = metrics.filter(pl.col("metric") == m)
        if df.height and not _constant_zero(df):
            tags = sorted(set(df.get_column("tag").to_list()))
            return metrics, {"metric": m, "tags": tags, "kind": "evaluation",
                             "why": f"no training loss was logged; the evaluation objective {m} ({', '.join(tags)}) "
                                    "is the only objective read"}, names
    return metrics, None, names


def _reader_names(pairs: pl.DataFrame, names: dict[str, Any]) -> None:
    """Record in ``names`` why each raw tag got the canonical name its reader gave it.

    ``pairs``: distinct (tag, metric) rows; a tag under two names keeps the last by (tag, metric): deterministic.
    """
    for tag, metric in pairs.sort("tag", "metric").iter_rows():
        if tag != metric:
            canon, why = explain_metric(tag)
            if canon != metric:
                why = "named by its reader (a format-specific rule)"
            names[tag] = {"metric": metric, "why": why}


def _direct_loss(metrics: pl.DataFrame, names: dict[str, Any]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(metrics, loss rows): a constant-zero ``loss`` demoted, a loss logged as interval statistics taken."""
    metrics = _split_co_logged(metrics, names)
    loss = metrics.select("metric", "tag", "value").filter(pl.col("metric") == "loss")  # the columns used only
    if loss.height and _constant_zero(loss):
        tags = sorted(loss.get_column("tag").unique().to_list())
        metrics = metrics.with_columns(pl.when(pl.col("metric") == "loss").then(pl.lit(ZERO) + pl.col("tag"))
                                       .otherwise(pl.col("metric")).alias("metric"))
        for t in tags:
            names[t] = {"metric": ZERO + t, "why": "constant zero on every row: not the loss (a placeholder)"}
        loss = metrics.filter(pl.col("metric") == "loss")
    if loss.height:
        return metrics, loss
    for cand in ("loss/mean", "loss/loss", "loss/loss/mean"):  # ``Loss/loss`` {mean, std, num} per interval
        df = metrics.filter(pl.col("metric") == cand)
        if df.height and not _constant_zero(df):
            metrics = metrics.with_columns(pl.when(pl.col("metric") == cand).then(pl.lit("loss"))
                                           .otherwise(pl.col("metric")).alias("metric"))
            for t in sorted(set(df.get_column("tag").to_list())):
                names[t] = {"metric": "loss", "why": f"{cand}: the loss (its mean over each logging interval)"}
            return metrics, metrics.filter(pl.col("metric") == "loss")
    return metrics, loss


def _split_co_logged(metrics: pl.DataFrame, names: dict[str, Any]) -> pl.DataFrame:
    """Two raw names read as ``loss`` in one file at the same steps, with other values, are two series.

    A MoE log's ``loss`` (cross-entropy plus the router's auxiliary loss) and ``loss_ce`` both map to ``loss`` by
    name; merged, they would be one series with two values per step. Of the names logged at most steps, the one
    that ranks first (:func:`_objective_rank`) stays ``loss``; each other such name logged beside it becomes the
    part ``loss/<its words>``, and a name logged at fewer steps (a per-epoch ``Train Loss`` beside ``Avg Loss``,
    :data:`SPARSE_SHARE`) keeps its raw name; why is in ``names``. Names in different files (a writer's and a
    log's spelling of the same loss) are left alone.
    """
    if metrics.select(pl.col("tag").filter(pl.col("metric") == "loss").n_unique()).item() < 2:
        return metrics  # one name (or none) read as loss: nothing to split (no copy of the loss rows)
    rows = metrics.filter(pl.col("metric") == "loss").select(
        pl.col("tag").cast(pl.String), pl.col("source").cast(pl.String), "segment", "step", "value")
    tags = rows.get_column("tag").unique().to_list()
    counts = dict(rows.group_by("tag").len().iter_rows())
    dense = [t for t in tags if counts[t] * SPARSE_SHARE >= max(counts.values())]
    keep = min(dense, key=lambda t: (_objective_rank(t), -counts[t], t))
    mine = rows.filter(pl.col("tag") == keep).select("source", "segment", "step", pl.col("value").alias("_v"))
    beside = (rows.filter(pl.col("tag") != keep).join(mine, on=["source", "segment", "step"])
              .filter(pl.col("value") != pl.col("_v")).get_column("tag").unique().sort().to_list())
    taken = set(metrics.get_column("metric").cast(pl.String).unique().to_list())
    for t in [t for t in beside if t not in dense]:  # an epoch or interval summary: kept under its raw name
        metrics = metrics.with_columns(pl.when((pl.col("metric") == "loss") & (pl.col("tag") == t))
                                       .then(pl.lit(t)).otherwise(pl.col("metric")).alias("metric"))
        names[t] = {"metric": t, "why": f"logged beside {keep!r} in the same file at {counts[t]} of its "
                                        f"{counts[keep]} steps: a summary (per epoch or interval), not the per-step "
                                        "objective; kept under its raw name"}
    for t in [t for t in beside if t in dense]:
        words = [w for w in re.split(r"[^0-9a-z]+", t.lower()) if w and w not in ("loss", "train", "training")]
        part = "loss/" + ("_".join(words) or re.sub(r"[^0-9A-Za-z]+", "_", t))
        if part in taken:
            part = "loss/" + re.sub(r"[^0-9A-Za-z]+", "_", t)
        taken.add(part)
        metrics = metrics.with_columns(pl.when((pl.col("metric") == "loss") & (pl.col("tag") == t))
                                       .then(pl.lit(part)).otherwise(pl.col("metric")).alias("metric"))
        names[t] = {"metric": part, "why": f"logged beside {keep!r} in the same file at the same steps with other "
                                           f"values: a part of the loss, not the objective ({keep!r} ranks first)"}
    return metrics


SPARSE_SHARE = 1.5
"""A name logged beside the objective at under 1/1.5 of the densest name's rows is a summary (our choice: a total
and its parts logged on one line have equal counts; PaddleViT's per-epoch ``Train Loss`` has half the rows of its
twice-per-epoch ``Avg Loss``, a per-epoch line among per-step lines far fewer)."""
_RANK_TOTAL, _RANK_PLAIN, _RANK_ALIAS, _RANK_RULE = range(4)


def _objective_rank(tag: str) -> int:
    """Rank of a raw name as the training objective, lower first.

    A name with the word ``total``, then plain ``loss`` (after a ``train/``-like prefix), then the alias table's
    other loss names, then names mapped by rule (fewer words first).
    """
    low = tag.strip().lower()
    words = [w for w in re.split(r"[^0-9a-z]+", low) if w]
    if "total" in words:
        return _RANK_TOTAL
    bare = low
    for prefix in _PREFIXES:
        bare = bare.removeprefix(prefix)
    if bare == "loss":
        return _RANK_PLAIN
    if _ALIASES.get(bare) == "loss":
        return _RANK_ALIAS
    return _RANK_RULE + len(words)


def _loss_parts(metrics: pl.DataFrame) -> tuple[pl.DataFrame, dict[str, Any]] | None:
    """(metrics with ``loss`` rows added, objective) from the loss's logged components, or None without any.

    The components (``loss/<part>``, or their ``/mean`` statistic) are summed per (source, segment, step) where
    every one was logged; when they never share a step, the most logged one is taken.
    """
    parts = metrics.filter(pl.col("metric").cast(pl.String).str.starts_with("loss/"))  # may be categorical
    if not parts.height:
        return None
    parts = parts.with_columns(pl.col("metric").cast(pl.String))
    plain = set(parts.get_column("metric").unique().to_list())
    parts = parts.with_columns(
        pl.when(pl.col("metric").str.ends_with("/mean")
                & ~pl.col("metric").str.replace(r"/mean$", "").is_in(list(plain)))
        .then(pl.col("metric").str.replace(r"/mean$", "")).otherwise(pl.col("metric")).alias("metric"))
    parts = parts.filter(~pl.col("metric").str.contains(_STAT))
    keep = [m for m, g in parts.group_by("metric") if not _constant_zero(g)]
    keep = sorted(k[0] if isinstance(k, tuple) else k for k in keep)
    zero = sorted(set(parts.get_column("metric").unique().to_list()) - set(keep))
    if not keep:
        return None
    sub = parts.filter(pl.col("metric").is_in(keep))
    agg = (sub.group_by(["run", "source", "segment", "step"], maintain_order=True)
           .agg(pl.col("value").sum(), pl.col("metric").n_unique().alias("n"), pl.col("wall_time").first())
           .filter(pl.col("n") == len(keep)))
    dense = (sub.select("metric", "source", "segment", "step").unique().group_by("metric").len()  # steps, not rows
             .sort(["len", "metric"], descending=[True, False]).row(0))
    shared = agg.height  # ``loss/train`` every step, ``loss/test`` rarely: no sum below PARTS_MIN_SHARE
    if shared >= PARTS_MIN_SHARE * dense[1]:
        tag = "sum(" + " + ".join(k.partition("/")[2] for k in keep) + ")"
        rows = agg.select(
            "run", pl.col("segment").cast(pl.Int32), pl.col("step").cast(pl.Int64),
            pl.lit("loss").alias("metric"), pl.col("value").cast(pl.Float64),
            pl.col("wall_time").cast(pl.Float64), pl.lit(tag).alias("tag"), "source")
        metrics = pl.concat([metrics, rows.select(metrics.columns)], how="vertical_relaxed")
        why = (f"no training loss was logged; its components {', '.join(keep)} summed at the {agg.height} steps "
               "where all were logged (the objective of detection and RLHF trainers is their sum)")
        if zero:
            why += f"; constant-zero component(s) left out: {', '.join(zero)}"
        return metrics, {"metric": "loss", "tags": [tag], "kind": "training (sum of components)", "why": why}
    top = dense[0]
    rows = sub.filter(pl.col("metric") == top).with_columns(pl.lit("loss").alias("metric"))
    metrics = pl.concat([metrics, rows.select(metrics.columns)], how="vertical_relaxed")
    together = (f"are all logged at only {shared} of the {dense[1]} steps of {top}, so their sum would drop most "
                "of the points" if shared else "are never logged at the same steps")
    why = f"no training loss was logged and its parts {', '.join(keep)} {together}; the most logged, {top}, is taken"
    return metrics, {"metric": "loss", "tags": sorted(set(rows.get_column("tag").to_list())),
                     "kind": "training (one component)", "why": why}


PARTS_MIN_SHARE = 0.5
"""The components' sum needs >= half the most logged one's steps (our choice; ``Loss/train`` + ``Loss/test``: 2 %)."""
_STAT = r"/(?:mean|num|std|min|max|count|sum)$"
_LOSS_FUNCTIONS = frozenset({"rmse", "mse", "mae", "logloss", "crossentropy", "cross_entropy", "bce", "nll",
                             "huber", "smoothl1", "l1", "l2", "mape", "multilogloss", "quantile"})
"""Names of loss functions that trainers log the objective under (CatBoost ``RMSE``, ``Logloss``, ...)."""
_EVAL_WORDS = re.compile(r"(?i)(?:^|[/_ .-])(?:val|valid|validation|eval|test|dev)(?:$|[/_ .-])")


def _promote(metrics: pl.DataFrame) -> tuple[str, str, str] | None:
    """A raw series to take as the objective when no loss was named, or ``None``.

    A per-epoch training loss first, else a loss function by name; ``(tag, kind, why)``. Eval-side names never
    qualify.
    """
    raw = metrics.filter(pl.col("metric") == pl.col("tag"))
    tags = raw.get_column("tag").unique(maintain_order=True).to_list() if raw.height else []
    tags = [t for t in tags if not _EVAL_WORDS.search(t)]
    for t in tags:
        low = t.lower()
        if "loss" in low and not _constant_zero(raw.filter(pl.col("tag") == t)):
            return t, "training (an aggregate: per epoch)", (
                f"no per-step training loss was logged; {t!r} is the training loss aggregated per epoch")
    for t in tags:
        if t.lower().replace(" ", "") in _LOSS_FUNCTIONS and not _constant_zero(raw.filter(pl.col("tag") == t)):
            return t, "training (a loss function by name)", (
                f"no series is named loss; {t!r} is a loss function's name and no eval word qualifies it")
    return None


COUNTERS = ("skipped_step", "nan_step")
"""Canonical names that mean a count per step; a writer may print them as a running total."""
COUNTER_MIN_ROWS = 3
"""Fewest rows of a per-step counter before it can be told a running total (our choice: it must rise at least once
after its first value)."""


PER_INTERVAL_TAGS = ("number of skipped iterations", "number of nan iterations")
"""Counters that a writer resets after every log line, so they are never running totals (a real trap: Megatron-LM's
``training_log`` prints the skipped and NaN iterations of the last ``--log-interval`` iterations and then zeroes
them; a constant 1 on every line is one skip per interval, not one skip in all)."""


def per_step_counters(metrics: pl.DataFrame, names: dict[str, Any]) -> pl.DataFrame:
    """A running total logged under a per-step counter's name becomes the per-step count, with why.

    A series is a running total when, within each (source, segment), its values are integers that never
    go down and rise at least once over at least 3 rows (DeepSpeed's ``skipped=K``, a script's
    ``skipped: 6``); its per-step value is the difference from the previous row (the first row keeps its
    value). Readers that already convert (``parsers.lines.deepspeed``) log per-step counts, which go down,
    so they are left alone, and so are the counters Megatron resets per log interval (:data:`PER_INTERVAL_TAGS`)
    and a series logged under the canonical per-step name itself (``skipped_step``: a reader's converted count,
    or a writer's 0/1 per step, which reads 1, 1, 1, ... when every step is skipped).
    """
    for name in COUNTERS:
        tag = pl.col("tag").cast(pl.Utf8).str.to_lowercase()
        named_per_step = tag.is_in(PER_INTERVAL_TAGS) | (tag == name)  # a reader's converted count, a 0/1 flag
        rows = metrics.filter(pl.col("metric") == name)  # the tags cast on this counter's rows only
        df, kept = rows.filter(~named_per_step), rows.filter(named_per_step)
        if df.height < COUNTER_MIN_ROWS:
            continue
        v = df.get_column("value")
        if v.null_count() or not bool((v == v.floor()).all()):
            continue
        g = df.with_row_index("_i").with_columns(
            pl.col("value").diff().over(["source", "segment"]).alias("_d"))
        d = g.get_column("_d").drop_nulls()
        if d.len() == 0 or bool((d < 0).any()) or not bool((d > 0).any()):
            continue
        per_step = g.with_columns(pl.col("_d").fill_null(pl.col("value")).alias("value")).drop("_i", "_d")
        metrics = pl.concat([metrics.filter(pl.col("metric") != name), kept, per_step.select(metrics.columns)],
                            how="vertical_relaxed")
        for t in sorted(set(df.get_column("tag").to_list())):
            names[t] = {"metric": name, "why": f"{t!r} is a running total (it never goes down): read as the "
                                                "per-step count, the difference from the previous row"}
    return metrics


def how_to_map(metrics: pl.DataFrame, limit: int = 12) -> str:
    """A sentence for an inconclusive verdict: what was found and how to name the objective."""
    found = sorted(set(metrics.get_column("tag").unique().to_list())) if metrics.height else []
    shown = ", ".join(found[:limit]) + (f" (+{len(found) - limit} more)" if len(found) > limit else "")
    example = next((t for t in found if "loss" in t.lower()), found[0] if found else "COLUMN")
    return (f"no training objective (a loss) was found among the series read: {shown or 'none'}; "
            f"if one of them is the objective, say so: forensics analyze RUN --metric loss={example} "
            f"(or aliases in a forensics.toml)")
