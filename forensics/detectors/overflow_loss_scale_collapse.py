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

import numpy as np
import polars as pl

from forensics.detectors.base import Detector, fmt, segment_at
from forensics.model import Cause, Finding, Mechanism, RunData, Severity


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

    def detect(self, run: RunData) -> list[Finding]:
        """At most one finding: the final burst of back-offs (or sustained skipping) with its onset."""
        ev: dict[str, object] = {}
        backoffs, interval, scales = self._backoffs(run)
        calibration = self._calibration(run, backoffs, scales)
        onset, seg, conf = self._collapse(run, [b for b in backoffs if b[0] not in calibration], interval, scales,
                                          calibration, ev)
        skip = self._skips(run, calibration, ev, want_onset=onset is None)
        if skip is not None:
            onset, seg, conf = skip
        if onset is None:
            return []
        against = self._against(run, ev, onset)
        if against and not ev.get("floor_reached") and "skipped_in_a_row_at_end" not in ev:
            conf = min(conf, 0.4)  # normal dynamic loss scaling in a run that keeps learning
        if "scale_before" in ev:
            msg = (f"fp16 loss scale backed off {ev['back_offs_in_burst']} times in a row from "
                   f"{fmt(float(ev['scale_before'] or float('nan')))} to {fmt(float(ev['scale_min']))} starting at "
                   f"step {onset}" + ("; the scaler hit its floor" if ev["floor_reached"] else ""))
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

    def _collapse(self, run: RunData, backoffs: list[tuple[int, float, int]], interval: int,
                  scales: tuple[np.ndarray, np.ndarray], calibration: set[int],
                  ev: dict[str, object]) -> tuple[int | None, int, float]:
        """(onset, segment, confidence) of the last burst of back-offs when it is a collapse; fills ``ev``."""
        if not backoffs:
            return None, 0, 0.0
        floor_msg = self._floor_message(run)
        gap = max(3 * interval, 1)
        k = len(backoffs) - 1
        while k > 0 and backoffs[k][0] - backoffs[k - 1][0] <= gap:
            k -= 1
        burst = backoffs[k:]
        sc_st, sc_v = scales
        before = sc_v[sc_st < burst[0][0]]
        level = float(before[-1]) if before.size else None
        low = min(b[1] for b in burst)
        halvings = float(np.log2(level / low)) if level and low > 0 else float(len(burst))
        floor_hit = floor_msg is not None or (low <= self.min_scale and (level or 0) > self.min_scale)
        post = sc_v[~np.isin(sc_st, np.array(sorted(calibration), dtype=np.int64))] if calibration else sc_v
        typical = float(np.median(post)) if post.size else None
        end = float(sc_v[-1]) if sc_v.size else None
        # the scale ends where it usually sits: a scaler that oscillates (growth probes), not a collapse
        oscillates = bool(typical and end and end >= typical / 16 and post.size >= 8)
        if oscillates:
            ev["scale_typical"], ev["scale_at_end"] = typical, end
        if not (floor_hit or (not oscillates and (halvings >= self.min_halvings or (
                len(burst) >= self.min_halvings and not self._probes(burst, scales))))):
            return None, 0, 0.0
        onset = burst[0][0]
        ev.update({"scale_before": level, "scale_min": low, "back_offs_in_burst": len(burst),
                   "halvings": round(halvings, 1), "floor_reached": floor_hit,
                   "first_back_off_step": onset, "back_offs_total": len(backoffs)})
        if floor_msg:
            ev["floor_message"] = floor_msg[:200]
        return onset, burst[0][2], 0.9 if floor_hit else 0.75

    def _skips(self, run: RunData, calibration: set[int], ev: dict[str, object],
               want_onset: bool) -> tuple[int, int, float] | None:
        """(onset, segment, confidence) from the skipped-step counter (a tail of skips, or a large share).

        Fills ``ev`` with the counts either way; an onset only when ``want_onset`` (no collapse was found).
        """
        sk = run.series("skipped_step")
        if sk is None or len(sk) == 0:
            return None
        vals = np.nan_to_num(sk.values, nan=0.0)
        d = np.diff(vals)
        if vals.max() > 1 and d.size >= 4 and np.mean(d >= 0) >= 0.8:
            # a running total (DeepSpeed prints the skips so far): the skips are its increments
            vals = np.concatenate([vals[:1], np.clip(d, 0, None)])
            ev["skipped_counter_cumulative"] = True
        calib = np.isin(sk.steps, np.array(sorted(calibration), dtype=np.int64)) if calibration else None
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
            return int(sk.steps[i0]), int(sk.segments[i0]), 0.8
        if frac >= self.skip_fraction:
            return first, segment_at(sk, first), 0.6
        return None

    def _calibration(self, run: RunData, backoffs: list[tuple[int, float, int]],
                     scales: tuple[np.ndarray, np.ndarray]) -> set[int]:
        """Steps of back-offs that are the scaler's calibration at the start of a segment.

        A dynamic scaler starts high (2**16 in torch/Megatron, 2**32 in DeepSpeed's default power) and halves
        on each overflowing step until the gradients fit: a run of back-offs from the first logged scale of a
        segment, each within ``3 x`` the logging interval of the previous one, before the scale has ever held or
        grown, is calibration (docs/detectors.md#ov01: "ignore the calibration burst"), whatever its length.
        """
        if not backoffs:
            return set()
        s = run.series("loss_scale")
        out: set[int] = set()
        seg_start: dict[int, int] = {}
        if s is not None and len(s):
            segs, first = np.unique(s.segments, return_index=True)
            seg_start = dict(zip(segs.tolist(), s.steps[first].tolist(), strict=True))
        by_seg: dict[int, list[tuple[int, float, int]]] = {}
        for b in backoffs:
            by_seg.setdefault(b[2], []).append(b)
        sc_st, sc_v = scales
        interval = max(1, int(np.median(np.diff(sc_st)))) if sc_st.size > 2 else 1
        for g, bs in by_seg.items():
            start = seg_start.get(g, bs[0][0])
            if bs[0][0] - start > 2 * interval:
                continue  # calibration starts with the first steps: the initial scale is too high at once
            prev_step, prev_scale = bs[0][0], bs[0][1]
            out.add(bs[0][0])
            for st, v, _ in bs[1:]:
                lo, hi = np.searchsorted(sc_st, prev_step, side="right"), np.searchsorted(sc_st, st, side="left")
                held = bool(np.any(sc_v[lo:hi] >= prev_scale))
                if st - prev_step > 3 * interval or held:
                    break
                out.add(st)
                prev_step, prev_scale = st, v
        return out

    @staticmethod
    def _probes(burst: list[tuple[int, float, int]], scales: tuple[np.ndarray, np.ndarray]) -> bool:
        """Back-offs that are growth probes: the scale grows back between them and ends where it was."""
        sc_st, sc_v = scales
        if sc_st.size < 4:
            return False
        first = burst[0][0]
        lo = float(sc_v[sc_st >= first].min())
        before = sc_v[sc_st < first]
        grows = int(np.sum(sc_v[1:] > sc_v[:-1]))
        return bool(before.size) and grows >= len(burst) // 2 and lo >= float(before[-1]) / 4

    @staticmethod
    def _against(run: RunData, ev: dict[str, object], onset: int) -> list[str]:
        """Evidence that the skips are the scaler's normal work: the loss keeps improving, all finite."""
        loss = run.series("loss") or run.series("eval_loss")
        if loss is None or len(loss) < 10:
            return []
        v = loss.values
        if not np.all(np.isfinite(v[-max(3, len(v) // 10):])):
            return []
        after = v[loss.steps >= onset]
        after = after[np.isfinite(after)]
        if after.size < 6:
            return []
        k = max(3, after.size // 4)
        early, late = float(np.median(after[:k])), float(np.median(after[-k:]))
        if late >= early:
            return []
        skipped = ev.get("skipped_steps")
        return [f"the loss keeps improving after the first back-off ({fmt(early)} -> {fmt(late)}) and ends finite"
                + (f"; {int(float(skipped))} skipped steps are the dynamic scaler at work" if skipped else "")]

    @staticmethod
    def _backoffs(run: RunData) -> tuple[list[tuple[int, float, int]], int, tuple[np.ndarray, np.ndarray]]:
        """Back-offs as (step, new scale, segment), the logging interval, and all scales as (steps, values) arrays.

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
        interval = int(np.median(np.diff(st))) if st.size > 2 else 1
        ev_pts: list[tuple[int, float, int]] = []
        if run.events.height:
            ch = run.events.filter((pl.col("kind") == "loss_scale_change") & pl.col("step").is_not_null())
            for row in ch.iter_rows(named=True):
                nums = [float(x) for x in _NUM.findall(str(row["message"]))]
                if nums:
                    ev_pts.append((int(row["step"]), nums[-1], int(row["segment"])))
        backoffs: list[tuple[int, float, int]] = []
        if ev_pts:
            prev = None
            for e_st, e_v, e_g in ev_pts:
                if prev is None or e_v < prev:
                    backoffs.append((e_st, e_v, e_g))
                prev = e_v
            all_st = np.concatenate([st, np.array([p[0] for p in ev_pts], dtype=np.int64)])
            all_v = np.concatenate([v, np.array([p[1] for p in ev_pts], dtype=np.float64)])
            order = np.lexsort((all_v, all_st))
            return backoffs, max(interval, 1), (all_st[order], all_v[order])
        down = np.flatnonzero(v[1:] < v[:-1]) + 1
        backoffs = list(zip(st[down].tolist(), v[down].tolist(), g[down].tolist(), strict=True))
        return backoffs, max(interval, 1), (st, v)

    @staticmethod
    def _floor_message(run: RunData) -> str | None:
        if not run.events.height:
            return None
        for row in run.events.filter(pl.col("kind") == "error").iter_rows(named=True):
            m = str(row["message"]).lower()
            if "minimum loss scale" in m or "loss scale already at minimum" in m or "min_loss_scale" in m:
                return str(row["message"])
        return None


_NUM = re.compile(r"[-+]?\d*\.?\d+(?:[eE][-+]?\d+)?")
