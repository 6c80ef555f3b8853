"""Where the resumes of a run are, the rows of a metric split at them, and what a metric does across one (RS01).

A resume is a new segment of the reader (a step that went back, a new process's file), or a wall-clock
restart inside one segment (``RESTART_GAP_S``). Rows carry a *virtual* segment (``VSEG``) so that RS01
(``forensics/detectors/resume_state.py``) compares the processes on either side of each. How many points on
either side are read, and what makes a jump one that stays, are the fields of :class:`ResumeWindows`, which
RS01's detector inherits (``forensics detectors`` lists them; docs/detectors.md#rs01 gives their sources).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from forensics.model import RunData
from forensics.segment_index import SegmentIndex
from forensics.stats import MAD_TO_SIGMA

RESTART_GAP_S = 60.0
"""A wall-clock gap between two logged points of one segment longer than 60 s (and than ``RESTART_GAP_X`` x the
segment's median gap) is a restart whose first logged step did not go back (a crash a few steps after a
checkpoint, with a log interval longer than that): the resumed process is judged as a resume (our choice of
thresholds; a job restart takes minutes, an eval pause of that length is judged too and passes when nothing
changed)."""
RESTART_GAP_X = 30.0
"""The other half of the restart rule: the gap is also longer than 30 x the segment's median gap (see
``RESTART_GAP_S``; our choice)."""
RESTART_MIN_POINTS = 10
"""Loss rows of the run, and wall-clock gaps of one segment, needed before a restart is looked for: a median gap
of fewer is too noisy to scale the rule (our choice)."""
VSEG = 1000
"""Virtual segment = segment x VSEG + restarts before the row inside its segment (the finding keeps the
reader's segment)."""
NOISE_MIN_POINTS = 6
"""``sigma_log`` needs this many finite positive values (five differences) for a MAD (our choice)."""
NOISE_FALLBACK_LOG = 0.05
"""``sigma_log`` of a shorter series: 5% point-to-point noise, a typical per-step loss noise (our choice)."""
NOISE_FLOOR_LOG = 1e-3
"""Floor of ``sigma_log``: a perfectly smooth series still has 0.1% noise, so z stays finite (our choice)."""


@dataclass(frozen=True)
class ResumeWindows:
    """How many points on either side of a resume RS01 reads, and what makes a jump one that stays.

    Inherited by RS01 (:class:`forensics.detectors.resume_state.ResumeState`), so each is a field of that detector.
    All ours (docs/detectors.md#rs01): short windows because a resumed process is judged on its first points.

    Attributes:
        pre_points: the earlier process's last points before the resume that form its band.
        level_points: the last points before the resume whose median is its level.
        head_points: the first points after the resume that are compared with it (at least that many needed).
        min_points_before: points of the earlier process needed (loss, parameter norm, update ratio).
        min_jump_before: finite positive grad-norm or update-ratio points before the resume for a jump.
        min_metric_points: rows a metric needs in all for its jump to be judged.
        min_lr_points: points of the last ``level_points`` before the resume that also log an lr.
        fade_points: points after the resume over which a spike must fade (else it stays).
        min_factor: a jump stays when the median after the resume is this factor above the earlier level...
        min_tail_points: ...over at least this many points after the first ``head_points``...
        stays_k_sigma: ...with a spread of at most ``stays_k_sigma`` earlier sigmas...
        stays_spread: ...plus this (log units): a level, not a fading spike.
        jump_sigma_floor: floor of the earlier band's sigma (log units) for the jump's z.
    """

    pre_points: int = 30
    level_points: int = 5
    head_points: int = 3
    min_points_before: int = 6
    min_jump_before: int = 5
    min_metric_points: int = 8
    min_lr_points: int = 3
    fade_points: int = 20
    min_factor: float = 2.0
    min_tail_points: int = 5
    stays_k_sigma: float = 3.0
    stays_spread: float = 0.2
    jump_sigma_floor: float = 0.02


def raw_rows(run: RunData, metric: str, columns: tuple[str, ...] = ("segment", "step", "value")) -> pl.DataFrame:
    """Rows of ``metric`` from the sources of the group its effective series comes from (all segments, read order).

    Only ``columns`` are moved (a slice of the run's frame, no copy, when every row is kept).
    """
    s = run.series(metric)
    if s is None:
        return pl.DataFrame()
    groups = run.meta.get("source_groups", {})
    group = groups.get(s.source)
    members = [p for p, g in groups.items() if g == group] if group else [s.source]
    raw = run.raw(metric, list(dict.fromkeys(["source", "value", *columns])))
    keep = raw.get_column("value").is_not_null() & raw.get_column("source").is_in(members)
    if not keep.all():
        raw = raw.filter(keep)
    return raw.select(columns)


ORDER_SLICE = 1 << 20
"""Rows compared at a time by :func:`_in_order` (our choice: its temporaries stay a few MB)."""


def _in_order(seg: np.ndarray, st: np.ndarray) -> bool:
    """Whether rows are sorted by segment, then step (the stable sort would not move one)."""
    for a in range(0, max(seg.size - 1, 0), ORDER_SLICE):
        ds = np.diff(seg[a:a + ORDER_SLICE + 1])
        if not (bool(np.all(ds >= 0)) and bool(np.all((ds > 0) | (np.diff(st[a:a + ORDER_SLICE + 1]) >= 0)))):
            return False
    return True


def _sorted(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` sorted by segment, then step, rows of a tie in read order (no copy when already so)."""
    seg, st = frame.get_column("segment").to_numpy(), frame.get_column("step").to_numpy()
    return frame if _in_order(seg, st) else frame.sort(["segment", "step"], maintain_order=True)


def restarts_of(run: RunData) -> list[tuple[int, int]]:
    """(segment, first step after the gap) of each wall-clock restart inside a segment of the loss.

    One sort of the loss rows by (segment, step) at most, then each segment is a slice (:class:`SegmentIndex`).
    """
    loss = raw_rows(run, "loss", ("segment", "step", "value", "wall_time"))
    if loss.height < RESTART_MIN_POINTS or "wall_time" not in loss.columns:
        return []
    if loss.get_column("wall_time").null_count() == loss.height:
        return []  # no wall time logged: no gap to find
    loss = _sorted(loss.select("segment", "step", pl.col("wall_time").cast(pl.Float64)))
    idx = SegmentIndex(loss)
    wall = loss.get_column("wall_time").to_numpy()
    out = []
    for seg, a, b in zip(idx.ids.tolist(), idx.start.tolist(), idx.end.tolist(), strict=True):
        w, st = wall[a:b], idx.steps[a:b]
        ok = np.isfinite(w)
        w, st = w[ok], st[ok]
        d = np.diff(w)
        if d.size < RESTART_MIN_POINTS or not np.any(d > 0):
            continue
        thr = max(RESTART_GAP_S, RESTART_GAP_X * float(np.median(d[d > 0])))
        out += [(int(seg), int(st[k + 1])) for k in np.flatnonzero(d > thr)]
    return out


def rows(run: RunData, metric: str, restarts: list[tuple[int, int]] | None = None) -> pl.DataFrame:
    """Rows of ``metric`` from the source its effective series comes from (all segments), sorted by segment, step.

    Columns ``segment``, ``step``, ``value``. ``segment`` is the virtual segment (``VSEG``): a wall-clock restart
    inside a segment starts a new one (the restarts before a row are counted by binary search).
    """
    raw = raw_rows(run, metric)
    if raw.height == 0:
        return raw
    seg = raw.get_column("segment").to_numpy()
    st = raw.get_column("step").to_numpy()
    small = (run.n_segments + 1) * VSEG < np.iinfo(np.int32).max  # one type per run: frames join on it
    vseg = seg.astype(np.int32 if small else np.int64)  # in place from here
    vseg *= VSEG
    if restarts:
        base = min(int(st.min()), min(r[1] for r in restarts))
        keys = np.sort(np.array([g * LR_KEY_SPAN + (r - base) for g, r in restarts], dtype=np.int64))
        head = seg.astype(np.int64) * LR_KEY_SPAN
        vseg += (np.searchsorted(keys, head + (st - base), side="right")
                 - np.searchsorted(keys, head, side="left")).astype(vseg.dtype)
    del seg
    out = pl.DataFrame({"segment": vseg, "step": st, "value": raw.get_column("value").to_numpy()})
    return _sorted(out)


class ResumeRows:
    """The rows of :func:`rows` of each metric of one run, with their :class:`SegmentIndex`, built once.

    RS01 reads a few metrics at every resume; a run with a thousand resumes builds each metric's rows once.
    """

    def __init__(self, run: RunData, restarts: list[tuple[int, int]]) -> None:
        """Rows of ``run`` split at its segments and at ``restarts`` (:func:`restarts_of`)."""
        self.run, self.restarts = run, restarts
        self._memo: dict[str, tuple[pl.DataFrame, SegmentIndex]] = {}

    def get(self, metric: str) -> tuple[pl.DataFrame, SegmentIndex]:
        """(rows of ``metric`` sorted by virtual segment and step, their index)."""
        if metric not in self._memo:
            r = rows(self.run, metric, self.restarts)
            self._memo[metric] = (r, SegmentIndex(r))
        return self._memo[metric]

    def drop(self, metric: str) -> None:
        """Forget ``metric``'s rows (memory; they are built again if asked for)."""
        self._memo.pop(metric, None)


def sigma_log(v: np.ndarray) -> float:
    """Robust point-to-point noise of log values (``MAD_TO_SIGMA`` x MAD of first differences / sqrt 2).

    Args:
        v: values, shape (n,); non-finite and non-positive values are dropped.

    Returns:
        The noise in log units: ``NOISE_FALLBACK_LOG`` for fewer than ``NOISE_MIN_POINTS`` values, at least
        ``NOISE_FLOOR_LOG``.
    """
    v = v[np.isfinite(v) & (v > 0)]
    if v.size < NOISE_MIN_POINTS:
        return NOISE_FALLBACK_LOG
    d = np.diff(np.log(v))
    return max(MAD_TO_SIGMA * float(np.median(np.abs(d - np.median(d)))) / np.sqrt(2), NOISE_FLOOR_LOG)


def metric_jump(rr: ResumeRows, metric: str, s0: int, seg: int, w: ResumeWindows) -> dict[str, float | bool] | None:
    """How a positive metric (grad norm, update ratio) moves at the resume at step ``s0`` into segment ``seg``.

    The earlier band is the last ``w.pre_points`` finite positive values before ``s0``: its log median and
    ``MAD_TO_SIGMA`` x MAD (at least ``w.jump_sigma_floor``). ``z`` is the largest of the first ``w.head_points``
    values after the resume in band sigmas; the jump *stays* when the points after those sit ``w.min_factor`` or
    more above the band with little spread (the fields of :class:`ResumeWindows`). ``rr``: the run's rows.

    Returns:
        ``{"z", "factor", "stays"}`` (``factor``: the head's peak over the band, or the level over
        ``w.fade_points`` points when it stays), or None when too few points are logged.
    """
    r, idx = rr.get(metric)
    if r.height < w.min_metric_points:
        return None
    v = r.get_column("value").to_numpy()
    good = np.isfinite(v) & (v > 0)
    pre = v[idx.before(idx.position(seg), s0, w.pre_points, good)]
    a, b = idx.rows(seg)
    post = v[a:b]
    post = post[np.isfinite(post) & (post > 0)]
    if pre.size < w.min_jump_before or post.size < w.head_points:
        return None
    lp = np.log(pre)
    med = float(np.median(lp))
    sig = max(MAD_TO_SIGMA * float(np.median(np.abs(lp - med))), w.jump_sigma_floor)
    head = np.log(post[:w.head_points])
    z = float((head.max() - med) / sig)
    tail = post[w.head_points:w.head_points + w.fade_points]
    level = float(np.median(np.log(post[: min(post.size, w.fade_points)])))
    factor = float(np.exp(level - med))
    stays = bool(tail.size >= w.min_tail_points and np.median(np.log(tail)) - med >= np.log(w.min_factor)
                 and float(np.std(np.log(tail))) <= w.stays_k_sigma * sig + w.stays_spread)
    return {"z": round(z, 2), "factor": round(float(np.exp(head.max() - med)) if not stays else factor, 3),
            "stays": stays}


def update_scale_jump(rr: ResumeRows, s0: int, seg: int, w: ResumeWindows) -> dict[str, float | bool] | None:
    """The update ratio's jump at the resume: log ratio to the earlier process, in its noise sigmas.

    At re-logged steps (the same steps, the same lr) the values are compared directly (the largest log ratio
    of the first ``w.head_points``, when their median is at least half of it); without them the first
    ``w.head_points`` points after the resume are compared with the last ``w.level_points`` before it, each
    divided by its lr (the rows of :func:`rows` for ``"lr"``). ``rr``: the run's rows.

    Returns:
        ``{"factor", "z", "relogged", "noise_log"}``, or None when too few points are logged.
    """
    r, idx = rr.get("update_ratio")
    if r.height < w.min_metric_points:
        return None
    k = idx.position(seg)
    lo, hi = idx.rows(seg)
    cur = r.slice(lo, hi - lo)
    pre = r[idx.before(k, s0, w.pre_points)]
    pv = pre.get_column("value").to_numpy().astype(float)[-w.pre_points:]
    if np.sum(np.isfinite(pv) & (pv > 0)) < w.min_points_before or cur.height < 2:
        return None
    sig = sigma_log(pv)
    ov = r[idx.from_step(k, s0)].join(cur.select("step", pl.col("value").alias("new")), on="step")
    d = np.array([])
    if ov.height:
        with np.errstate(divide="ignore", invalid="ignore"):
            d = np.log(ov.get_column("new").to_numpy() / ov.get_column("value").to_numpy())
    d = d[np.isfinite(d)][:w.head_points]
    relogged = d.size >= 1
    if relogged:  # fresh moments move most at the first step: the largest of the first points, if they agree
        level = float(np.max(d)) if float(np.median(d)) >= 0.5 * float(np.max(d)) else float(np.median(d))
    else:
        lr = rr.get("lr")[0]
        if lr.height == 0:
            return None
        lrs = lr.select("segment", "step", pl.col("value").alias("lr"))
        a = pre.tail(w.level_points).join(lrs, on=["segment", "step"])
        b = cur.head(w.head_points).join(lrs, on=["segment", "step"])
        if a.height < w.min_lr_points or b.height < 2:
            return None
        na = (a.get_column("value") / a.get_column("lr")).to_numpy()
        nb = (b.get_column("value") / b.get_column("lr")).to_numpy()
        if not (np.all(na > 0) and np.all(nb > 0)):
            return None
        level = float(np.median(np.log(nb)) - np.median(np.log(na)))
    return {"factor": round(float(np.exp(level)), 3), "z": round(level / sig, 1), "relogged": relogged,
            "noise_log": round(sig, 4)}


LR_KEY_SPAN = 2**40
"""Steps (from the first) are below this: a row's key is ``segment x LR_KEY_SPAN + step`` (int64, no overflow up
to 8M virtual segments)."""


class LrIndex:
    """The lr rows of :func:`rows` (sorted by virtual segment, step) for RS01's per-resume lookups.

    One build per run; each lookup is a binary search, so a run with thousands of resumes costs segments x
    log(rows) rather than a filter and a sort of every earlier row per resume.
    """

    def __init__(self, lr: pl.DataFrame) -> None:
        """Index ``lr`` (columns ``segment``, ``step``, ``value``; empty allowed)."""
        seg = lr.get_column("segment").to_numpy() if lr.height else np.zeros(0, np.int64)
        st = lr.get_column("step").to_numpy() if lr.height else np.zeros(0, np.int64)
        self.base = int(st.min()) if st.size else 0
        self.segments = np.unique(seg).astype(np.int64)
        key = seg.astype(np.int64)  # in place from here: one array of the rows' size
        key *= LR_KEY_SPAN
        key += st
        key -= self.base
        del seg, st
        values = np.asarray(lr.get_column("value").to_numpy() if lr.height else np.zeros(0), dtype=np.float64)
        if bool(np.all(key[1:] >= key[:-1])):  # sorted by rows(): no copy
            self.key, self.values = key, values
        else:
            order = np.argsort(key, kind="stable")  # stable keeps read order of ties
            self.key, self.values = key[order], values[order]

    def first(self, seg: int) -> tuple[int, float] | None:
        """(step, lr) of the first row of virtual segment ``seg``, or None when it logged no lr."""
        i = int(np.searchsorted(self.key, seg * LR_KEY_SPAN, side="left"))
        if i >= self.key.size or self.key[i] // LR_KEY_SPAN != seg:
            return None
        return int(self.key[i] % LR_KEY_SPAN) + self.base, float(self.values[i])

    def before(self, seg: int, step: int) -> tuple[float, bool] | None:
        """The lr the earlier segments logged at ``step`` (exact: True), else their last lr before it (False).

        Among earlier segments that logged the step, the latest wins; else the largest earlier step, the latest
        segment on a tie. None when no earlier segment logged an lr at or before ``step``.
        """
        ks = self.segments[self.segments < seg]
        if ks.size == 0:
            return None
        q = ks * LR_KEY_SPAN + (step - self.base)
        j = np.searchsorted(self.key, q, side="right") - 1
        same = (j >= 0) & (self.key[np.maximum(j, 0)] == q)
        if same.any():
            return float(self.values[j[np.flatnonzero(same)[-1]]]), True
        j = np.searchsorted(self.key, q, side="left") - 1
        ok = (j >= 0) & (self.key[np.maximum(j, 0)] // LR_KEY_SPAN == ks)
        if not ok.any():
            return None
        cand = j[ok]
        steps = self.key[cand] % LR_KEY_SPAN
        best = np.flatnonzero(steps == steps.max())[-1]
        return float(self.values[cand[best]]), False
