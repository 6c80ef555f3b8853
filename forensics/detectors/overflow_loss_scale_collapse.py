"""OV01 overflow.loss_scale_collapse: fp16 dynamic loss scale backing off toward its floor.

Rule (docs/detectors.md#ov01, after the DeepSpeed/Megatron/torch GradScaler scaler code): ignore the
calibration burst in the first ``calibration_steps`` steps; flag when the scale reaches the
floor (``min_scale``, 1.0 by default as in Megatron; fairseq prints small scales as 0), or backs
off ``min_halvings`` (8, i.e. /256) times without growing in between, or the skipped fraction
exceeds 5% of a window, or the log ends with ``min_tail_skips`` (4) skipped steps in a row (the
job died while the scaler was still backing off: torch GradScaler has no floor). The onset is
the first back-off of the collapse sequence. A constant ``loss scale: 1.0`` in a bf16 run is not
evidence of anything.

Source: docs/detectors.md#ov01 (the thresholds, where each comes from, the published reports).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import polars as pl

from forensics.detectors.base import Detector, fmt, segment_at
from forensics.model import Cause, Finding, Mechanism, RunData, Severity

MESSAGE_CHARS = 200
"""Characters of a quoted scaler log line kept in the evidence (ours: display length, decides nothing)."""
CUMULATIVE_MIN_DIFFS = 4
"""Step-to-step differences a skipped-step counter needs before it can be read as a running total (ours)."""
CUMULATIVE_RISING_SHARE = 0.8
"""Share of non-decreasing differences that makes the counter a running total (ours: DeepSpeed prints the skips
so far; a per-interval count goes up and down)."""
PROBE_MIN_POINTS = 4
"""Logged scales needed before back-offs can be told apart as growth probes (ours)."""
AGAINST_MIN_POINTS = 10
"""Logged loss points needed before "the loss keeps improving" can speak against the finding (ours)."""
AGAINST_TAIL_SHARE = 10
"""The last ``1/10`` of the loss (at least :data:`AGAINST_MIN_WINDOW` points) must be finite (ours)."""
AGAINST_MIN_WINDOW = 3
"""Fewest points in each of the windows the against-evidence compares (ours: a median of three)."""
AGAINST_MIN_AFTER = 6
"""Finite loss points after the onset needed to compare its first and last quarters (ours: two windows of 3)."""
AGAINST_QUARTER = 4
"""The early and late windows after the onset are a ``1/4`` of those points each (ours)."""


class _Backoffs(NamedTuple):
    """The scaler's back-offs as whole columns, in the order they were logged: shapes (k,)."""

    steps: np.ndarray  # int64
    scales: np.ndarray  # float64: the scale after the back-off
    segments: np.ndarray  # int64


