"""HW01 hardware.signature: hardware or distributed-system faults, not optimisation.

Rules (docs/detectors.md#hw01; Megatron RSM, NVRx straggler detection, smdebug ``StepOutlier``,
BigScience tr1/tr11 chronicles):

- ``device_fault``: an error line naming the device (ECC, Xid, ``CUDA error``, NCCL timeout)
  with no metric departure before it; the onset is the step in progress (the last logged step
  plus one).
- ``collective_bug``: a "magic" constant grad norm repeated exactly for ``min_repeats`` logged
  steps (e.g. sqrt(2)), often with a loss of exactly 0 (DeepSpeed #5242); a value printed with fewer than
  ``min_digits`` (6) significant digits repeats naturally and does not count.
- ``slow_device``: throughput drops (or step time rises: a direction, never a speed-up) persistently by
  more than ``min_shift`` (3%) and ``slow_k_sigma`` (5) robust sigmas of its own noise above the trend of its
  first ``slow_baseline_frac`` (30%), for ``slow_min_run`` (5) points, while the loss has no departure from
  ``loss_margin_steps`` (50) before it on (all ours); on a run
  whose configuration says one device (world size 1) it is reported with low confidence (no node to
  exclude, no rank to compare).

Source: docs/detectors.md#hw01 (the thresholds, where each comes from, the published reports).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from forensics.detectors.base import Detector, fmt, segment_at
from forensics.facts import stated_world_size
from forensics.model import Cause, Finding, Mechanism, RunData, Severity
from forensics.signals import departures
from forensics.stats import sustained_rise

_DEVICE_WORDS = ("ecc", "xid", "cuda error", "nccl", "uncorrectable", "device-side", "illegal memory",
                 "segmentation fault", "bus error", "hardware")
MESSAGE_CHARS = 160
"""Characters of the device error line quoted in the message (display; our choice)."""
EVIDENCE_CHARS = 300
"""Characters of the device error line kept in the evidence (display; our choice)."""


@dataclass(frozen=True)
class HardwareSignature(Detector):
    """Device errors, magic constant grad norms, and throughput drops with a healthy loss."""

    code = "HW01"
    name = "hardware.signature"
    needs = "nothing: reads error events, grad_norm, throughput or step_time where logged"
    min_repeats: int = 5
    min_shift: float = 0.03
    min_digits: int = 6
    slow_k_sigma: float = 5.0
    slow_min_run: int = 5
    slow_baseline_frac: float = 0.3
    slow_min_points: int = 20
    loss_margin_steps: int = 50
    slow_median_points: int = 20
    device_confidence: float = 0.85
    device_after_departure_confidence: float = 0.5
    collective_confidence: float = 0.65
    collective_zero_loss_confidence: float = 0.8
    slow_confidence: float = 0.7
    slow_one_device_confidence: float = 0.35

    def detect(self, run: RunData) -> list[Finding]:
        """Findings for each signature present."""
        out: list[Finding] = []
        out += self._device_errors(run)
        out += self._magic_grad_norm(run)
        out += self._slow_device(run)
        return out

    def _device_errors(self, run: RunData) -> list[Finding]:
        if run.events.height == 0:
            return []
        ev = run.events.filter(pl.col("kind").is_in(["hardware_error", "error"]))
        hits = [r for r in ev.iter_rows(named=True) if any(w in str(r["message"]).lower() for w in _DEVICE_WORDS)]
        if not hits:
            return []
        first = hits[0]
        step = first["step"]
        loss = run.series("loss")
        last_logged = None
        if loss is not None and len(loss):
            last_logged = int(loss.steps[loss.steps <= step][-1]) if step is not None and np.any(loss.steps <= step) \
                else int(loss.steps[-1])
        onset = (last_logged + 1) if last_logged is not None else step
        prior = [d for d in departures(run, "loss") if onset is None or d.step < onset]
        against = tuple(f"loss departed earlier at step {d.onset_step}" for d in prior[:1])
        return [self.finding(
            cause=Cause.HARDWARE_OR_DISTRIBUTED, mechanism=Mechanism.DEVICE_FAULT, step=onset,
            segment=int(first["segment"]),
            confidence=self.device_after_departure_confidence if against else self.device_confidence,
            severity=Severity.CRITICAL,
            message=f"device error after step {last_logged}: {str(first['message'])[:MESSAGE_CHARS]}",
            evidence={"error": str(first["message"])[:EVIDENCE_CHARS], "source": first["source"], "errors": len(hits),
                      "last_logged_step": last_logged, "metrics_healthy_before": not prior},
            against=against,
        )]

    def _magic_grad_norm(self, run: RunData) -> list[Finding]:
        g = run.series("grad_norm")
        if g is None or len(g) < self.min_repeats:
            return []
        v = g.values
        r = self.min_repeats
        eq = np.concatenate([[0], np.cumsum(v[1:] == v[:-1])])  # windows of r equal points, whole column
        starts = np.arange(len(v) - r + 1)
        cands = np.flatnonzero(((eq[starts + r - 1] - eq[starts]) == r - 1) & np.isfinite(v[starts]) & (v[starts] != 0))
        for i in cands.tolist():
            w = v[i:i + r]
            # precision check: a value printed with few digits repeats naturally
            txt = repr(float(w[0]))
            if len(txt.replace("0.", "").replace(".", "")) < self.min_digits:
                continue
            step = int(g.steps[i])
            ls = run.series("loss_scale")
            if ls is not None:
                seg_ls = ls.values[(ls.steps >= step) & (ls.steps <= int(g.steps[i + self.min_repeats - 1]))]
                if seg_ls.size >= 2 and np.any(np.diff(seg_ls) < 0):
                    continue  # skipped fp16 steps re-print the last grad norm while the scale backs off
            loss = run.series("loss")
            zero_loss = False
            if loss is not None:
                k = np.flatnonzero(loss.steps == step)
                zero_loss = bool(k.size and loss.values[k[0]] == 0.0)
            return [self.finding(
                cause=Cause.HARDWARE_OR_DISTRIBUTED, mechanism=Mechanism.COLLECTIVE_BUG, step=step,
                segment=segment_at(g, step),
                confidence=self.collective_zero_loss_confidence if zero_loss else self.collective_confidence,
                severity=Severity.CRITICAL,
                message=f"grad norm is exactly {txt} on {int(np.sum(v[i:] == w[0]))} logged steps from step {step}"
                + (" with loss 0.0" if zero_loss else "")
                + ": a constant produced by the reduction, not by training.",
                evidence={"constant_grad_norm": float(w[0]), "from_step": step, "zero_loss": zero_loss,
                          "repeats": int(np.sum(v[i:] == w[0]))},
            )]
        return []

    def _slow_device(self, run: RunData) -> list[Finding]:
        for metric, sign in (("throughput", -1.0), ("step_time", 1.0)):
            s = run.series(metric)
            if s is None or len(s) < self.slow_min_points:
                continue
            vals = s.values if sign > 0 else 1.0 / np.where(s.values > 0, s.values, np.nan)
            d = sustained_rise(s.steps, vals, log=True, k_sigma=self.slow_k_sigma, min_rel=self.min_shift,
                               min_run=self.slow_min_run, baseline_frac=self.slow_baseline_frac)
            if d is None:
                continue
            loss_bad = [x for x in departures(run, "loss") if x.step >= d.onset_step - self.loss_margin_steps]
            if loss_bad:
                continue
            i = d.onset_index
            before = float(np.nanmedian(s.values[max(0, i - self.slow_median_points):i]))
            after = float(np.nanmedian(s.values[i:i + self.slow_median_points]))
            world = stated_world_size(run)
            against: tuple[str, ...] = ()
            conf = self.slow_confidence
            if world == 1:
                # one device: no node to exclude; a slower step is as likely the host, the data loader or a
                # neighbour job (NVRx straggler detection compares ranks: it needs more than one)
                conf = self.slow_one_device_confidence
                against = ("the run uses one device (world size 1): no other rank to compare with and no node to "
                           "exclude; a slower step is as likely the host, the data loader or another job",)
            return [self.finding(
                cause=Cause.HARDWARE_OR_DISTRIBUTED, mechanism=Mechanism.SLOW_DEVICE, step=d.onset_step,
                segment=segment_at(s, d.onset_step), confidence=conf,
                severity=Severity.MEDIUM if conf >= 0.5 else Severity.LOW,
                message=f"{metric} shifts from {fmt(before)} to {fmt(after)} at step {d.onset_step} "
                "while the loss stays healthy: a slow device or node, not the model.",
                evidence={"metric": metric, "before": before, "after": after, "onset_step": d.onset_step,
                          "relative_change": after / before - 1 if before else None, "world_size": world},
                against=against,
            )]
        return []
