"""Per-rank metric files of one run (``metrics_rank0.jsonl``, ``metrics_rank1.jsonl``, ...) are ranks, not restarts.

A distributed job often has each rank write its own file. Files of one folder and format that differ
only by a rank token in the name (``rank3``, ``rank_3``, ``local_rank-3``), or whose records carry a
``rank``/``local_rank`` key with one value per file, and whose steps overlap, are *one run*: they get
one group key (:data:`RANKS`) and never start a segment (:func:`parsers.segments.offsets_of`).

Their rows follow the text reader's representation of interleaved rank-prefixed lines
(:mod:`parsers._textlog_asm`): a value several ranks log at one step is kept once, the lowest
rank's (a departing rank's first); a step only another rank logged is kept; the ``rank`` key
itself is no metric. Each file's meta gets ``ranks``: its rank, the rank files and why. A rank
whose loss (or grad norm) ends far from the other ranks' (:data:`DEPART_RATIO`) is named in the
meta and in the skipped list, and its values are the run's series (the one a post-mortem needs),
the others' at the same steps being left out. Every rank's own values of the series compared across ranks
(:data:`COMPARED`) are kept beside the rows, in :attr:`forensics.model.ParseResult.ranks`
(:data:`RANK_SCHEMA`; :func:`own_values`), for RK01 (``forensics/detectors/rank_departure.py``); the text
reader keeps those of interleaved rank-prefixed lines the same way (:func:`values_table`).
"""

from __future__ import annotations

import re
from array import array
from dataclasses import replace
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from forensics.model import ParseResult, Skip

__all__ = ["COMPARED", "DEPART_RATIO", "RANK_KEYS", "RANKS", "RANK_SCHEMA", "RankValues", "merge", "own_values",
           "values_table"]

RANKS = "ranks:"
"""Group-key prefix of the per-rank files of one run (all in one segment)."""
RANK_KEYS = ("rank", "local_rank", "global_rank")
"""Record keys that name the writing rank (one value per file)."""
DEPART_RATIO = 2.0
"""A rank departs when its loss or grad norm over its last :data:`TAIL_SHARE` of steps is this many times
the median of the ranks' (or below its inverse); ranks of one data-parallel job see the same weights, so
their losses stay close (our choice, well above the shard-to-shard noise of a healthy run)."""
TAIL_SHARE = 0.1
"""Share of a rank's last steps compared with the other ranks (our choice)."""
COMPARED = ("loss", "grad_norm")
"""Canonical metrics whose per-rank values are kept for the comparison of ranks (the objective and the grad norm:
the series one bad rank shows in; docs/detectors.md#rk01)."""
RANK_SCHEMA = pa.schema([("rank", pa.int32()), ("segment", pa.int32()), ("step", pa.int64()),
                         ("metric", pa.string()), ("value", pa.float64())])
"""Columns of each rank's own values (``segment`` local to the file, as in the metrics table)."""
_NAME_TOKEN = re.compile(r"(?i)(?<![a-z])((?:local_|global_)?rank)[_-]?(\d+)")
_WHY = ("per-rank files of one run: a value several ranks log at one step is kept once (the lowest rank's), "
        "a rank's step never reads as a restart of another's")

_OWN_GROUPS = frozenset({"tensorboard", "wandb", "mlflow"})
"""Formats whose files :func:`parsers.segments.groups_of` groups by their own rules (chains in time, run ids)."""

Item = tuple[str, ParseResult, dict]


def _name_rank(rel: str) -> tuple[str, int] | None:
    """(the path with its rank token blanked, the rank) of a file named for its rank, else None."""
    folder, _, name = rel.rpartition("/")
    found = list(_NAME_TOKEN.finditer(name))
    if len(found) != 1:
        return None
    m = found[0]
    return f"{folder}/{name[:m.start(2)]}*{name[m.end(2):]}", int(m.group(2))