@dataclass(frozen=True)
class LossScaleCollapse(Detector):
    """Loss-scale collapse and skipped steps (fp16 dynamic loss scaling)."""

    code = "OV01"
    name = "overflow.loss_scale_collapse"
    requires = ("loss_scale", "skipped_step")
    calibration_steps: int = 32
    min_scale: float = 1.0
    min_halvings: int = 8
    skip_fraction: float = 0.05
    min_tail_skips: int = 4
    burst_gap_intervals: int = 3
    calibration_start_intervals: int = 2
    oscillation_factor: float = 16.0
    oscillation_min_points: int = 8
    probe_max_drop: float = 4.0
    floor_confidence: float = 0.9
    tail_confidence: float = 0.8
    halvings_confidence: float = 0.75
    fraction_confidence: float = 0.6
    improving_confidence: float = 0.4

    def detect(self, run: RunData) -> list[Finding]:
        """At most one finding: the final burst of back-offs (or sustained skipping) with its onset."""
        ev: dict[str, object] = {}
        backoffs, interval, scales = self._backoffs(run)
        calibration = self._calibration(run, backoffs, scales)
        keep = ~np.isin(backoffs.steps, calibration)
        onset, seg, conf = self._collapse(run, _Backoffs(*(a[keep] for a in backoffs)), interval, scales,
                                          calibration, ev)
        skip = self._skips(run, calibration, ev, want_onset=onset is None)
        if skip is not None:
            onset, seg, conf = skip
        if onset is None:
            return []
        against = self._against(run, ev, onset)
        if against and not ev.get("floor_reached") and "skipped_in_a_row_at_end" not in ev:
            conf = min(conf, self.improving_confidence)  # normal dynamic loss scaling in a run that keeps learning
        if "scale_before" in ev:
            msg = (f"fp16 loss scale backed off {ev['back_offs_in_burst']} times in a row from "
                   f"{fmt(float(ev['scale_before'] or float('nan')))} to {fmt(float(ev['scale_min']))} starting at "
                   f"step {onset}" + self._floor_words(ev))
        else:
            msg = f"{ev.get('skipped_steps')} skipped steps from step {onset}"
        if "skipped_steps" in ev and "scale_before" in ev:
            msg += f"; {int(ev['skipped_steps'])} optimizer steps skipped in all"
        return [
            self.finding(
                cause=Cause.OVERFLOW, mechanism=Mechanism.LOSS_SCALE_COLLAPSE, step=onset, segment=seg, confidence=conf,
                severity=Severity.HIGH if conf >= 0.5 else Severity.LOW, message=msg + ".", evidence=ev,
                against=tuple(against),
            )
        ]

    def _collapse(self, run: RunData, backoffs: _Backoffs, interval: int, scales: tuple[np.ndarray, np.ndarray],
                  calibration: np.ndarray, ev: dict[str, object]) -> tuple[int | None, int, float]:
        """(onset, segment, confidence) of the last burst of back-offs when it is a collapse; fills ``ev``."""
        n = backoffs.steps.size
        if not n:
            return None, 0, 0.0
        floor_msg = self._floor_message(run)
        gap = max(self.burst_gap_intervals * interval, 1)
        apart = np.flatnonzero(np.diff(backoffs.steps) > gap)  # the last burst starts after the last wide gap
        k = int(apart[-1]) + 1 if apart.size else 0
        sc_st, sc_v = scales
        first, n_burst = int(backoffs.steps[k]), n - k
        before = sc_v[sc_st < first]
        level = float(before[-1]) if before.size else None
        low = float(np.min(backoffs.scales[k:]))
        halvings = float(np.log2(level / low)) if level and low > 0 else float(n_burst)
        floor_hit = floor_msg is not None or (low <= self.min_scale and (level or 0) > self.min_scale)
        post = sc_v[~np.isin(sc_st, calibration)] if calibration.size else sc_v
        typical = float(np.median(post)) if post.size else None
        end = float(sc_v[-1]) if sc_v.size else None
        # the scale ends where it usually sits: a scaler that oscillates (growth probes), not a collapse
        oscillates = bool(typical and end and end >= typical / self.oscillation_factor
                          and post.size >= self.oscillation_min_points)
        if oscillates:
            ev["scale_typical"], ev["scale_at_end"] = typical, end
        if not (floor_hit or (not oscillates and (halvings >= self.min_halvings or (
                n_burst >= self.min_halvings and not self._probes(first, n_burst, scales))))):
            return None, 0, 0.0
        ev.update({"scale_before": level, "scale_min": low, "back_offs_in_burst": n_burst,
                   "halvings": round(halvings, 1), "floor_reached": floor_hit,
                   "first_back_off_step": first, "back_offs_total": n})
        if floor_msg:
            ev["floor_message"] = floor_msg[:MESSAGE_CHARS]
        return first, int(backoffs.segments[k]), self.floor_confidence if floor_hit else self.halvings_confidence

    def _skips(self, run: RunData, calibration: np.ndarray, ev: dict[str, object],
               want_onset: bool) -> tuple[int, int, float] | None:
        """(onset, segment, confidence) from the skipped-step counter (a tail of skips, or a large share).

        Fills ``ev`` with the counts either way; an onset only when ``want_onset`` (no collapse was found).
        """
        sk = run.series("skipped_step")
        if sk is None or len(sk) == 0:
            return None
        vals = np.nan_to_num(sk.values, nan=0.0)
        d = np.diff(vals)
        if vals.max() > 1 and d.size >= CUMULATIVE_MIN_DIFFS and np.mean(d >= 0) >= CUMULATIVE_RISING_SHARE:
            # a running total (DeepSpeed prints the skips so far): the skips are its increments
            vals = np.concatenate([vals[:1], np.clip(d, 0, None)])
            ev["skipped_counter_cumulative"] = True
        calib = np.isin(sk.steps, calibration) if calibration.size else None
        n_calib = float(vals[calib].sum()) if calib is not None else 0.0
        n_skip = float(vals.sum()) - n_calib
        if n_calib:
            ev["calibration_skips"] = n_calib
        if n_skip <= 0:
            return None
        nz = np.flatnonzero((vals > 0) & (~calib if calib is not None else True))
        first = int(sk.steps[nz[0]]) if nz.size else int(sk.steps[np.flatnonzero(vals > 0)[0]])
        # a count per logged interval (Megatron/DeepSpeed print skips since the last line) is a share of
        # the steps spanned, not of the lines
        span = max(len(sk), int(sk.steps[-1] - sk.steps[0]) + 1) if vals.max() > 1 else len(sk)
        frac = n_skip / max(1, span)
        ev.update({"skipped_steps": n_skip, "first_skipped_step": first, "skipped_fraction": round(frac, 4)})
        if not want_onset:
            return None
        zero = np.flatnonzero(vals[::-1] <= 0)
        tail = int(zero[0]) if zero.size else len(vals)  # skipped steps in a row at the end
        if tail >= self.min_tail_skips:
            i0 = len(vals) - tail
            ev["skipped_in_a_row_at_end"] = tail
            return int(sk.steps[i0]), int(sk.segments[i0]), self.tail_confidence
        if frac >= self.skip_fraction:
            return first, segment_at(sk, first), self.fraction_confidence
        return None

    def _calibration(self, run: RunData, backoffs: _Backoffs, scales: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        """Steps (int64, for ``np.isin``) of back-offs that are the scaler's calibration at the start of a segment.

        A dynamic scaler starts high (2**16 in torch/Megatron, 2**32 in DeepSpeed's default power) and halves
        on each overflowing step until the gradients fit: a run of back-offs from the first logged step of a
        segment (any series), each within ``burst_gap_intervals`` (3) logging intervals of the previous one,
        before the scale has ever held or grown, is calibration (docs/detectors.md#ov01: "ignore the calibration
        burst"), whatever its length. Whole columns: the back-offs of each segment in log order, the first that
        ends the run found with one reduction per segment.
        """
        st, sv, sg = backoffs
        if not st.size:
            return st
        order = np.argsort(sg, kind="stable")  # each segment's back-offs together, in log order
        st, sv, sg = st[order], sv[order], sg[order]
        head = np.flatnonzero(np.r_[True, sg[1:] != sg[:-1]])  # first back-off of each segment
        sc_st, sc_v = scales
        interval = max(1, int(np.median(np.diff(sc_st)))) if sc_st.size > 2 else 1
        # a segment starts at its first logged step of ANY series: DeepSpeed prints the scale only when it
        # changes, so the loss-scale series of a late collapse begins at the collapse, which is no start-up
        starts = run.segment_starts()
        start = np.array([min(int(b), starts.get(int(g), int(b))) for b, g in zip(st[head], sg[head], strict=True)],
                         dtype=st.dtype)
        # the run of a segment ends at the first back-off too far from the previous one, or after the scale held
        lo = np.searchsorted(sc_st, st[:-1], side="right")
        hi = np.searchsorted(sc_st, st[1:], side="left")
        ends = np.r_[True, (np.diff(st) > self.burst_gap_intervals * interval) | _reaches(sc_v, lo, hi, sv[:-1])]
        ends[head] = True
        rank = np.arange(st.size) - np.repeat(head, np.diff(np.r_[head, st.size]))
        first_end = np.minimum.reduceat(np.where(ends & (rank > 0), rank, st.size), head)
        # calibration starts with the first steps: the initial scale is too high at once
        ok = st[head] - start <= self.calibration_start_intervals * interval
        group = np.repeat(np.arange(head.size), np.diff(np.r_[head, st.size]))
        return st[ok[group] & (rank < first_end[group])]  # not np.unique: its hash path is slow on 1M steps

    def _probes(self, first: int, n_burst: int, scales: tuple[np.ndarray, np.ndarray]) -> bool:
        """Back-offs that are growth probes: the scale grows back between them and ends where it was.

        ``first``: the step of the burst's first back-off; ``n_burst``: the back-offs in the burst.
        """
        sc_st, sc_v = scales
        if sc_st.size < PROBE_MIN_POINTS:
            return False
        lo = float(sc_v[sc_st >= first].min())
        before = sc_v[sc_st < first]
        grows = int(np.sum(sc_v[1:] > sc_v[:-1]))
        return bool(before.size) and grows >= n_burst // 2 and lo >= float(before[-1]) / self.probe_max_drop

    @staticmethod
    def _against(run: RunData, ev: dict[str, object], onset: int) -> list[str]:
        """Evidence that the skips are the scaler's normal work: the loss keeps improving, all finite."""
        loss = run.series("loss") or run.series("eval_loss")
        if loss is None or len(loss) < AGAINST_MIN_POINTS:
            return []
        v = loss.values
        if not np.all(np.isfinite(v[-max(AGAINST_MIN_WINDOW, len(v) // AGAINST_TAIL_SHARE):])):
            return []
        after = v[loss.steps >= onset]
        after = after[np.isfinite(after)]
        if after.size < AGAINST_MIN_AFTER:
            return []
        k = max(AGAINST_MIN_WINDOW, after.size // AGAINST_QUARTER)
        early, late = float(np.median(after[:k])), float(np.median(after[-k:]))
        if late >= early:
            return []
        skipped = ev.get("skipped_steps")
        return [f"the loss keeps improving after the first back-off ({fmt(early)} -> {fmt(late)}) and ends finite"
                + (f"; {int(float(skipped))} skipped steps are the dynamic scaler at work" if skipped else "")]

    @staticmethod
    def _backoffs(run: RunData) -> tuple[_Backoffs, int, tuple[np.ndarray, np.ndarray]]:
        """Back-offs (step, new scale, segment), the logging interval, and all scales as (steps, values) arrays.

        Zeros are dropped: dynamic scalers never reach 0, fairseq prints small scales as 0.
        Overflow events (several per logged step) count one back-off each. Whole columns (no per-step loop).
        """
        st = np.zeros(0, dtype=np.int64)
        v = np.zeros(0)
        g = np.zeros(0, dtype=np.int64)
        s = run.series("loss_scale")
        if s is not None:
            ok = np.isfinite(s.values) & (s.values > 0)
            st, v, g = s.steps[ok], s.values[ok], s.segments[ok].astype(np.int64)
        interval = max(int(np.median(np.diff(st))) if st.size > 2 else 1, 1)
        e_st, e_v, e_g = _scale_events(run)
        if e_st.size:
            down = np.r_[True, e_v[1:] < e_v[:-1]]  # each event below the one before it
            all_st, all_v = np.concatenate([st, e_st]), np.concatenate([v, e_v])
            order = np.lexsort((all_v, all_st))
            return _Backoffs(e_st[down], e_v[down], e_g[down]), interval, (all_st[order], all_v[order])
        down = np.flatnonzero(v[1:] < v[:-1]) + 1
        return _Backoffs(st[down], v[down], g[down]), interval, (st, v)

    def _floor_words(self, ev: dict[str, object]) -> str:
        """How the end of the collapse is said: a scaler's floor only when the logs name one (torch has none)."""
        if not ev.get("floor_reached"):
            return ""
        if ev.get("floor_message"):
            return "; the scaler hit its minimum scale"
        return (f"; the scale fell below {fmt(self.min_scale)}, the floor of Megatron's and DeepSpeed's scalers "
                "(torch's GradScaler has none): nearly every step overflowed")

    @staticmethod
    def _floor_message(run: RunData) -> str | None:
        """The first error line saying the scaler reached its minimum, or None."""
        if not run.events.height:
            return None
        low = pl.col("message").cast(pl.Utf8).str.to_lowercase()
        hit = run.events.filter((pl.col("kind") == "error") & pl.any_horizontal(
            low.str.contains(w, literal=True) for w in _FLOOR_WORDS))
        return str(hit.get_column("message")[0]) if hit.height else None


def _scale_events(run: RunData) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scaler messages with a step as (steps int64, new scale float64, segments int64), in log order.

    The new scale is the last number of the message ("reducing to Y", "setting loss scale to: X").
    """
    empty = (np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0, dtype=np.int64))
    if not run.events.height:
        return empty
    ch = run.events.filter((pl.col("kind") == "loss_scale_change") & pl.col("step").is_not_null())
    last = ch.select(pl.col("message").cast(pl.Utf8).str.extract_all(_NUM.pattern).list.last().alias("num"),
                     "step", "segment").drop_nulls("num")
    if not last.height:
        return empty
    return (last.get_column("step").to_numpy().astype(np.int64),
            np.array([float(x) for x in last.get_column("num").to_list()], dtype=np.float64),
            last.get_column("segment").to_numpy().astype(np.int64))


def _reaches(values: np.ndarray, lo: np.ndarray, hi: np.ndarray, level: np.ndarray) -> np.ndarray:
    """``any(values[lo[j]:hi[j]] >= level[j])`` for every j (False for an empty range), whole arrays.

    One ``fmax.reduceat`` over the non-empty ranges sorted by start (NaN ignored, as ``>=`` ignores it); the cost
    is the total length of the ranges plus ``len(values)``.
    """
    out = np.zeros(lo.size, dtype=bool)
    nonempty = np.flatnonzero(hi > lo)
    if not nonempty.size:
        return out
    order = nonempty[np.argsort(lo[nonempty], kind="stable")]
    idx = np.empty(2 * order.size, dtype=np.int64)
    idx[0::2], idx[1::2] = lo[order], hi[order]
    top = np.fmax.reduceat(np.r_[values, -np.inf], idx)[0::2]  # the sentinel makes hi == len(values) an index
    out[order] = top >= level[order]
    return out


_NUM = re.compile(r"[-+]?\d*\.?\d+(?:[eE][-+]?\d+)?")
_FLOOR_WORDS = ("minimum loss scale", "loss scale already at minimum", "min_loss_scale")
