"""OV01 overflow.loss_scale_collapse: fp16 dynamic loss scale backing off toward its floor.

Rule (detectors.md D2, after the DeepSpeed/Megatron/torch GradScaler scaler code): ignore the
calibration burst in the first ``calibration_steps`` steps; flag when the scale reaches the
floor (``min_scale``, 1.0 by default as in Megatron; fairseq prints small scales as 0), or
backs off ``min_halvings`` (8, i.e. /256) times without growing in between, or the skipped
fraction exceeds 5% of a window. The onset is the first back-off of the collapse sequence.
A constant ``loss scale: 1.0`` in a bf16 run is not evidence of anything.
"""

from __future__ import annotations

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

    def detect(self, run: RunData) -> list[Finding]:
        """At most one finding: the collapse (or sustained skipping) with its onset."""
        s = run.series("loss_scale")
        ev: dict[str, object] = {}
        onset: int | None = None
        seg = 0
        conf = 0.0
        if s is not None and len(s) >= 3:
            v, st = s.values, s.steps
            ok = np.isfinite(v)
            v, st, sg = v[ok], st[ok], s.segments[ok]
            if v.size >= 3 and np.nanmax(v) > np.nanmin(v) and np.nanmax(v) > 1.0:
                start = st[0] + self.calibration_steps
                # the collapse sequence: back-offs since the last growth before the final minimum
                i_min = int(np.argmin(v))  # first occurrence of the minimum
                j = i_min
                while j > 0 and v[j - 1] >= v[j] and not (v[j - 1] < v[j]):
                    j -= 1
                seq = np.arange(j, i_min + 1)
                drops = [int(k) for k in seq if k > 0 and v[k] < v[k - 1]]
                drops = [k for k in drops if st[k] >= start] or drops
                peak = float(v[j])
                factor = peak / max(float(v[i_min]), 1e-30)
                n_halvings = float(np.log2(factor)) if factor > 0 else 0.0
                floor_hit = float(v[i_min]) <= self.min_scale
                if drops and (floor_hit or n_halvings >= self.min_halvings):
                    onset = int(st[drops[0]])
                    seg = int(sg[drops[0]])
                    conf = 0.9 if floor_hit else 0.75
                    ev.update(
                        {
                            "scale_before": peak, "scale_min": float(v[i_min]), "min_step": int(st[i_min]),
                            "halvings": round(n_halvings, 1), "back_offs": len(drops), "floor_reached": floor_hit,
                            "first_back_off_step": onset,
                        }
                    )
        sk = run.series("skipped_step")
        if sk is not None and len(sk) > 0:
            vals = np.nan_to_num(sk.values, nan=0.0)
            n_skip = float(vals.sum())
            if n_skip > 0:
                first = int(sk.steps[np.flatnonzero(vals > 0)[0]])
                frac = n_skip / max(1, len(sk))
                ev.update({"skipped_steps": n_skip, "first_skipped_step": first, "skipped_fraction": round(frac, 4)})
                if onset is None and frac >= self.skip_fraction:
                    onset, seg, conf = first, segment_at(sk, first), 0.6
                elif onset is not None:
                    onset = min(onset, first) if first >= onset - 50 else onset
        skips = run.events.filter(pl.col("kind") == "overflow_skip") if run.events.height else run.events
        if skips.height:
            ev["overflow_events"] = skips.height
        if onset is None:
            return []
        msg = (
            f"fp16 loss scale backed off from {fmt(ev.get('scale_before', float('nan')))} to "
            f"{fmt(ev.get('scale_min', float('nan')))} ({ev.get('halvings', 0)} halvings) starting at step {onset}"
            if "scale_before" in ev
            else f"{ev.get('skipped_steps')} skipped steps from step {onset}"
        )
        if "skipped_steps" in ev and "scale_before" in ev:
            msg += f"; {int(ev['skipped_steps'])} optimizer steps skipped"
        return [
            self.finding(
                cause="overflow", mechanism="loss_scale_collapse", step=onset, segment=seg, confidence=conf,
                severity="high", message=msg + ".", evidence=ev,
            )
        ]
