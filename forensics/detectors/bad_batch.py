"""DB01 data.bad_batch: a loss spike or NaN with no precursor, i.e. the data, not the optimizer.

Rule (docs/detectors.md#db01; PaLM, arXiv 2204.02311 section 5.1; OLMo 2, arXiv 2501.00656): a loss
departure whose excursion starts abruptly (within ``max_rise_steps`` of its detection) with no
grad-norm spike (z >= 6) in the ``window`` steps before it and no grad-norm excursion (z >= 3)
in the ``lead_steps`` (5) steps before it (grad norm leads the loss by 1-4 steps: BLOOM tr11).
The batch is named when ``batch_index`` is logged. A spike that recovers by itself is reported
with ``recovered_step`` (the engine calls the run transient if nothing else fires).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from forensics.detectors.activation_overflow import is_fp16
from forensics.detectors.base import Detector, fmt, segment_at
from forensics.detectors.signals import SPIKE_Z, departures, zscores
from forensics.model import Finding, RunData


@dataclass(frozen=True)
class BadBatch(Detector):
    """Abrupt loss departures without a precursor in grad norm or update scale."""

    code = "DB01"
    name = "data.bad_batch"
    requires = ("loss",)
    window: int = 128
    max_rise_steps: int = 2
    precursor_z: float = 3.0
    lead_steps: int = 5

    def detect(self, run: RunData) -> list[Finding]:
        """One finding per precursor-free loss departure (at most three)."""
        s = run.series("loss")
        out: list[Finding] = []
        g = zscores(run, "grad_norm")
        fp16 = bool(is_fp16(run))
        for d in departures(run, "loss", limit=5):
            if d.index - d.onset_index > self.max_rise_steps:
                continue  # a slow build-up is not a bad batch
            against: list[str] = []
            pre_lo = d.onset_step - self.window
            if g is not None:
                gs, _, gz, _ = g
                m = (gs.steps >= pre_lo) & (gs.steps < d.onset_step)
                gzm = np.where(np.isfinite(gz[m]), gz[m], -np.inf)
                near = (gs.steps[m] >= d.onset_step - self.lead_steps)
                hit = (gzm >= SPIKE_Z) | (near & (gzm >= self.precursor_z))
                if hit.any():
                    k = int(np.flatnonzero(hit)[0])
                    against.append(f"grad norm already departed at step {int(gs.steps[m][k])} (a precursor)")
                gv = gs.values[m]
                if gv.size and not np.all(np.isfinite(gv)):
                    against.append("non-finite grad norms before the spike")
            if d.nonfinite and fp16:
                if run.has("loss_scale") or g is None:
                    continue  # a non-finite loss in an fp16 run is an overflow first (OV01/OV02 judge it)
            if against:
                continue
            ev: dict[str, object] = {"spike_step": d.step, "onset_step": d.onset_step, "loss": d.value,
                                     "trailing_median": d.baseline, "z": d.z, "nonfinite": d.nonfinite,
                                     "recovered_step": d.recovered_step, "precursor_window": [pre_lo, d.onset_step - 1],
                                     "grad_norm_logged": g is not None}
            bi = run.series("batch_index")
            named = ""
            if bi is not None:
                k = np.flatnonzero(bi.steps == d.onset_step)
                if k.size and np.isfinite(bi.values[k[0]]):
                    ev["batch_index"] = int(bi.values[k[0]])
                    named = f"; batch index {int(bi.values[k[0]])}"
            conf = 0.75 if g is not None else 0.55
            what = "NaN loss" if d.nonfinite else f"loss {fmt(d.value)} vs trailing median {fmt(d.baseline)}"
            out.append(self.finding(
                cause="data_batch", mechanism="bad_batch", step=d.onset_step, segment=segment_at(s, d.onset_step),
                confidence=conf, severity="high",
                message=f"abrupt {what} at step {d.step} with no precursor in the previous {self.window} steps{named}.",
                evidence=ev,
                against=() if g is not None else ("grad norm not logged: a precursor cannot be ruled out",),
            ))
            if len(out) >= 3:
                break
        return out
