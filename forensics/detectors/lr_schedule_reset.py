"""LR01 lr.schedule_reset: the learning rate departs from the schedule the run was following.

Rule (docs/detectors.md#lr01; yolov5 #292, HF transformers #27749, Lightning #10766): at every
resume (a new segment, or a ``checkpoint_loaded`` event) compare the first logged lr with the
lr the earlier segment logged at the same step (runs re-log the steps between the checkpoint
and the crash) or, failing that, the earlier segment's schedule extrapolated from its last
points; a relative difference above ``rel_tol`` (5%) is a discontinuity. Anywhere else, an
upward jump of more than ``rel_tol`` after the peak has passed is one too (the peak: where the running
maximum was first reached, so a constant lr raised mid-run counts; such a jump that matches no earlier lr
has no mechanism, since no resume set it). Mechanisms:

- ``reset_to_initial``: the new lr equals the run's initial lr or restarts a warm-up;
- ``offset``: the new lr equals the old schedule's lr a fixed number of steps away;
- ``horizon_change``: the lr continues from the same value but decays at another rate;
- ``intentional_change``: the run folder shows a deliberate override (e.g. Megatron
  ``--override-opt_param-scheduler``/``--override-lr-scheduler`` set, a changed ``--lr`` in the
  launch arguments); reported with low confidence, not as a fault.

Other thresholds (ours, tuned on sample_logs and the labelled corpus): two schedules under one name when at
least ``two_schedules_share`` (50%) of (segment, step) pairs carry distinct values; a decay-rate change when
the slopes differ by more than ``slope_tol`` (25%); the same linear decay shifted when they agree within
``same_slope_tol`` (10%); an lr "equal" to an earlier one within ``match_tol`` (0.5%). The shapes compared
with are in :mod:`forensics.lr_shapes`.

Source: docs/detectors.md#lr01 (the thresholds, where each comes from, the published reports).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from forensics.counter_reset import counter_not_restored
from forensics.detectors.base import Detector, fmt
from forensics.lr_rows import by_segment, intentional_override, lr_rows, pairs_repeat
from forensics.lr_shapes import constant_scale, extrapolate, horizons, replays
from forensics.model import Cause, Finding, Mechanism, RunData, Severity

MIN_POINTS = 3
"""Logged lr points a schedule needs before it can be compared with (ours: two points make any line)."""
MAX_FINDINGS = 3
"""Discontinuities reported per run, the first ones (ours: later ones repeat the first)."""
MAX_JUDGED = 6
"""Findings at which the search for jumps inside a process stops (ours: twice :data:`MAX_FINDINGS`, room for
the cyclic test, which needs two rises in one process)."""
TAIL_POINTS = 4
"""Last points of the earlier segment that give its slope and its rising warm-up (ours)."""
HEAD_POINTS = 8
"""First points of the resumed segment that give its slope (ours)."""
REWARM_POINTS = 6
"""First points after a resume that must all rise for a warm-up restart (ours)."""
REWARM_AHEAD = 3
"""A re-warm-up inside a process is judged on the pair and the two points after it: index ``i + 2`` (ours)."""
SMOOTH_WINDOW = 9
"""Points before a candidate jump whose step-to-step log change is its schedule's own (ours: 8 changes)."""
SMOOTH_MIN_CHANGES = 4
"""Fewest step-to-step changes in that window for a median (ours)."""
LR_FLOOR = 1e-30
"""Smallest lr used as a divisor or under a log (ours: far below any lr; an lr of 0 stays comparable)."""


