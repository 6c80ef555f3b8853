"""OV01 overflow.loss_scale_collapse: fp16 dynamic loss scale backing off toward its floor.

Rule (docs/detectors.md#ov01, after the DeepSpeed/Megatron/torch GradScaler scaler code): ignore the
calibration burst in the first ``calibration_steps`` steps; flag when the scale reaches the
floor (``min_scale``, 1.0 by default as in Megatron; fairseq prints small scales as 0), or backs
off ``min_halvings`` (8, i.e. /256) times without growing in between, or the skipped fraction
exceeds 5% of a window, or the log ends with ``min_tail_skips`` (4) skipped steps in a row (the
job died while the scaler was still backing off: torch GradScaler has no floor). The onset is
the first back-off of the collapse sequence. A constant ``loss scale: 1.0`` in a bf16 run is not
evidence of anything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import polars as pl

from forensics.detectors.base import Detector, fmt, segment_at
from forensics.model import Finding, RunData


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
        onset: int | None = None
        seg = 0
        conf = 0.0
        backoffs, interval, scales = self._backoffs(run)
        floor_msg = self._floor_message(run)
        if backoffs:
            gap = max(3 * interval, 1)
            k = len(backoffs) - 1
            while k > 0 and backoffs[k][0] - backoffs[k - 1][0] <= gap:
                k -= 1
            burst = backoffs[k:]
            before = [v for st, v in scales if st < burst[0][0]]
            level = before[-1] if before else None
            low = min(b[1] for b in burst)
            halvings = float(np.log2(level / low)) if level and low > 0 else float(len(burst))
            floor_hit = floor_msg is not None or (low <= self.min_scale and (level or 0) > self.min_scale)
            if floor_hit or halvings >= self.min_halvings or len(burst) >= self.min_halvings:
                onset, seg = burst[0][0], burst[0][2]
                conf = 0.9 if floor_hit else 0.75
                ev.update({"scale_before": level, "scale_min": low, "back_offs_in_burst": len(burst),
                           "halvings": round(halvings, 1), "floor_reached": floor_hit,
                           "first_back_off_step": onset, "back_offs_total": len(backoffs)})
                if floor_msg:
                    ev["floor_message"] = floor_msg[:200]
        sk = run.series("skipped_step")
        if sk is not None and len(sk) > 0:
            vals = np.nan_to_num(sk.values, nan=0.0)
            n_skip = float(vals.sum())
            if n_skip > 0:
                first = int(sk.steps[np.flatnonzero(vals > 0)[0]])
                frac = n_skip / max(1, len(sk))
                ev.update({"skipped_steps": n_skip, "first_skipped_step": first, "skipped_fraction": round(frac, 4)})
                tail = 0
                for x in vals[::-1]:
                    if x <= 0:
                        break
                    tail += 1
                if onset is None and tail >= self.min_tail_skips:
                    i0 = len(vals) - tail
                    onset, seg, conf = int(sk.steps[i0]), int(sk.segments[i0]), 0.8
                    ev["skipped_in_a_row_at_end"] = tail
                elif onset is None and frac >= self.skip_fraction:
                    onset, seg, conf = first, segment_at(sk, first), 0.6
        if onset is None:
            return []
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
                cause="overflow", mechanism="loss_scale_collapse", step=onset, segment=seg, confidence=conf,
                severity="high", message=msg + ".", evidence=ev,
            )
        ]

    @staticmethod
    def _backoffs(run: RunData) -> tuple[list[tuple[int, float, int]], int, list[tuple[int, float]]]:
        """Back-offs as (step, new scale, segment), the logging interval, and all (step, scale) values.

        Zeros are dropped: dynamic scalers never reach 0, fairseq prints small scales as 0.
        Overflow events (several per logged step) count one back-off each.
        """
        pts: list[tuple[int, float, int]] = []
        s = run.series("loss_scale")
        if s is not None:
            ok = np.isfinite(s.values) & (s.values > 0)
            pts = list(zip(s.steps[ok].tolist(), s.values[ok].tolist(), s.segments[ok].tolist(), strict=True))
        interval = int(np.median(np.diff([p[0] for p in pts]))) if len(pts) > 2 else 1
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
            for st, v, g in ev_pts:
                if prev is None or v < prev:
                    backoffs.append((st, v, g))
                prev = v
            scales = sorted([(p[0], p[1]) for p in pts] + [(p[0], p[1]) for p in ev_pts])
        else:
            for a, b in zip(pts, pts[1:], strict=False):
                if b[1] < a[1]:
                    backoffs.append(b)
            scales = [(p[0], p[1]) for p in pts]
        return backoffs, max(interval, 1), scales

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
