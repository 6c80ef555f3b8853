"""The lr rows LR01 reads (lr.schedule_reset, docs/detectors.md#lr01), and the run folder's override flags.

The rows of the best source, by segment; the flags that make an lr change deliberate. Whole columns: one
partition of the rows per run, a sort only where a segment's steps do not already rise.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from forensics.model import RunData

OVERRIDE_KEYS = ("override_lr_scheduler", "override_opt_param_scheduler", "override-lr-scheduler")
"""Megatron's switches that replace the checkpoint's scheduler state with the command line's
(docs/detectors.md#lr01)."""
WALK_ITEMS = 50
"""Items of each list in the run's metadata searched for an override flag (ours: flags sit near the top)."""


def lr_rows(run: RunData) -> pl.DataFrame:
    """Lr rows of the best source (the source group of the effective ``lr`` series), all segments, read order.

    Columns ``segment``, ``step``, ``value`` (slices of the run's frame, no copy, when every row is kept);
    empty when the run logs no lr.
    """
    s = run.series("lr")
    if s is None:
        return pl.DataFrame()
    groups = run.meta.get("source_groups", {})
    group = groups.get(s.source)
    members = [p for p, g in groups.items() if g == group] if group else [s.source]
    raw = run.raw("lr", ["source", "segment", "step", "value"])
    keep = raw.get_column("source").is_in(members) & raw.get_column("value").is_not_null()
    return (raw if keep.all() else raw.filter(keep)).select("segment", "step", "value")


def intentional_override(run: RunData) -> str | None:
    """Evidence in the run folder that an lr change was deliberate (``"key=value"`` of a set override flag), or None.

    Megatron's ``--override-opt_param-scheduler`` / ``--override-lr-scheduler`` (docs/detectors.md#lr01), found
    anywhere in the run's metadata and set to true.
    """
    blob = repr(run.meta).lower()
    for key in OVERRIDE_KEYS:
        if key in blob:
            # only counts when set to true
            for k, v in _walk(run.meta):
                if key in k.lower().replace("-", "_").replace(" ", "_") and str(v).lower() in ("true", "1"):
                    return f"{k}={v}"
    return None


def _walk(obj: object, prefix: str = ""):  # noqa: ANN202 - a generator of (dotted key, value)
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk(v, f"{prefix}{k}.")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj[:WALK_ITEMS]):
            yield from _walk(v, f"{prefix}{i}.")
    else:
        yield prefix.rstrip("."), obj


def pairs_repeat(rows: pl.DataFrame) -> bool:
    """Whether a (segment, step) pair of ``rows`` may occur twice (False is certain; True means "look").

    It may when a step does not rise within a run of rows of one segment, or a segment has two runs of rows.
    """
    seg = rows.get_column("segment").to_numpy()
    st = rows.get_column("step").to_numpy()
    same = seg[1:] == seg[:-1]
    if bool(np.any(same & (st[1:] <= st[:-1]))):
        return True
    heads = seg[np.r_[True, ~same]]
    return bool(np.unique(heads).size != heads.size)


def by_segment(rows: pl.DataFrame) -> dict[int, pl.DataFrame]:
    """Rows of each segment sorted by step, segments in increasing order; one pass over the rows.

    A segment whose steps already rise strictly is kept as it is (the sort would not move a row).
    """
    seg = rows.get_column("segment").to_numpy()
    heads = np.flatnonzero(np.r_[True, seg[1:] != seg[:-1]])
    if np.unique(seg[heads]).size == heads.size:  # each segment one run of rows: slices, no copy
        ends = np.r_[heads[1:], seg.size]
        parts = {int(seg[a]): rows.slice(int(a), int(b - a)) for a, b in zip(heads, ends, strict=True)}
    else:
        parts = {g: df for (g,), df in rows.partition_by("segment", as_dict=True).items()}
    segs = sorted(parts)
    out = {}
    for g in segs:
        df = parts[g]
        d = np.diff(df.get_column("step").to_numpy())
        out[g] = df if bool(np.all(d > 0)) else df.sort("step")
    return out
