"""Where the resumes of a run are, and the rows of a metric split at them (for RS01, resume_state.py).

A resume is a new segment of the reader (a step that went back, a new process's file), or a wall-clock
restart inside one segment (``RESTART_GAP_S``). Rows carry a *virtual* segment (``VSEG``) so that RS01 compares
the processes on either side of each.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from forensics.model import RunData

RESTART_GAP_S = 60.0
RESTART_GAP_X = 30.0
"""A wall-clock gap between two logged points of one segment longer than 60 s and 30 x the segment's median
gap is a restart whose first logged step did not go back (a crash a few steps after a checkpoint, with a
log interval longer than that): the resumed process is judged as a resume (our choice of thresholds; a
job restart takes minutes, an eval pause of that length is judged too and passes when nothing changed)."""
VSEG = 1000
"""Virtual segment = segment x VSEG + restarts before the row inside its segment (the finding keeps the
reader's segment)."""


def raw_rows(run: RunData, metric: str) -> pl.DataFrame:
    """Rows of ``metric`` from the sources of the group its effective series comes from (all segments)."""
    s = run.series(metric)
    if s is None:
        return pl.DataFrame()
    raw = run.raw(metric).filter(pl.col("value").is_not_null())
    groups = run.meta.get("source_groups", {})
    group = groups.get(s.source)
    members = [p for p, g in groups.items() if g == group] if group else [s.source]
    return raw.filter(pl.col("source").is_in(members))


def restarts_of(run: RunData) -> list[tuple[int, int]]:
    """(segment, first step after the gap) of each wall-clock restart inside a segment of the loss."""
    loss = raw_rows(run, "loss")
    if loss.height < 10 or "wall_time" not in loss.columns:
        return []
    out = []
    for seg in sorted(set(loss.get_column("segment").to_list())):
        rows = loss.filter(pl.col("segment") == seg).sort("step")
        w = rows.get_column("wall_time").cast(pl.Float64).to_numpy()
        st = rows.get_column("step").to_numpy()
        ok = np.isfinite(w)
        w, st = w[ok], st[ok]
        d = np.diff(w)
        if d.size < 10 or not np.any(d > 0):
            continue
        thr = max(RESTART_GAP_S, RESTART_GAP_X * float(np.median(d[d > 0])))
        out += [(int(seg), int(st[k + 1])) for k in np.flatnonzero(d > thr)]
    return out


def rows(run: RunData, metric: str, restarts: list[tuple[int, int]] | None = None) -> pl.DataFrame:
    """Rows of ``metric`` from the source its effective series comes from (all segments), sorted by segment, step.

    ``segment`` is the virtual segment (``VSEG``): a wall-clock restart inside a segment starts a new one.
    """
    raw = raw_rows(run, metric)
    if raw.height == 0:
        return raw
    part = pl.lit(0, dtype=pl.Int64)
    for seg, st in restarts or []:
        part = part + ((pl.col("segment") == seg) & (pl.col("step") >= st)).cast(pl.Int64)
    raw = raw.with_columns((pl.col("segment").cast(pl.Int64) * VSEG + part).alias("segment"))
    return raw.sort(["segment", "step"], maintain_order=True)


def sigma_log(v: np.ndarray) -> float:
    """Robust point-to-point noise of log values (1.4826 MAD of first differences / sqrt 2)."""
    v = v[np.isfinite(v) & (v > 0)]
    if v.size < 6:
        return 0.05
    d = np.diff(np.log(v))
    return max(1.4826 * float(np.median(np.abs(d - np.median(d)))) / np.sqrt(2), 1e-3)