def _key_rank(pr: ParseResult) -> int | None:
    """The one value of a rank key in the file's rows, else None."""
    t = pr.metrics
    tag = t.column("tag")
    if pa.types.is_dictionary(tag.type):
        tag = tag.cast(pa.string())
    v = t.column("value").filter(pc.is_in(tag, pa.array(RANK_KEYS, pa.string())))
    vals = pc.unique(v.drop_null()).to_pylist() if len(v) else []
    return int(vals[0]) if len(vals) == 1 and float(vals[0]).is_integer() else None


def _rank_sets(items: list[Item]) -> dict[str, list[tuple[int, int]]]:
    """Group key -> (rank, item index) of each set of rank files (two or more, distinct ranks)."""
    by_name: dict[str, list[tuple[int, int]]] = {}
    by_folder: dict[str, list[int]] = {}
    for i, (rel, pr, b) in enumerate(items):
        if not b.get("rows") or pr.format in _OWN_GROUPS:
            continue
        hit = _name_rank(rel)
        if hit is not None:
            by_name.setdefault(f"{RANKS}{pr.format}:{hit[0]}", []).append((hit[1], i))
        else:
            by_folder.setdefault(f"{RANKS}{pr.format}:{rel.rpartition('/')[0]}/*", []).append(i)
    for key, idx in by_folder.items():
        if len(idx) > 1:
            ranks = [(_key_rank(items[i][1]), i) for i in idx]
            by_name[key] = [(r, i) for r, i in ranks if r is not None]
    return {k: sorted(v) for k, v in by_name.items()
            if len(v) > 1 and len({r for r, _ in v}) == len(v) and _overlap([items[i][2] for _, i in v])}


def _overlap(bounds: list[dict]) -> bool:
    """True when the files' step ranges overlap (concurrent writers, not one file after another)."""
    lo = max(b["first_step"] for b in bounds if b.get("first_step") is not None)
    hi = min(b["last_step"] for b in bounds if b.get("last_step") is not None)
    return lo <= hi


def merge(items: list[Item], bounds_of: Any) -> tuple[list[Item], dict[str, str], list[Skip]]:
    """Rank files made one run: ``(items, rel -> group key of rank files, skips naming a departing rank)``.

    ``bounds_of``: :func:`parsers.segments.bounds` (recomputed for a file whose rows were thinned).
    """
    sets = _rank_sets(items)
    groups: dict[str, str] = {}
    skips: list[Skip] = []
    for key, members in sets.items():
        files = [items[i][0] for _, i in members]
        departs = _departing({rank: _tails(items[i][1].metrics) for rank, i in members})
        seen: pl.DataFrame | None = None
        for rank, i in sorted(members, key=lambda m: (m[0] not in departs, m[0])):  # a departing rank first
            rel, pr, _ = items[i]
            own = own_values(pr.metrics, rank)
            t, seen = _unseen(pr.metrics, seen)
            info = {"rank": rank, "files": files, "why": _WHY}
            if rank in departs:
                info["departs"] = departs[rank]
            pr = replace(pr, metrics=t, meta={**pr.meta, "ranks": info}, ranks=own)
            items[i] = (rel, pr, bounds_of(pr))
            groups[rel] = key
        if departs:
            bad = ", ".join(f"rank {r} ({what})" for r, what in sorted(departs.items()))
            others = ", ".join(str(r) for r, _ in members if r not in departs)
            skips.append(Skip(key.partition(":")[2].partition(":")[2],
                              f"ranks {others} agree with each other, and {bad} departs from them: its values are "
                              "the run's series, the others' at the same steps are not read; one bad rank (its "
                              "device or data shard) is likely"))
    return items, groups, skips


def _unseen(t: pa.Table, seen: pl.DataFrame | None) -> tuple[pa.Table, pl.DataFrame]:
    """``t`` less its rank-key rows and the (step, tag) pairs a lower rank logged; the pairs seen so far."""
    tag = t.column("tag")
    if pa.types.is_dictionary(tag.type):
        tag = tag.cast(pa.string())
    df = pl.DataFrame({"step": t.column("step").to_numpy(), "tag": pl.from_arrow(tag)}).with_row_index("i")
    keep = ~df.get_column("tag").is_in(list(RANK_KEYS)).to_numpy()
    if seen is not None:
        dup = df.join(seen, on=["step", "tag"], how="semi").get_column("i").to_numpy()
        keep[dup] = False
    pairs = df.select("step", "tag").unique()
    seen = pairs if seen is None else pl.concat([seen, pairs]).unique()
    return (t if keep.all() else t.filter(pa.array(keep))), seen