@dataclass(frozen=True)
class LRScheduleReset(Detector):
    """Learning-rate discontinuities at resumes (and upward jumps after the peak)."""

    code = "LR01"
    name = "lr.schedule_reset"
    requires = ("lr",)
    rel_tol: float = 0.05
    two_schedules_share: float = 0.5
    cyclic_confidence: float = 0.15
    scaled_confidence: float = 0.25
    slope_tol: float = 0.25
    same_slope_tol: float = 0.1
    match_tol: float = 0.005
    rewarm_window_steps: int = 10_000
    jump_noise_factor: float = 3.0
    reset_confidence: float = 0.85
    horizon_confidence: float = 0.75
    slope_change_confidence: float = 0.7
    offset_confidence: float = 0.7
    other_confidence: float = 0.6
    override_confidence: float = 0.2

    def detect(self, run: RunData) -> list[Finding]:
        """At most one finding per discontinuity (the first three)."""
        rows = lr_rows(run)
        if rows.height < MIN_POINTS:
            return []
        # two schedules under one name (e.g. actor and critic lrs of an RLHF log): distinct values at the same
        # step in the same segment; comparing one with the other is not a discontinuity
        if self._two_schedules(rows):
            return []
        out, checked_steps, lr_initial = self._at_resumes(run, rows)
        # upward jumps after the peak within the effective timeline (resume without a visible rewind)
        within = self._jumps_within(run, out, checked_steps, lr_initial)
        return self._cyclic(out, within)[:MAX_FINDINGS]

    def _two_schedules(self, rows: pl.DataFrame) -> bool:
        """At least ``two_schedules_share`` of the (segment, step) pairs carry distinct lr values.

        A log whose steps rise within each segment (and each segment is one run of rows) has no pair twice, so
        no distinct values at a pair: the group-by is needed only otherwise.
        """
        if self.two_schedules_share > 0 and not pairs_repeat(rows):
            return False
        per = rows.group_by("segment", "step").agg(pl.col("value").n_unique().alias("k"))
        return bool(per.height) and float((per.get_column("k") > 1).mean()) >= self.two_schedules_share

    def _at_resumes(self, run: RunData, rows: pl.DataFrame) -> tuple[list[Finding], set[int], float]:
        """Findings at each resume (a new segment), the resume steps judged, and the run's initial lr."""
        out: list[Finding] = []
        by_seg = by_segment(rows)
        segs = list(by_seg)
        all_first = by_seg[segs[0]].get_column("value").to_numpy()
        lr_initial = float(all_first[0])
        lr_peak_before: float = float(np.nanmax(all_first))
        checked_steps: set[int] = set()
        first_seg = by_seg[segs[0]]
        for a, b in zip(segs, segs[1:], strict=False):
            prev, cur = by_seg[a], by_seg[b]
            if cur.height == 0 or prev.height == 0:
                continue
            s0 = int(cur.get_column("step")[0])
            obs = float(cur.get_column("value")[0])
            if (lost := counter_not_restored(run, first_seg, prev, cur)) is not None:  # global_step not restored
                checked_steps.add(s0)
                out.append(self._finding(run, s0, b, Mechanism.RESET_TO_INITIAL, self.reset_confidence, *lost))
                continue
            same = prev.filter(pl.col("step") == s0)
            if same.height:
                exp = float(same.get_column("value")[-1])
                how = "the earlier segment logged"
            else:
                exp = extrapolate(prev, s0)
                how = "extrapolated from the earlier segment"
                pv_last = prev.get_column("value").to_numpy()[-TAIL_POINTS:].astype(float)
                if pv_last.size >= MIN_POINTS and bool(np.all(np.diff(pv_last) > 0)) and obs >= pv_last[-1]:
                    continue  # a warm-up that goes on rising across the boundary (a reset goes back down)
            checked_steps.add(s0)
            f = self._judge(run, cur, prev, s0, obs, exp, how, lr_initial, max(lr_peak_before, 0.0), b,
                            replay=replays(first_seg, cur))
            if f:
                out.append(f)
            lr_peak_before = max(lr_peak_before, float(np.nanmax(cur.get_column("value").to_numpy())))
        return out, checked_steps, lr_initial

    def _cyclic(self, out: list[Finding], within: list[Finding]) -> list[Finding]:
        """``out`` with rises that recur inside one process replaced by one ``intentional_change`` finding.

        Such rises are the schedule's own cycles (cyclic lr, warm restarts), not a lost scheduler state: a
        reset happens once, at a resume.
        """
        by_seg_within: dict[int, list[Finding]] = {}
        for f in within:
            by_seg_within.setdefault(int(f.segment or 0), []).append(f)
        cyclic = {id(f) for fs in by_seg_within.values() if len(fs) >= 2 for f in fs}
        if not cyclic:
            return out
        first = next(f for f in within if id(f) in cyclic)
        n = len(cyclic)
        out = [f for f in out if id(f) not in cyclic]
        out.append(self.finding(
            cause=Cause.LR_SCHEDULE_RESET, mechanism=Mechanism.INTENTIONAL_CHANGE, step=first.step,
            segment=first.segment, confidence=self.cyclic_confidence, severity=Severity.INFO,
            message=f"the lr rises again {n} times inside one process (first at step {first.step}): a cyclic "
            "schedule or warm restarts, not a lost scheduler state.",
            evidence={"rises": [f.step for f in within if id(f) in cyclic]},
            against=("the rises recur within one process, with no resume between them",),
        ))
        return out

    def _jumps_within(self, run: RunData, out: list[Finding], checked_steps: set[int],
                      lr_initial: float) -> list[Finding]:
        """Upward jumps (or re-warm-up starts) after the peak inside the effective timeline, appended to ``out``.

        The candidates are found over whole columns (:meth:`_jump_candidates`); only the few that stand out are
        judged one by one (in step order, as ``out`` grows).
        """
        s = run.series("lr")
        assert s is not None
        v, st = s.values, s.steps
        within: list[Finding] = []
        if len(v) < TAIL_POINTS or not np.isfinite(v[0]):
            return within  # a non-finite first lr: no peak to decay from
        cand, peak = self._jump_candidates(v)
        for i in cand.tolist():
            if int(st[i]) in checked_steps:
                continue
            in_rewarm = any(
                0 < int(st[i]) - f.step <= self.rewarm_window_steps
                and bool(np.all(np.diff(v[np.searchsorted(st, f.step):i + 1]) > 0))
                for f in out if f.step is not None
            )
            if in_rewarm:
                continue
            prev = pl.DataFrame({"step": st[:i], "value": v[:i]})
            cur = pl.DataFrame({"step": st[i:], "value": v[i:]})
            f = self._judge(
                run, cur, prev, int(st[i]), float(v[i]), extrapolate(prev, int(st[i])),
                "extrapolated from the preceding steps", lr_initial, float(v[peak[i - 1]]), int(s.segments[i]),
                within=True,
            )
            if f:
                out.append(f)
                within.append(f)
            if len(out) >= MAX_JUDGED:
                break
        return within

    def _jump_candidates(self, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(indices i of the points that jump up after the peak or restart a warm-up, running-peak index per pair).

        ``v``: the lr column, shape (n,), n >= 4, finite first point. Pair ``i - 1`` is (v[i-1], v[i]). A jump counts
        when it stands out of the schedule's own step-to-step change (a cyclic schedule rises smoothly): its log
        rise above ``jump_noise_factor`` x the median absolute log change of the :data:`SMOOTH_WINDOW` points
        before it. Whole columns; the smoothness only at the candidates.
        """
        n, tol = len(v), self.rel_tol
        with np.errstate(all="ignore"):
            prev_v, cur_v = v[:-1], v[1:]  # pairs (i-1, i) for i = 1..n-1
            valid = np.isfinite(prev_v) & np.isfinite(cur_v) & (prev_v > 0)
            w = np.where(valid, prev_v, -np.inf)
            w[0] = v[0]  # the running peak starts at the first point
            run_max = np.maximum.accumulate(w)
            pos = np.arange(n - 1)
            # the peak is where the running maximum was first reached: a plateau (a constant lr after its
            # warm-up) keeps the peak at its first point, so a jump above the plateau counts as one after it
            before = np.concatenate([[-np.inf], run_max[:-1]])
            peak = np.maximum.accumulate(np.where(valid & (w > before), pos, 0))
            vp = v[peak]
            decayed = (prev_v < vp * (1 - tol)) | ((pos > peak + 2) & (prev_v <= vp))
            jump_raw = cur_v > prev_v * (1 + tol)
            # a re-warm-up: the lr falls below half, then rises on the next two points
            nxt1 = np.concatenate([v[2:], [np.nan]])
            nxt2 = np.concatenate([v[REWARM_AHEAD:], np.full(REWARM_AHEAD - 1, np.nan)])
            rewarm = (pos + REWARM_AHEAD < n) & (cur_v < 0.5 * prev_v) & (nxt1 > cur_v * (1 + tol)) & (nxt2 > nxt1)
            cand = np.flatnonzero(valid & decayed & (jump_raw | rewarm)) + 1
            smooth = _smooth_rise(v, cand, self.jump_noise_factor)
        keep = (jump_raw[cand - 1] & ~smooth) | rewarm[cand - 1]
        return cand[keep], peak

    def _judge(
        self, run: RunData, cur: pl.DataFrame, prev: pl.DataFrame, s0: int, obs: float, exp: float, how: str,
        lr_initial: float, lr_peak: float, segment: int, replay: tuple[float, float] | None = None,
        within: bool = False,
    ) -> Finding | None:
        """The finding for the lr ``obs`` at step ``s0`` where the schedule gives ``exp`` (None: it continues)."""
        if not (np.isfinite(obs) and np.isfinite(exp)):
            return None
        rel = abs(obs - exp) / max(abs(exp), LR_FLOOR)
        ev: dict[str, object] = {
            "step": s0, "observed_lr": obs, "expected_lr": exp, "expected_from": how,
            "relative_difference": round(rel, 4), "initial_lr": lr_initial, "peak_lr_before": lr_peak,
        }
        if replay is not None:
            ev["replays_schedule_from_start"] = True
            ev["replays_from_step"] = round(replay[0])
        if rel <= self.rel_tol:
            return self._same_value(run, cur, prev, s0, segment, ev)
        scale = constant_scale(prev, cur)
        if scale is not None:
            ev["lr_scale_factor"] = round(scale, 4)
            return self.finding(
                cause=Cause.LR_SCHEDULE_RESET, mechanism=Mechanism.INTENTIONAL_CHANGE, step=s0, segment=segment,
                confidence=self.scaled_confidence, severity=Severity.INFO,
                message=f"from the resume at step {s0} the whole lr schedule is scaled by {scale:.3g} "
                "(same shape, constant factor): a deliberate lr change, not a lost scheduler state.",
                evidence=ev, against=("a constant factor over every overlapping step is a configuration change",),
            )
        mech, conf, why = self._mechanism(cur, prev, s0, obs, exp, lr_initial, lr_peak, replay, ev, within)
        if within and mech is None:
            ev["inside_process"] = True  # no resume set it: the planner must not talk of one (user test U11)
        return self._finding(run, s0, segment, mech, conf, ev,
                             f"lr {fmt(obs)} at step {s0} where the schedule gives {fmt(exp)} ({how}): {why}")

    def _same_value(self, run: RunData, cur: pl.DataFrame, prev: pl.DataFrame, s0: int, segment: int,
                    ev: dict[str, object]) -> Finding | None:
        """A resume whose first lr matches the schedule: a finding only when the decay rate changed."""
        # the steps the resumed process re-logs carry the same lr: the schedule continues
        j = cur.select("step", "value").join(prev.select("step", pl.col("value").alias("old")), on="step")
        if j.height >= 2:
            r = (j.get_column("value") / j.get_column("old")).to_numpy()
            if np.all(np.isfinite(r)) and float(np.max(np.abs(r - 1))) <= self.rel_tol:
                return None
        # same value now: a changed decay rate (horizon change) shows over the next points
        if prev.height < MIN_POINTS or cur.height < TAIL_POINTS:
            return None
        cur_v = cur.get_column("value").to_numpy().astype(float)
        pv = prev.get_column("value").to_numpy()[-TAIL_POINTS:].astype(float)
        ps = prev.get_column("step").to_numpy()[-TAIL_POINTS:].astype(float)
        cs = cur.get_column("step").to_numpy()[:HEAD_POINTS].astype(float)
        slope_prev = (pv[-1] - pv[0]) / max(ps[-1] - ps[0], 1)
        slope_cur = (cur_v[: len(cs)][-1] - cur_v[0]) / max(cs[-1] - cs[0], 1)
        # a decay rate exists only where the lr decays smoothly (a step schedule is flat between drops)
        smooth = bool(np.all(np.diff(pv) < 0))
        if smooth and slope_prev < 0 and (slope_cur >= 0 or abs(slope_cur / slope_prev - 1) > self.slope_tol):
            ev.update({"slope_before": slope_prev, "slope_after": slope_cur})
            return self._finding(run, s0, segment, Mechanism.HORIZON_CHANGE, self.slope_change_confidence, ev,
                                 f"lr decay rate changed at the resume at step {s0}: "
                                 f"{slope_prev:.3g}/step before, {slope_cur:.3g}/step after")
        return None

    def _mechanism(self, cur: pl.DataFrame, prev: pl.DataFrame, s0: int, obs: float, exp: float, lr_initial: float,
                   lr_peak: float, replay: tuple[float, float] | None, ev: dict[str, object],
                   within: bool = False) -> tuple[Mechanism | None, float, str]:
        """(mechanism, confidence, why) of a discontinuity; fills ``ev`` with what it measured.

        ``within``: the jump lies inside one process (no resume), so a changed total of steps (a horizon
        change, which a resume sets) is not one of its explanations.
        """
        cur_v = cur.get_column("value").to_numpy().astype(float)
        rises = bool(np.all(np.diff(cur_v[:min(REWARM_POINTS, cur_v.size)]) > 0))
        rewarm = cur_v.size >= MIN_POINTS and obs < exp and rises
        near_initial = abs(obs - lr_initial) <= self.rel_tol * max(lr_initial, LR_FLOOR) or (
            lr_peak > 0 and abs(obs - lr_peak) <= self.rel_tol * lr_peak and obs > exp
        )
        if replay is not None and obs != exp:
            at, first = replay
            at_peak = lr_peak > 0 and abs(obs - lr_peak) <= self.rel_tol * lr_peak
            where = ("its first step" if at <= first + 1 else
                     f"its step {round(at)}" + (" (its peak, past the warm-up)" if at_peak else ""))
            why = f"the resumed lr replays the old schedule from {where}"
            return Mechanism.RESET_TO_INITIAL, self.reset_confidence, why
        if rewarm or near_initial:
            return (Mechanism.RESET_TO_INITIAL, self.reset_confidence,
                    "warm-up restarts" if rewarm else "lr is back at the schedule's initial/peak value")
        if not within and (hz := horizons(prev, cur)) is not None:
            t_prev, t_cur, slope_prev, slope_cur = hz
            ev.update({"decay_end_before": round(t_prev), "decay_end_after": round(t_cur),
                       "slope_before": slope_prev, "slope_after": slope_cur})
            if abs(slope_cur / slope_prev - 1) <= self.same_slope_tol:
                ev["offset_steps"] = round(t_cur - t_prev)
                return (Mechanism.OFFSET, self.offset_confidence,
                        f"the same linear decay shifted by {ev['offset_steps']} steps")
            return (Mechanism.HORIZON_CHANGE, self.horizon_confidence,
                    f"the linear decay now ends at step ~{round(t_cur)} instead of ~{round(t_prev)} "
                    "(total steps changed on resume)")
        pv = prev.get_column("value").to_numpy().astype(float)
        psteps = prev.get_column("step").to_numpy()
        match = np.flatnonzero(np.abs(pv - obs) <= self.match_tol * max(abs(obs), LR_FLOOR))
        if match.size:
            ev["offset_steps"] = int(s0 - psteps[match[-1]])
            return (Mechanism.OFFSET, self.offset_confidence,
                    f"lr equals the old schedule's value {ev['offset_steps']} steps away")
        if obs > exp and within:  # no resume, no earlier value: the lr was raised off its schedule mid-run
            return None, self.other_confidence, f"lr jumps up x{obs / max(exp, LR_FLOOR):.3g} inside one process"
        if obs > exp:
            return Mechanism.RESET_TO_INITIAL, self.other_confidence, "lr jumps up"
        return Mechanism.HORIZON_CHANGE, self.other_confidence, "lr drops below the schedule"

    def _finding(
        self, run: RunData, step: int, segment: int, mech: Mechanism | None, conf: float, ev: dict[str, object],
        msg: str,
    ) -> Finding:
        override = intentional_override(run)
        against: tuple[str, ...] = ()
        if override and ev.get("replays_schedule_from_start"):
            # an intentional change sets a NEW schedule; a reset replays the old one from its beginning
            ev["override"] = override
            msg += (f"; the run sets {override}, yet the lr after the resume replays the old schedule from its "
                    "first step: the schedule was reset, not replaced")
        elif override:
            ev["override"] = override
            against = (f"the run folder sets {override}: the lr change was deliberate",)
            mech, conf = Mechanism.INTENTIONAL_CHANGE, self.override_confidence
            msg += f"; the run sets {override}, so the change looks deliberate"
        return self.finding(
            cause=Cause.LR_SCHEDULE_RESET, mechanism=mech, step=step, segment=segment, confidence=conf,
            severity=Severity.INFO if mech == Mechanism.INTENTIONAL_CHANGE else Severity.HIGH,
            message=msg + ".", evidence=ev,
            against=against,
        )


def _smooth_rise(v: np.ndarray, idx: np.ndarray, factor: float) -> np.ndarray:
    """Whether the rise into each point of ``idx`` is the schedule's own step-to-step change.

    For each index i of ``idx`` (i >= 1): the log rise v[i-1] -> v[i] is within ``factor`` x the median absolute
    log change between the (up to) :data:`SMOOTH_WINDOW` points before i; False with fewer than
    :data:`SMOOTH_MIN_CHANGES` changes or a NaN among them. Shape of ``idx``; whole arrays but for the first points.
    """
    out = np.zeros(idx.size, dtype=bool)
    with np.errstate(all="ignore"):
        rise = np.log(v[idx] / v[idx - 1])
        full = idx >= SMOOTH_WINDOW
        if full.any():
            win = v[idx[full, None] + np.arange(-SMOOTH_WINDOW, 0)]  # (k, 9): the points before each candidate
            changes = np.abs(np.diff(np.log(np.clip(win, LR_FLOOR, None)), axis=1))
            out[full] = rise[full] <= factor * np.median(changes, axis=1)
        for j in np.flatnonzero(~full).tolist():  # the first few points: a shorter window
            changes = np.abs(np.diff(np.log(np.clip(v[:idx[j]], LR_FLOOR, None))))
            out[j] = changes.size >= SMOOTH_MIN_CHANGES and bool(rise[j] <= factor * float(np.median(changes)))
    return out