def _tails(t: pa.Table) -> dict[str, float]:
    """Median loss and grad norm over the last :data:`TAIL_SHARE` of a rank's steps."""
    df = pl.from_arrow(t.select(["step", "metric", "value"]))
    out = {}
    for name in ("loss", "grad_norm"):
        s = df.filter(pl.col("metric") == name).sort("step").get_column("value").drop_nulls()
        if len(s) >= 1 / TAIL_SHARE:
            out[name] = float(s.tail(max(1, int(len(s) * TAIL_SHARE))).median())
    return out


def _departing(tails: dict[int, dict[str, float]]) -> dict[int, str]:
    """Rank -> how it departs, for a minority of ranks whose tail is :data:`DEPART_RATIO` from the median."""
    out: dict[int, str] = {}
    for name in ("loss", "grad_norm"):
        vals = {r: v[name] for r, v in tails.items() if name in v and np.isfinite(v[name]) and v[name] > 0}
        if len(vals) < 3:
            continue
        med = float(np.median(list(vals.values())))
        far = {r: v for r, v in vals.items() if v > med * DEPART_RATIO or v < med / DEPART_RATIO}
        if 0 < len(far) < len(vals) / 2:
            for r, v in far.items():
                out.setdefault(r, f"{name} {v:.4g} at its end vs the ranks' median {med:.4g}")
    return out


def own_values(t: pa.Table, rank: int) -> pa.Table:
    """One rank's rows of the :data:`COMPARED` metrics of its metrics table ``t``, as :data:`RANK_SCHEMA`."""
    metric = t.column("metric")
    if pa.types.is_dictionary(metric.type):
        metric = metric.cast(pa.string())
    mask = pc.is_in(metric, pa.array(COMPARED, pa.string()))
    sub = t.select(["segment", "step", "value"]).append_column("metric", metric).filter(mask)
    return pa.table({"rank": pa.array(np.full(sub.num_rows, rank, np.int32)),
                     "segment": sub.column("segment").cast(pa.int32()), "step": sub.column("step").cast(pa.int64()),
                     "metric": sub.column("metric"), "value": sub.column("value").cast(pa.float64())},
                    schema=RANK_SCHEMA)


class RankValues:
    """Each rank's own values of the :data:`COMPARED` metrics, as the text reader meets them.

    Compact arrays: 25 bytes a value, not a Python tuple's ~100.
    """

    def __init__(self) -> None:
        self.rank, self.segment, self.metric = array("i"), array("i"), array("b")
        self.step, self.value = array("q"), array("d")

    def add(self, rank: int, segment: int, step: int, metrics: list) -> None:
        """The compared ``(metric, tag, value)`` items of one rank's line at ``step``."""
        for m in metrics:
            if m[0] in _CODE and m[2] is not None:
                self.rank.append(rank)
                self.segment.append(segment)
                self.step.append(step)
                self.metric.append(_CODE[m[0]])
                self.value.append(float(m[2]))


_CODE = {name: i for i, name in enumerate(COMPARED)}


def values_table(rows: RankValues) -> pa.Table | None:
    """The values of two or more ranks as :data:`RANK_SCHEMA`; None for fewer."""
    rank = np.frombuffer(rows.rank, np.int32) if len(rows.rank) else np.zeros(0, np.int32)
    if rank.size == 0 or np.unique(rank).size < 2:
        return None
    names = np.array(COMPARED, dtype=object)[np.frombuffer(rows.metric, np.int8)]
    return pa.table({"rank": pa.array(rank), "segment": pa.array(np.frombuffer(rows.segment, np.int32)),
                     "step": pa.array(np.frombuffer(rows.step, np.int64)), "metric": pa.array(names, pa.string()),
                     "value": pa.array(np.frombuffer(rows.value, np.float64))}, schema=RANK_SCHEMA)
